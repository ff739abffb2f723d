"""Where ``kv_transfer.rdma: auto`` turns RDMA on, and how that choice outlives one run.

`auto` follows what preflight found on each host: usable verbs devices with an ACTIVE port
turn on /dev/infiniband, IPC_LOCK and UCX_NET_DEVICES (those ports). The choice is part of
each engine's config hash, so a command that runs no preflight (`status`, `up
--skip-preflight`) must not rebuild it from the inventory's declared rdma_devices alone:
it would report a change that is none. `up` therefore records each host's finding beside
compose.yaml (``rdma.json``, one small JSON object) and those commands read it back. A host
with no record (never preflighted) follows its declared rdma_devices, as a dry run does.

Why a file and not the running container: the record is what the last preflight saw,
whether or not the container was (re)created from it; it survives `down`, so the next
`up --skip-preflight` makes the same choice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from pdboot.checks.facts import HostFacts
from pdboot.inventory import Inventory
from pdboot.plan import Plan

RECORD_FILE = "rdma.json"


class _HostReport(Protocol):
    @property
    def rdma_present(self) -> bool | None: ...
    @property
    def facts(self) -> HostFacts: ...


class _Preflight(Protocol):
    @property
    def hosts(self) -> Mapping[str, _HostReport]: ...


Source = Literal["preflight", "recorded"]


@dataclass(frozen=True)
class Findings:
    """Per host: RDMA usable, and the ACTIVE ``device:port`` names (for UCX)."""

    present: dict[str, bool]
    ports: dict[str, list[str]] = field(default_factory=dict)
    source: Source = "preflight"
    gbps: dict[str, float] = field(default_factory=dict)  # fastest ACTIVE port (KV speed check)


def active_ports(facts: HostFacts) -> list[str]:
    """The ``device:port`` of every ACTIVE port preflight's RDMA facts list."""
    return facts.rdma.active_ports() if facts.rdma is not None else []


def from_preflight(result: _Preflight) -> Findings:
    present: dict[str, bool] = {}
    ports: dict[str, list[str]] = {}
    gbps: dict[str, float] = {}
    for name, rep in result.hosts.items():
        if rep.rdma_present is None:  # not checked there (no GPU host, unreachable)
            continue
        present[name] = rep.rdma_present
        if rep.rdma_present:
            ports[name] = active_ports(rep.facts)
            rate = rep.facts.rdma.link_gbps() if rep.facts.rdma is not None else None
            if rate:
                gbps[name] = rate
    return Findings(present, ports, "preflight", gbps=gbps)


def record_text(present: bool, ports: list[str]) -> str:
    return json.dumps({"rdma": present, "ports": ports}, sort_keys=True) + "\n"


def parse_record(text: str) -> tuple[bool, list[str]] | None:
    """A record as `up` wrote it, else None (missing, truncated or foreign: ignored)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("rdma"), bool):
        return None
    ports = doc.get("ports")
    if not isinstance(ports, list) or not all(isinstance(p, str) for p in ports):
        ports = []
    return doc["rdma"], list(ports)


def from_records(texts: Mapping[str, str | None]) -> Findings:
    present: dict[str, bool] = {}
    ports: dict[str, list[str]] = {}
    for host, text in texts.items():
        rec = parse_record(text) if text else None
        if rec is not None:
            present[host], ports[host] = rec
    return Findings(present, ports, "recorded")


def records_to_ship(findings: Findings | None) -> dict[str, str]:
    """host -> record text; only findings of a preflight of this run are recorded."""
    if findings is None or findings.source != "preflight":
        return {}
    return {h: record_text(p, findings.ports.get(h, [])) for h, p in findings.present.items()}


def describe(inv: Inventory, plan: Plan, findings: Findings | None, skipped: bool) -> list[str]:
    """One line per engine host saying whether RDMA is on and why (only for `auto`)."""
    if inv.kv_transfer.rdma != "auto":
        return []
    lines = []
    engines = {s.host: s for stage in plan.stages[:2] for s in stage}
    for host, svc in engines.items():
        state = "on" if svc.rdma else "off"
        if findings is not None and host in findings.present:
            if findings.source == "preflight":
                why = (
                    "preflight found "
                    + (", ".join(findings.ports.get(host, [])) or "a device")
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
