"""Preflight orchestration: inventory -> per-host contexts (``contexts``, pure) -> one batched
script per host, all hosts in parallel -> verdicts (pure) -> cross-host clock comparison.

``run_preflight`` is what both `pdboot preflight` and `pdboot up` call; ``evaluate_host``
is pure (script output in, results out) so every verdict is testable from captured text.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol, TypeVar

from pdboot.inventory.engines import EngineNic
from pdboot.inventory.schema import Inventory
from pdboot.plan.weights.local import Listing
from pdboot.preflight import registry
from pdboot.preflight.args_preflight import ArgsProbes
from pdboot.preflight.cascade import collapse
from pdboot.preflight.checks import (
    AREAS,
    CheckResult,
    Command,
    HostContext,
    Section,
    batch_script,
    by_key,
    parse_sections,
    prepull,
)
from pdboot.preflight.checks import cpu as cpu_checks
from pdboot.preflight.checks import docker as docker_checks
from pdboot.preflight.checks import gdr as gdr_checks
from pdboot.preflight.checks import gpu as gpu_checks
from pdboot.preflight.checks import gpu_acs as gpu_acs_checks
from pdboot.preflight.checks import gpu_settings as gpu_settings_checks
from pdboot.preflight.checks import host as host_checks
from pdboot.preflight.checks import model as model_checks
from pdboot.preflight.checks import network as network_checks
from pdboot.preflight.checks import owners as owners_checks
from pdboot.preflight.checks import rdma as rdma_checks
from pdboot.preflight.checks import route as route_checks
from pdboot.preflight.checks import topo as topo_checks
from pdboot.preflight.checks import ucx_tls as ucx_tls_checks
from pdboot.preflight.checks import vrrp as vrrp_checks
from pdboot.preflight.checks import weights as weights_checks
from pdboot.preflight.checks.facts import HostFacts
from pdboot.preflight.contexts import contexts
from pdboot.preflight.findings import from_preflight, plan_from
from pdboot.preflight.image_args import ARGS_ID
from pdboot.preflight.lookups import HubLookup, ImageLookups, with_hub_answer
from pdboot.preflight.lookups import insecure_registries as insecure_registries
from pdboot.preflight.lookups import with_lookup as with_lookup
from pdboot.transport.connection import Connection, RemoteError, effective_ssh
from pdboot.transport.fanout import Outcome, fan_out

T = TypeVar("T")


class Area(Protocol):
    """A check area module: its commands, and its verdicts judged from the host's facts.
    (Each also has ``parse(ctx, sections) -> <Area>Facts | None``, typed per area.)"""

    def commands(self, ctx: HostContext) -> list[Command]: ...

    def evaluate(self, ctx: HostContext, facts: HostFacts) -> list[CheckResult]: ...


# In the order the results are reported (and the batch runs)
DOMAINS: tuple[tuple[str, Area], ...] = (
    ("gpu", gpu_checks),
    ("gpu", gpu_settings_checks),
    ("gpu", gpu_acs_checks),
    ("cpu", cpu_checks),
    ("docker", docker_checks),
    ("rdma", rdma_checks),
    ("rdma", gdr_checks),
    ("rdma", ucx_tls_checks),
    ("network", route_checks),
    ("topo", topo_checks),
    ("host", owners_checks),
    ("host", host_checks),
    ("network", network_checks),
    ("network", vrrp_checks),
    ("model", model_checks),
    ("weights", weights_checks),
)


# --------------------------------------------------------------------------- selection


@dataclass(frozen=True)
class Selection:
    """--only / --skip: check ids (gpu.driver) or areas (gpu)."""

    only: frozenset[str] = frozenset()
    skip: frozenset[str] = frozenset()

    @classmethod
    def of(cls, only: Collection[str] = (), skip: Collection[str] = ()) -> Selection:
        return cls(frozenset(only), frozenset(skip))

    def unknown(self) -> list[str]:
        """Names that are neither an area nor of the form area.name."""
        return sorted(n for n in self.only | self.skip if n.split(".", 1)[0] not in AREAS)

    def area_wanted(self, area: str) -> bool:
        if area in self.skip:
            return False
        return not self.only or any(o.split(".", 1)[0] == area for o in self.only)

    def command_wanted(self, c: Command) -> bool:
        return any(self.area_wanted(a) for a in (c.area, *c.also_for))

    def keep(self, r: CheckResult) -> bool:
        if r.area == "ssh":
            return True  # an unreachable host is always reported
        if r.id in self.skip or r.area in self.skip:
            return False
        return not self.only or r.id in self.only or r.area in self.only


# --------------------------------------------------------------------------- contexts


def host_commands(ctx: HostContext, sel: Selection = Selection()) -> list[Command]:
    cmds = [c for _, d in DOMAINS for c in d.commands(ctx) if not c.recorded_only]
    return [c for c in cmds if sel.command_wanted(c)]


# --------------------------------------------------------------------------- verdicts


@dataclass
class HostReport:
    name: str
    reachable: bool
    checks: list[CheckResult] = field(default_factory=list)
    facts: HostFacts = field(default_factory=HostFacts)  # what the checks found, typed
    rdma_present: bool | None = None  # see rdma_usable
    nics: dict[str, EngineNic] = field(default_factory=dict)  # engine name -> nearest port(s)
    clock_window: network_checks.Window | None = None  # host clock minus ours lies within
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.reachable and not any(c.status == "fail" for c in self.checks)


@dataclass
class PreflightResult:
    hosts: dict[str, HostReport]

    @property
    def ok(self) -> bool:
        return all(h.ok for h in self.hosts.values())

    def as_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "hosts": {
                n: {"reachable": h.reachable, "checks": [c.as_dict() for c in h.checks]}
                for n, h in self.hosts.items()
            },
        }


def _guarded(area: str, fn: Callable[[], T], out: list[CheckResult]) -> T | None:
    """A parser or verdict that raises is a bug; it must still not take down the others."""
    try:
        return fn()
    except Exception as e:  # reported as a failed check, with the cause
        out.append(
            CheckResult(
                f"{area}.evaluate",
                "fail",
                f"internal error while judging {area}: {type(e).__name__}: {e}",
                "a bug in pdboot: report it with the output of the commands on that host",
            )
        )
        return None


def parse_facts(ctx: HostContext, s: Mapping[str, Section], out: list[CheckResult]) -> HostFacts:
    """Every area's typed facts; an area whose parser raised has None (and a failed
    ``<area>.evaluate`` check in ``out``)."""

    def parse(area: str, fn: Callable[[HostContext, Mapping[str, Section]], T]) -> T | None:
        return _guarded(area, lambda: fn(ctx, s), out)

    return HostFacts(
        gpu=parse("gpu", gpu_checks.parse),
        gpu_settings=parse("gpu", gpu_settings_checks.parse),
        gpu_acs=parse("gpu", gpu_acs_checks.parse),
        cpu=parse("cpu", cpu_checks.parse),
        docker=parse("docker", docker_checks.parse),
        rdma=parse("rdma", rdma_checks.parse),
        gdr=parse("rdma", gdr_checks.parse),
        route=parse("network", route_checks.parse),
        host=parse("host", host_checks.parse),
        network=parse("network", network_checks.parse),
        model=parse("model", model_checks.parse),
        topo=parse("topo", topo_checks.parse),
        weights=parse("weights", weights_checks.parse),
        owners=parse("host", owners_checks.parse),
        vrrp=parse("network", vrrp_checks.parse),
    )


def read_host(ctx: HostContext, output: str) -> tuple[HostFacts, list[CheckResult]]:
    """Batch output -> (the host's facts, a failed check per parser that raised). Pure."""
    cmds = [c for _, d in DOMAINS for c in d.commands(ctx)]
    results: list[CheckResult] = []
    return parse_facts(ctx, by_key(cmds, parse_sections(output)), results), results


def judge_host(
    ctx: HostContext, facts: HostFacts, parsed: list[CheckResult], sel: Selection = Selection()
) -> list[CheckResult]:
    """Every area's verdicts from the facts (after ``parsed``, read_host's). Pure."""
    results = list(parsed)
    for area, domain in DOMAINS:
        results += _guarded(area, partial(domain.evaluate, ctx, facts), results) or []
    return collapse(r for r in results if sel.keep(r))  # a root --only left out does not count


def evaluate_host(
    ctx: HostContext, output: str, sel: Selection = Selection()
) -> tuple[list[CheckResult], HostFacts]:
    """Batch output -> (results, the facts they were judged from). Pure."""
    facts, parsed = read_host(ctx, output)
    return judge_host(ctx, facts, parsed, sel), facts


def deployment_fates(
    inv: Inventory, reports: Mapping[str, HostReport]
) -> dict[str, owners_checks.Fate]:
    """What `up` will do with each of this deployment's containers the hosts listed: the
    converge plan over the plan `up` builds from these very findings (RDMA, NICs, GPU
    count), so a kept engine is the one `up` will find unchanged. Pure."""
    observed = [c for r in reports.values() if r.facts.owners for c in r.facts.owners.containers]
    if not observed:
        return {}
    plan = plan_from(inv, from_preflight(PreflightResult(dict(reports))))
    return owners_checks.fates(plan, observed)


def rdma_usable(ctx: HostContext, facts: HostFacts) -> bool | None:
    """For ``kv_transfer.rdma: auto``: a verbs device with an ACTIVE port found (True), not
    found or RDMA off (False), not checked here (None: no GPU host, deselected)."""
    r = facts.rdma
    if r is not None and r.checked:
        return r.usable
    if ctx.rdma_mode == "off" and ctx.gpu_host:
        return False
    return None


# --------------------------------------------------------------------------- running


# a host's batch output, when (our clock) it was sent and its output back, seconds it took
_Batch = tuple[str, float, float, float]


def read_reports(
    outcomes: Mapping[str, Outcome[_Batch]],
    ctxs: Mapping[str, HostContext],
    looked: Mapping[str, registry.Lookup],
) -> tuple[dict[str, HostReport], dict[str, tuple[HostContext, list[CheckResult]]]]:
    """Each host's report with its facts (not judged yet), and per reachable host the
    context it is judged in with the checks its parsers already failed."""
    reports: dict[str, HostReport] = {}
    read: dict[str, tuple[HostContext, list[CheckResult]]] = {}
    for name, oc in outcomes.items():
        if oc.error is not None or oc.value is None:
            e = oc.error or RemoteError(name, "error", "no result")
            reports[name] = HostReport(
                name,
                reachable=False,
                checks=[CheckResult("ssh.connect", "fail", f"{e.kind}: {e.message}", e.fix)],
            )
            continue
        stdout, sent, back, secs = oc.value
        ctx = with_lookup(ctxs[name], looked.get(ctxs[name].image))
        facts, parsed = read_host(ctx, stdout)
        window = network_checks.clock_window(facts.network, sent, back) if facts.network else None
        # an area that raises shows as a failed check (``parsed`` goes into the report)
        nics = _guarded("topo", partial(topo_checks.engine_nics, ctx, facts), parsed) or {}
        usable = _guarded("rdma", partial(rdma_usable, ctx, facts), parsed)
        reports[name] = HostReport(
            name,
            True,
            [CheckResult("ssh.connect", "pass", "connected")],
            facts,
            usable,
            nics,
            window,
            secs,
        )
        read[name] = (ctx, parsed)
    return reports, read


def judge_reports(
    inv: Inventory,
    reports: Mapping[str, HostReport],
    read: Mapping[str, tuple[HostContext, list[CheckResult]]],
    looked: Mapping[str, registry.Lookup],
    selection: Selection = Selection(),
) -> None:
    """Each reachable host's verdicts (read_reports' second half), added to its report."""
    # Every host's containers are known now: the converge plan says which of them `up`
    # keeps, replaces or removes (a router's fate hangs on engines elsewhere).
    fates = tuple(deployment_fates(inv, reports).values())
    for name, (ctx, parsed) in read.items():
        rep = reports[name]
        judged = dataclasses.replace(ctx, fates=fates)  # for the notes naming them
        rep.checks += judge_host(judged, rep.facts, parsed, selection)
        rep.checks += [r for r in prepull.evaluate(ctx, inv, looked) if selection.keep(r)]


def run_preflight(
    inv: Inventory,
    *,
    accept_new_host_keys: bool = False,
    selection: Selection = Selection(),
    connections: Mapping[str, Connection] | None = None,
) -> PreflightResult:
    """Check every host in parallel; reported in inventory order. Each host's batch goes
    through its connection in ``connections`` (already open, kept open), else one opened here."""
    ctxs = contexts(inv)
    given = dict(connections or {})
    wanted = selection.area_wanted("docker") or selection.area_wanted("host")
    lookups = ImageLookups(
        {c.image for c in ctxs.values() if c.gpu_host and c.image}
        | {inv.router_image, inv.router.proxy_image}  # the router host's (always one)
        | ({inv.router.keepalived_image} if inv.router.virtual_ip else set())
        if wanted
        else ()
    )

    # the image's own parser, where the batch found the image on the host (a thread per host)
    args = ArgsProbes.of(inv, selection.keep(CheckResult(ARGS_ID, "skip", "")))

    # paramiko, fabric and invoke load here, once, before the connect threads start: imported
    # on those threads they would share the GIL with each other (issue 35)
    from pdboot.transport.ssh import connect

    def one(name: str, ctx: HostContext) -> _Batch:
        conn = given.get(name)
        own = conn is None
        if conn is None:  # first: the other hosts' scripts are built during its handshake
            conn = connect(
                name, inv.hosts[name], inv.ssh, accept_new_host_keys=accept_new_host_keys
            )
        close = conn.close if own else None
        try:
            script = batch_script(host_commands(ctx, selection) + args.batch_commands(name))
            sent = time.time()
            res = conn.run(["bash", "-s"], stdin=script)  # whatever the login shell is
            back = time.time()
        except BaseException:
            if close is not None:
                close()
            raise
        args.start(name, conn, res.stdout, close)  # closes it when done
        return res.stdout, sent, back, res.seconds

    settings = [effective_ssh(inv.ssh, inv.hosts[n]) for n in ctxs]
    deadline = max(s.connect_timeout + s.command_timeout for s in settings) + 10
    hub = HubLookup(inv, selection.area_wanted("weights"))
    outcomes = fan_out(ctxs, one, deadline)
    looked = lookups.wait()
    hub_answer = hub.wait()
    if any(lk.tls_failed for lk in looked.values()):
        lookups.retry_insecure(
            insecure_registries([oc.value[0] for oc in outcomes.values() if oc.value])
        )
        looked = dict(lookups.results)
    ctxs = {n: with_hub_answer(c, hub_answer) for n, c in ctxs.items()}
    reports, read = read_reports(outcomes, ctxs, looked)
    judge_reports(inv, reports, read, looked, selection)
    for name, rep in reports.items():
        if not rep.reachable:  # an unset secret is this machine's, whatever the host does
            rep.checks += [r for r in prepull.local(ctxs[name], inv) if selection.keep(r)]
    for n, found in args.wait().items():
        if n in reports and reports[n].reachable:
            reports[n].checks += [r for r in found if selection.keep(r)]
    if selection.area_wanted("network") and "network.clock" not in selection.skip:
        windows = {n: r.clock_window for n, r in reports.items() if r.clock_window is not None}
        for n, res in network_checks.evaluate_clocks(
            windows, inv.requirements.clock_skew_seconds
        ).items():
            if selection.keep(res):
                reports[n].checks.append(res)
    if selection.area_wanted("weights"):
        for n, res in weights_checks.sameness(local_listings(reports)).items():
            if selection.keep(res):
                reports[n].checks.append(res)
    return PreflightResult({n: reports[n] for n in sorted(reports, key=list(inv.hosts).index)})


# --------------------------------------------------------------------------- weights


def local_listings(reports: Mapping[str, HostReport]) -> dict[str, Listing]:
    return {
        n: r.facts.weights.listing
        for n, r in reports.items()
        if r.facts.weights is not None and r.facts.weights.listing is not None
    }
