"""What preflight found that the plan depends on, and how it outlives one run: per host
whether RDMA is usable and on which ports, the interface UCX's TCP takes, each engine's
nearest NIC, the GPU count and the fastest port's rate, as the plan's one input
(plan/facts.py's ``PlanFacts``, its ``source`` saying this run's preflight or a record).

The first decides where ``kv_transfer.rdma: auto`` turns RDMA on: usable verbs devices with
an ACTIVE port turn on /dev/infiniband, IPC_LOCK and UCX_NET_DEVICES (those ports). The
choice is part of each engine's config hash, so a command that runs no preflight (`status`,
`up --skip-preflight`) must not rebuild it from the inventory's declared rdma_devices alone:
it would report a change that is none. `up` therefore records each host's finding beside
compose.yaml (``rdma.json``, one small JSON object) and those commands read it back. A host
with no record (never preflighted) follows its declared rdma_devices, as a dry run does.

The record also holds, per engine, the HCA port(s) nearest its GPUs (the topo choice that
sets its UCX_NET_DEVICES) and the host's GPU count (``engines_per_host: all``), for the same
reason: `status` and `up --skip-preflight` must plan the same engines with the same NICs.

Why a file and not the running container: the record is what the last preflight saw,
whether or not the container was (re)created from it; it survives `down`, so the next
`up --skip-preflight` makes the same choice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Protocol

from pdboot.inventory.engines import EngineNic
from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.plan.facts import PlanFacts
from pdboot.plan.model import Plan
from pdboot.preflight.checks.facts import HostFacts

RECORD_FILE = "rdma.json"


class _HostReport(Protocol):
    @property
    def rdma_present(self) -> bool | None: ...
    @property
    def facts(self) -> HostFacts: ...
    @property
    def nics(self) -> Mapping[str, EngineNic]: ...


class _Preflight(Protocol):
    @property
    def hosts(self) -> Mapping[str, _HostReport]: ...


def active_ports(facts: HostFacts) -> list[str]:
    """The ``device:port`` of every ACTIVE port preflight's RDMA facts list."""
    return facts.rdma.active_ports() if facts.rdma is not None else []


def tcp_ifaces(facts: HostFacts) -> list[str]:
    """The interface(s) preflight's route facts found reaching the peer engine hosts; on an
    ingress host without engines, the one carrying its address (the VRRP checks')."""
    found = facts.route.ifaces() if facts.route is not None else []
    if not found and facts.vrrp is not None and facts.vrrp.carrier:
        return [facts.vrrp.carrier]
    return found


def from_preflight(result: _Preflight) -> PlanFacts:
    present: dict[str, bool] = {}
    ports: dict[str, list[str]] = {}
    nics: dict[str, dict[str, EngineNic]] = {}
    gpus: dict[str, int] = {}
    gbps: dict[str, float] = {}
    for name, rep in result.hosts.items():
        found = rep.facts.gpu.gpus if rep.facts.gpu is not None else ()
        if found:
            gpus[name] = len(found)
        if rep.nics:
            nics[name] = dict(rep.nics)
        if rep.rdma_present is None:  # not checked there (no GPU host, unreachable)
            continue
        present[name] = rep.rdma_present
        if rep.rdma_present:
            ports[name] = active_ports(rep.facts)
            rate = rep.facts.rdma.link_gbps() if rep.facts.rdma is not None else None
            if rate:
                gbps[name] = rate
    ifaces = {n: tcp_ifaces(r.facts) for n, r in result.hosts.items()}
    return PlanFacts(
        rdma_present=present,
        rdma_ports=ports,
        tcp_ifaces={n: i for n, i in ifaces.items() if i},
        engine_nics=nics,
        gpu_counts=gpus,
        rdma_gbps=gbps,
        source="preflight",
    )


def record_text(
    present: bool,
    ports: list[str],
    ifaces: Sequence[str] = (),
    nics: Mapping[str, EngineNic] | None = None,
    gpu_count: int | None = None,
) -> str:
    doc: dict[str, object] = {"rdma": present, "ports": ports}
    if ifaces:
        doc["ifaces"] = list(ifaces)
    if nics:
        doc["engines"] = {
            n: {"ports": list(e.ports), "link": e.link, "gpus": list(e.gpus)}
            | ({"pcie_map": [list(p) for p in e.pcie_map]} if e.pcie_map else {})
            for n, e in sorted(nics.items())
        }
    if gpu_count is not None:
        doc["gpu_count"] = gpu_count
    return json.dumps(doc, sort_keys=True) + "\n"


def _record_ifaces(text: str) -> list[str]:
    try:
        doc = json.loads(text)
    except ValueError:
        return []
    got = doc.get("ifaces") if isinstance(doc, dict) else None
    return [str(i) for i in got] if isinstance(got, list) else []


def parse_record(text: str) -> tuple[bool, list[str]] | None:
    """A record as `up` wrote it, else None (missing, truncated or foreign: ignored)."""
    doc = _record(text)
    if doc is None:
        return None
    ports = doc.get("ports")
    if not isinstance(ports, list) or not all(isinstance(p, str) for p in ports):
        ports = []
    return doc["rdma"] is True, list(ports)


def _record(text: str) -> dict[str, object] | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("rdma"), bool):
        return None
    return doc


def _pcie_map(e: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
    raw = e.get("pcie_map")
    if not isinstance(raw, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in raw
    ):
        return ()
    return tuple((str(p[0]), str(p[1])) for p in raw)


def parse_engines(text: str) -> tuple[dict[str, EngineNic], int | None]:
    """The per-engine NICs and the GPU count of a record; what is odd is left out."""
    doc = _record(text) or {}
    out: dict[str, EngineNic] = {}
    engines = doc.get("engines")
    for name, e in engines.items() if isinstance(engines, dict) else ():
        if not isinstance(e, dict):
            continue
        ports, link, gpus = e.get("ports"), e.get("link"), e.get("gpus", [])
        if (
            isinstance(ports, list)
            and ports
            and all(isinstance(p, str) for p in ports)
            and (link is None or isinstance(link, str))
            and isinstance(gpus, list)
            and all(isinstance(g, int) for g in gpus)
        ):
            out[str(name)] = EngineNic(tuple(ports), link, tuple(gpus), _pcie_map(e))
    count = doc.get("gpu_count")
    return out, count if isinstance(count, int) and count > 0 else None


def from_records(texts: Mapping[str, str | None]) -> PlanFacts:
    present: dict[str, bool] = {}
    ports: dict[str, list[str]] = {}
    ifaces: dict[str, list[str]] = {}
    nics: dict[str, dict[str, EngineNic]] = {}
    gpus: dict[str, int] = {}
    for host, text in texts.items():
        rec = parse_record(text) if text else None
        if rec is None or not text:
            continue
        present[host], ports[host] = rec
        if _record_ifaces(text):
            ifaces[host] = _record_ifaces(text)
        found, count = parse_engines(text)
        if found:
            nics[host] = found
        if count is not None:
            gpus[host] = count
    return PlanFacts(
        rdma_present=present,
        rdma_ports=ports,
        tcp_ifaces=ifaces,
        engine_nics=nics,
        gpu_counts=gpus,
        source="recorded",
    )


def records_to_ship(facts: PlanFacts | None) -> dict[str, str]:
    """host -> record text; only the facts of a preflight of this run are recorded."""
    if facts is None or facts.source != "preflight":
        return {}
    return {
        h: record_text(
            p,
            list(facts.rdma_ports.get(h, [])),
            facts.tcp_ifaces.get(h, []),
            facts.engine_nics.get(h),
            facts.gpu_counts.get(h),
        )
        for h, p in (facts.rdma_present or {}).items()
    }


def plan_from(inv: Inventory, facts: PlanFacts) -> Plan:
    """The plan built on what preflight found (or recorded): RDMA, TCP interfaces, each
    engine's nearest NIC, the GPU count. (build_plan itself; the name callers in deploy/
    still use.)"""
    return build_plan(inv, facts)


def describe_nics(plan: Plan) -> list[str]:
    """One line per engine: its UCX_NET_DEVICES and where that came from."""
    return [f"nic: {s.key} -> {s.nic}" for s in plan.engines if s.nic]


def describe(inv: Inventory, plan: Plan, facts: PlanFacts | None, skipped: bool) -> list[str]:
    """One line per engine host saying whether RDMA is on and why (only for `auto`)."""
    if inv.kv_transfer.rdma != "auto":
        return []
    lines = []
    engines = {s.host: s for s in plan.engines}
    for host, svc in engines.items():
        state = "on" if svc.rdma else "off"
        if facts is not None and host in (facts.rdma_present or {}):
            if facts.source == "preflight":
                why = (
                    "preflight found "
                    + (", ".join(facts.rdma_ports.get(host, [])) or "a device")
                    + " ACTIVE"
                    if svc.rdma
                    else "preflight found no RDMA device with an ACTIVE port"
                )
            else:
                why = "as the last preflight found, recorded on the host"
        else:
            declared = inv.hosts[host].rdma_devices
            why = (
                f"inventory declares rdma_devices {', '.join(declared)}"
                if declared
                else "inventory declares no rdma_devices"
            )
            why += (
                "; --skip-preflight and no earlier preflight finding"
                if skipped
                else "; no preflight finding"
            )
        lines.append(f"rdma (auto): {state} for {host} ({why})")
    return lines
