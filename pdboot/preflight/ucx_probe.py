"""After the pull, before any engine starts: NIXL's UCX backend created the way each
engine will create it, with that engine's UCX environment (UCX_NET_DEVICES, UCX_TLS and the
other UCX_* variables the plan gives it), its device mapping (/dev/infiniband, IPC_LOCK)
and its GPUs, on the host network, in its image. The image probe (image_caps.py) creates
the backend with UCX's defaults, which passed where every engine then crashed 75 s in:
UCX_NET_DEVICES named mlx5 ports that UCX inside the container did not see ("network
devices ... are not available", NIXL_ERR_BACKEND). Here such a choice fails before any
engine starts, naming the devices the container does see. A host whose RDMA came from
``kv_transfer.rdma: auto`` falls back to TCP instead (``fallback``), and says so.

One container per distinct (host, image, UCX environment, devices, GPUs): engines that would
create the same backend share it. ``argv``/``parse``/``verdict`` are pure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from pdboot.events import Emit, ImageCheck, Note
from pdboot.plan.facts import PlanFacts
from pdboot.plan.model import Plan, Service
from pdboot.preflight.checks import CheckResult
from pdboot.transport import docker_cli
from pdboot.transport.hosts import Hosts, Link

UCX_ID = "docker.ucx_devices"
MARK = "PDBOOT_UCX "
PROBE_TIMEOUT_S = 120.0

# What the container sees (RDMA ports with their state, network interfaces, the verbs
# device nodes), then the UCX backend, created as vLLM's NIXL connector creates it.
PROBE = """\
import json, os
o = {"ib": [], "net": [], "uverbs": False}
base = "/sys/class/infiniband"
try:
    for dev in sorted(os.listdir(base)):
        for port in sorted(os.listdir(os.path.join(base, dev, "ports"))):
            try:
                with open(os.path.join(base, dev, "ports", port, "state")) as f:
                    state = f.read().split(":")[-1].strip()
            except OSError:
                state = "?"
            o["ib"].append("%s:%s %s" % (dev, port, state))
except OSError:
    pass
try:
    o["net"] = sorted(os.listdir("/sys/class/net"))
except OSError:
    pass
o["uverbs"] = os.path.isdir("/dev/infiniband") and any(
    n.startswith("uverbs") for n in os.listdir("/dev/infiniband"))
try:
    from nixl._api import nixl_agent, nixl_agent_config
    a = nixl_agent("pdboot-ucx-probe", nixl_agent_config(backends=["UCX"]))
    o["backend"] = "UCX" in a.backends
except Exception as e:
    o["backend"] = False
    o["error"] = "%s: %s" % (type(e).__name__, e)
print("PDBOOT_UCX " + json.dumps(o), flush=True)
"""


def ucx_env(svc: Service) -> tuple[tuple[str, str], ...]:
    return tuple((k, v) for k, v in svc.environment if k.startswith("UCX_"))


def argv(svc: Service, device: str = "cuda") -> list[str]:
    """The probe container for ``svc``: its image, UCX_* variables, devices, capabilities
    and GPUs, on the host network (UCX sees the host's interfaces as the engine will)."""
    out: list[str] = []
    for d in svc.devices:
        out += ["--device", d]
    for c in svc.cap_add:
        out += ["--cap-add", c]
    if device != "cpu" and svc.gpus is not None:
        spec = "all" if svc.gpus == "all" else '"device=' + ",".join(map(str, svc.gpus)) + '"'
        out += ["--gpus", spec]
    for k, v in ucx_env(svc):
        out += ["-e", f"{k}={v}"]
    return docker_cli.run_once(
        svc.image, "-c", PROBE, entrypoint="python3", network="host", options=out
    )


@dataclass(frozen=True)
class UcxSeen:
    backend: bool = False
    error: str = ""
    ib: tuple[str, ...] = ()  # "mlx5_0:1 ACTIVE"
    net: tuple[str, ...] = ()  # eth0, lo
    uverbs: bool = False
    problem: str = ""  # the probe did not answer
    unavailable: str = ""  # UCX's own warning: a UCX_NET_DEVICES entry it cannot use

    def devices(self) -> str:
        ib = ", ".join(self.ib) or "none"
        verbs = "" if self.uverbs or not self.ib else " (no /dev/infiniband/uverbs*)"
        return f"RDMA ports {ib}{verbs}; network devices {', '.join(self.net) or 'none'}"


_UNAVAILABLE = re.compile(r"network devices? .*(?:is|are) not available.*")


def parse(output: str, rc: int = 0) -> UcxSeen:
    found = _UNAVAILABLE.search(output)
    unavailable = found.group(0).strip()[:400] if found else ""
    line = next((ln for ln in output.splitlines() if ln.startswith(MARK)), None)
    if line is None:
        tail = " | ".join(ln.strip() for ln in output.strip().splitlines()[-3:]) or "no output"
        return UcxSeen(problem=f"the UCX probe did not answer (exit {rc}): {tail}")
    try:
        d = json.loads(line[len(MARK) :])
    except json.JSONDecodeError:
        return UcxSeen(problem=f"the UCX probe's answer is not JSON: {line[:200]}")
    if not isinstance(d, dict):
        return UcxSeen(problem=f"the UCX probe's answer is not an object: {line[:200]}")
    return UcxSeen(
        unavailable=unavailable,
        backend=d.get("backend") is True,
        error=str(d.get("error") or ""),
        ib=tuple(str(x) for x in d.get("ib") or []),
        net=tuple(str(x) for x in d.get("net") or []),
        uverbs=d.get("uverbs") is True,
    )


def verdict(seen: UcxSeen, keys: Sequence[str], env: dict[str, str]) -> CheckResult:
    """One result for the engines ``keys`` sharing one UCX environment ``env``. Besides the
    backend itself, UCX's own word: it may only warn of UCX_NET_DEVICES it cannot use
    ("network device 'mlx5_0:1' is not available, please use one or more of: 'eth0'(tcp),
    ...") and still start, without the device KV was to move over."""
    who = ", ".join(keys)
    asked = ", ".join(f"{k}={v}" for k, v in sorted(env.items())) or "UCX's defaults"
    if seen.problem:
        return CheckResult(UCX_ID, "fail", f"{who}: {seen.problem}", FIX_PROBE)
    if seen.backend and not seen.unavailable:
        return CheckResult(UCX_ID, "pass", f"{who}: NIXL UCX backend with {asked}")
    why = seen.error or "no backend"
    if seen.unavailable:
        why = f"UCX: {seen.unavailable}" + ("" if seen.backend else f"; {why}")
    return CheckResult(
        UCX_ID,
        "fail",
        f"{who}: NIXL cannot create its UCX backend with {asked} ({why}); the container "
        f"sees {seen.devices()}",
        FIX_DEVICES,
    )


FIX_DEVICES = (
    "set kv_transfer.ucx.net_devices to devices the container sees, or give it the host's "
    "RDMA devices (rdma-core in the image, /dev/infiniband on the host), or set "
    "kv_transfer.rdma: off"
)


FIX_PROBE = (
    "run the engine image by hand with the engine's UCX_* variables and "
    "`python3 -c 'import nixl'`, and read its error"
)


@dataclass(frozen=True)
class Outcome:
    host: str
    keys: tuple[str, ...]
    rdma: bool
    result: CheckResult


def ucx_check(
    plan: Plan, hosts: Hosts, timeout: float = PROBE_TIMEOUT_S, only: Sequence[str] | None = None
) -> list[Outcome]:
    """Every engine host (or ``only`` these): one probe per distinct engine set-up (in order
    per host, hosts in parallel); a host where it could not run gets a failed result."""
    groups: dict[str, dict[tuple[object, ...], list[Service]]] = {}
    for s in plan.engines:
        if only is not None and s.host not in only:
            continue
        key = (s.image, ucx_env(s), s.devices, s.cap_add, s.gpus)
        groups.setdefault(s.host, {}).setdefault(key, []).append(s)

    def one(host: str, link: Link) -> list[Outcome]:
        out = []
        for svcs in groups[host].values():
            rc, text = link.engine.run_once(argv(svcs[0], plan.device), timeout)
            keys = tuple(s.key for s in svcs)
            res = verdict(parse(text, rc), keys, dict(ucx_env(svcs[0])))
            out.append(Outcome(host, keys, any(s.rdma for s in svcs), res))
        return out

    values, errors = hosts.each(one, timeout * 2 + 30, only=list(groups))
    outcomes = [o for host in sorted(values) for o in values[host]]
    for host, why in sorted(errors.items()):
        keys = tuple(s.key for svcs in groups[host].values() for s in svcs)
        msg = f"{', '.join(keys)}: could not run the UCX probe: {why}"
        outcomes.append(Outcome(host, keys, False, CheckResult(UCX_ID, "fail", msg, FIX_PROBE)))
    return outcomes


def fallback(
    findings: PlanFacts, outcomes: list[Outcome], rdma: str
) -> tuple[PlanFacts, list[str]]:
    """``kv_transfer.rdma: auto``: the hosts whose engines failed with RDMA go over TCP
    (their findings say no RDMA), with a line saying so each. Explicit ``on`` keeps the
    failure: the operator asked for RDMA."""
    if rdma != "auto":
        return findings, []
    hosts = sorted({o.host for o in outcomes if o.rdma and o.result.status == "fail"})
    present = dict(findings.rdma_present or {})
    hosts = [h for h in hosts if present.get(h)]
    if not hosts:
        return findings, []
    present.update(dict.fromkeys(hosts, False))
    notes = [
        f"rdma auto: {h}: the engine container cannot use the host's RDMA devices "
        f"({next(o.result.message for o in outcomes if o.host == h and o.result.status == 'fail')}"
        "); KV goes over TCP on this host"
        for h in hosts
    ]
    return replace(findings, rdma_present=present), notes


def check(
    plan: Plan,
    hosts: Hosts,
    findings: PlanFacts,
    rdma: str,
    emit: Emit,
    replan: Callable[[PlanFacts], Plan],
) -> tuple[Plan, PlanFacts, bool]:
    """`up`'s step: probe, fall back to TCP where ``rdma: auto`` allows (the plan made
    again by ``replan``, those hosts probed once more), report each result. (plan, findings,
    every engine passed)."""
    outcomes = ucx_check(plan, hosts)
    findings2, notes = fallback(findings, outcomes, rdma)
    if notes:
        for line in notes:
            emit(Note(line, "warn"))
        plan = replan(findings2)
        after = findings2.rdma_present or {}
        moved = {h for h, p in (findings.rdma_present or {}).items() if p and not after.get(h)}
        outcomes = [o for o in outcomes if o.host not in moved]
        outcomes += ucx_check(plan, hosts, only=sorted(moved))
    for o in sorted(outcomes, key=lambda o: (o.host, o.keys)):
        r = o.result
        emit(ImageCheck(o.host, r.id, r.status, r.message, r.fix))
    return plan, findings2, all(o.result.status != "fail" for o in outcomes)
