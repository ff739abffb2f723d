"""`status`: what runs where (and the service selector `logs` uses, deploy/logs.py).

status: per service of the plan (and any leftover of this deployment): host, state,
health (its own /health over HTTP, the truth for readiness), uptime, image, whether its
config hash label matches the inventory, endpoint. Exit 0 only when every planned service
runs and answers /health.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime, timezone

from pdboot.deploy.frame import HostsFactory, default_hosts
from pdboot.deploy.ingress_status import IngressState, ingress_state
from pdboot.deploy.logscan import explain_services, report_lines
from pdboot.deploy.preflight_gate import recorded_findings
from pdboot.deploy.router_admin import AdminFetch
from pdboot.deploy.router_api import WorkerDiff, worker_diff
from pdboot.deploy.watch.verdicts import read_verdicts
from pdboot.deploy.weights.staging import as_recorded
from pdboot.events import Diagnosis, Done, Emit, Note, ServiceStatus, StatusReport
from pdboot.exitcodes import EXIT_FAILED, EXIT_OK
from pdboot.inventory.cpu_layout import describe
from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.plan.converge import Observed, owned
from pdboot.plan.model import ROLES, Plan, Service
from pdboot.plan.watch.verdicts import WatchVerdicts
from pdboot.preflight.findings import plan_from
from pdboot.timestamps import parse_rfc3339
from pdboot.transport.http import HttpFn, http
from pdboot.verify.pdstatus import PDStatus, Scrape, pd_status, scrape


def uptime(started_at: str, now: datetime) -> float | None:
    t = parse_rfc3339(started_at)
    return None if t is None else max((now - t).total_seconds(), 0.0)


def service_status(
    svc: Service | None,
    obs: Observed | None,
    *,
    reachable: bool,
    now: datetime,
    health: str,
    reason: str = "",
) -> ServiceStatus:
    """Pure: one row from the plan's service and what was observed."""
    role = svc.role if svc else str(obs.role if obs else "?")
    host = svc.host if svc else (obs.host if obs else "?")
    name = svc.name if svc else (obs.service_name if obs else role)
    if not reachable:
        state = "unreachable"
    elif obs is None:
        state = "absent"
    else:
        state = obs.state
    return ServiceStatus(
        service=f"{name}@{host}",
        role=role,
        host=host,
        state=state,
        health=health,
        uptime_seconds=uptime(obs.started_at, now) if obs and obs.state == "running" else None,
        image=obs.image if obs else (svc.image if svc else ""),
        matches_inventory=(obs.config_hash == svc.config_hash) if (obs and svc) else None,
        endpoint=svc.url if svc else "",
        planned=svc is not None,
        nic=svc.nic if svc else "",
        ranks=svc.dp_ranks if svc else "",
        cores=describe(svc.cpus) if svc and svc.device == "cpu" else "",
        reason="" if reachable else reason,
    )


_ENGINE_LABEL = re.compile(r'^vllm:[A-Za-z0-9_:]+\{[^}]*\bengine="([^"]*)"', re.M)


def metric_engines(text: str) -> list[str]:
    """The `engine` label values of vLLM's metrics, in rank order: a DP head's /metrics
    carries one per rank, local and remote, once they all joined."""
    found = set(_ENGINE_LABEL.findall(text))
    return sorted(found, key=lambda v: (not v.isdigit(), int(v) if v.isdigit() else 0, v))


def _ranks(svc: Service, fetch: HttpFn) -> str:
    """The head's ranks as its /metrics reports them, after the plan's."""
    a = fetch(f"{svc.url}/metrics", timeout=3.0)
    seen = metric_engines(a.body) if a.ok else []
    got = f"/metrics engines {','.join(seen)}" if seen else f"/metrics: {a.describe()}"
    return f"{svc.dp_ranks}; {got}"


def collect(
    inv: Inventory,
    accept_new_host_keys: bool = False,
    *,
    hosts_factory: HostsFactory = default_hosts,
    fetch: HttpFn = http,
) -> tuple[Plan, list[ServiceStatus], WorkerDiff | None, IngressState]:
    """The plan, a row per service, the router's workers against the plan (None when the
    router is not healthy), and the standby ingress's state (ingress_status.py)."""
    hosts = hosts_factory(inv, list(build_plan(inv).hosts), accept_new_host_keys)
    try:
        # the config hash includes the RDMA choice `up` made from its preflight: rebuild
        # the plan from that record, not from the declared devices alone
        findings = recorded_findings(inv, hosts)
        inv, _ = as_recorded(inv, hosts)  # the commit `up` pinned the engines to
        plan = plan_from(inv, findings)
        values, errors = hosts.each(lambda _h, link: link.engine.containers(plan.deployment), 60.0)
        unreachable = {**errors, **hosts.errors}  # host -> why (status carries the reason)
        observed = owned([o for obs in values.values() for o in obs], plan.deployment)
        # the router's own /health is on its host's loopback: through that host (router_admin.py)
        # one admin channel per router for the whole of `status` (router_admin.py)
        admin = AdminFetch(plan, hosts, fetch)
        standby = plan.standby_router
        spare = AdminFetch(plan, hosts, fetch, router=standby) if standby is not None else None
        try:
            now = datetime.now(timezone.utc)
            rows = rows_for(
                plan, observed, set(unreachable), now, admin, reasons=unreachable, standby=spare
            )
            router = next((r for r in rows if r.service == plan.router.key), None)
            diff = worker_diff(plan, admin) if router is not None and router.healthy else None
            reachable = [s.host for s in plan.keepalived if s.host not in unreachable]
            ingress = ingress_state(plan, hosts, spare, reachable) if spare else IngressState()
            return plan, rows, diff, ingress
        finally:
            admin.close()
            if spare is not None:
                spare.close()
    finally:
        hosts.close()


def rows_for(
    plan: Plan,
    observed: list[Observed],
    unreachable: set[str],
    now: datetime,
    fetch: HttpFn,
    *,
    reasons: Mapping[str, str] | None = None,
    standby: HttpFn | None = None,
) -> list[ServiceStatus]:
    """One row per planned service, then one per leftover container of the deployment.
    ``reasons``: host -> why it is unreachable; ``standby``: how the standby router's
    loopback is reached (its URL is the router host's: router_admin.py)."""
    rows = []
    seen: set[str] = set()
    for svc in (*plan.services(), *plan.ingress_services()):
        ask = standby if standby is not None and svc == plan.standby_router else fetch
        obs = next((o for o in observed if o.host == svc.host and o.service_name == svc.name), None)
        if obs is not None:
            seen.add(obs.id)
        health = "-"
        if obs is not None and obs.state == "running":
            # a headless DP follower has no HTTP: its head's health stands for it
            a = ask(svc.ready_url, timeout=3.0)
            health = "ok" if a.ok else a.describe()
        reachable = svc.host not in unreachable
        why = (reasons or {}).get(svc.host, "")
        row = service_status(svc, obs, reachable=reachable, now=now, health=health, reason=why)
        if svc.dp_role == "head" and health == "ok":
            row = replace(row, ranks=_ranks(svc, fetch))
        rows.append(row)
    for o in observed:
        if o.id not in seen:
            rows.append(service_status(None, o, reachable=True, now=now, health="-"))
    return rows


def status(
    inv: Inventory,
    emit: Emit,
    *,
    hosts_factory: HostsFactory = default_hosts,
    fetch: HttpFn = http,
    watch: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    accept_new_host_keys: bool = False,
) -> int:
    """Emits one StatusReport (and Done); exit 0 only when every planned service is healthy.
    ``watch``: a report every ``watch`` seconds until Ctrl-C, its P/D metrics the deltas
    since the previous report."""
    t0 = time.monotonic()
    before: Scrape | None = None
    t_before = t0
    code = EXIT_FAILED
    rows: list[ServiceStatus] = []
    try:
        while True:
            plan, rows, workers, ingress = collect(
                inv, accept_new_host_keys, hosts_factory=hosts_factory, fetch=fetch
            )
            running = {r.service for r in rows if r.state == "running"}
            now, t_now = scrape(plan, fetch, running), time.monotonic()
            pd = pd_status(plan, now, before, t_now - t_before)
            verdicts = watch_verdicts(inv, plan, fetch)
            code = _report(
                inv, plan, rows, pd, emit, diagnose=before is None, watch=verdicts, workers=workers
            )
            for text, level in ingress.lines(plan):  # router.standby (ingress_status.py)
                emit(Note(text, level))
            code = code if ingress.ok else EXIT_FAILED
            if watch is None:
                break
            before, t_before = now, t_now
            sleep(watch)
    except KeyboardInterrupt:
        pass  # --watch ends with Ctrl-C: the last report's verdict is the exit code
    healthy = sum(r.healthy for r in rows if r.planned)
    planned = sum(r.planned for r in rows)
    emit(Done("status", code, time.monotonic() - t0, f"{healthy} of {planned} services healthy"))
    return code


def watch_verdicts(inv: Inventory, plan: Plan, fetch: HttpFn) -> WatchVerdicts | None:
    """The watch service's (plan.watch), or a foreground `pdboot watch` on this machine's
    watch.port; None without a watch: section."""
    if inv.watch is None:
        return None
    base = plan.watch.url if plan.watch is not None else f"http://127.0.0.1:{inv.watch.port}"
    return read_verdicts(fetch, base)


def _report(
    inv: Inventory,
    plan: Plan,
    rows: list[ServiceStatus],
    pd: PDStatus,
    emit: Emit,
    *,
    diagnose: bool,
    watch: WatchVerdicts | None = None,
    workers: WorkerDiff | None = None,
) -> int:
    planned = [r for r in rows if r.planned]
    healthy = bool(planned) and all(r.healthy for r in planned)
    # a worker pdboot did not register, or an engine the router lost, is not healthy
    healthy = healthy and (workers is None or not (workers.foreign or workers.missing))
    report = StatusReport(inv.name, plan.endpoint + "/v1", healthy, tuple(rows), pd, watch)
    emit(replace(report, revision=plan.revision, workers=workers))
    no_logs = ("absent", "unreachable")
    sick = [r.service for r in planned if not r.healthy and r.state not in no_logs]
    if sick and diagnose:  # known causes in the logs of what runs but is not healthy
        emit(Diagnosis("not healthy", tuple(report_lines(explain_services(inv, sick)))))
    return EXIT_OK if healthy else EXIT_FAILED


# --------------------------------------------------------------------------- logs


class SelectorError(ValueError):
    pass


def select_service(inv: Inventory, selector: str, plan: Plan | None = None) -> Service:
    """``decode`` (only when one engine runs it), ``decode@gpu-b``, ``prefill-2@gpu-a``
    (an engine by name), or ``router``."""
    plan = plan or build_plan(inv)
    name, _, host = selector.partition("@")
    role = name.split("-", 1)[0] if name.split("-", 1)[-1].isdigit() else name
    if role not in ROLES:
        raise SelectorError(f"unknown role {role!r}: use one of {', '.join(ROLES)}")
    same_role = [s for s in plan.services() if s.role == role]
    matches = [s for s in same_role if s.name == name and (not host or s.host == host)]
    if not matches and name == role and not host:
        matches = same_role  # `prefill` alone: only when the tier has one engine in all
    if not matches:
        where = f" on host {host!r}" if host else ""
        raise SelectorError(f"no {name}{where}: " + ", ".join(s.key for s in same_role))
    if len(matches) > 1:
        raise SelectorError(
            f"{name} runs {len(matches)} times; pick one: " + ", ".join(s.key for s in matches)
        )
    return matches[0]
