"""The services of a deployment on its hosts: start, wait (for /health, or for the router
to list every engine), stop, observe, drain, bring back what ran. The small protocol the
executor's steps drive (executor.Ops); each call emits what it did, and a wait's polls check
the run's cancellation token (the executor checks it between steps). A call that fails
reports it and raises UpStopped."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from pdboot.deploy import pair_guard
from pdboot.deploy.all_hosts import OP_DEADLINE, report_errors, start_all
from pdboot.deploy.down import clean_files, stop_remove, teardown
from pdboot.deploy.drain import DrainResult, drain
from pdboot.deploy.executor import Routers, Run, Seen
from pdboot.deploy.frame import CancelToken
from pdboot.deploy.readiness import Prober, find_container
from pdboot.deploy.router_admin import AdminFetch
from pdboot.deploy.router_api import RouterApiError, RouterWorkerApi, plan_workers
from pdboot.deploy.router_swap import RouterSwapError, SwapContext, settle_spare
from pdboot.deploy.up_options import UpStopped
from pdboot.deploy.waits import Clock, Tick, WaitError, WaitFailed, wait_all
from pdboot.events import (
    Emit,
    Failure,
    Note,
    Rollback,
    ServiceAction,
    ServiceReady,
    StageStarted,
    TierReady,
    WaitTick,
)
from pdboot.inventory.schema import Inventory
from pdboot.plan.converge import Observed, Step
from pdboot.plan.model import ENGINE_ROLES, Plan, Service
from pdboot.transport.hosts import Hosts, project_dir
from pdboot.transport.http import HttpFn
from pdboot.verify.diagnose import diagnose
from pdboot.verify.rootcause import READ_LINES, first_error

LOG_LINES_ON_FAILURE = 50


@dataclass(frozen=True)
class Where:
    """What the services' steps act on and report to."""

    inv: Inventory
    plan: Plan
    hosts: Hosts
    emit: Emit
    token: CancelToken
    fetch: HttpFn  # the router's worker API through router_admin.py's channel, the engines' /health
    clock: Clock
    live: bool  # router.live_workers: engines are registered through its worker API
    rollback: bool  # --rollback: a failed wait removes this deployment's containers
    headers: Mapping[str, str] = field(default_factory=dict)  # the API key, for pair probes
    explain: Callable[[str], None] = lambda _context: None  # known causes in the logs
    # host -> the compose.yaml that ran before this up (pair_guard), read as up ships
    previous: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


class ServiceOps:
    """start/wait/stop/observe/drain over the hosts (executor.Ops)."""

    def __init__(self, where: Where) -> None:
        self.w = where
        self.plan, self.hosts, self.emit, self.token = (
            where.plan,
            where.hosts,
            where.emit,
            where.token,
        )
        self.dir = project_dir(where.inv)
        engines = {h: link.engine for h, link in where.hosts.links.items()}
        self.prober = Prober(
            where.plan, engines, {}, where.fetch, where.clock, relink=where.hosts.relink
        )

    # ---- observe, stop

    def observe(self, only: Sequence[str] | None = None) -> list[Observed]:
        seen = self.look(only)
        if seen.unread:
            raise UpStopped
        return seen.observed

    def look(self, only: Sequence[str] | None = None) -> Seen:
        """Every host's containers of this deployment, as far as the hosts answer (an
        unanswered one is reported)."""
        self.token.check()
        values, errors = self.hosts.each(
            lambda _h, link: link.engine.containers(self.plan.deployment), OP_DEADLINE, only=only
        )
        self.token.check()
        report_errors(self.emit, "cannot list containers on", errors)
        lost = frozenset(
            h for h in errors if h in self.hosts.links and self.hosts.links[h].conn.lost
        )
        return Seen([o for obs in values.values() for o in obs], frozenset(errors), lost)

    def remove(self, services: Sequence[Service]) -> None:
        """The plan's services' containers (found by their labels), stopped and removed."""
        observed = self.observe(sorted({s.host for s in services}))
        found = [find_container(observed, self.plan.deployment, s) for s in services]
        stop_remove(
            self.hosts, [o for o in found if o is not None], self.emit, self.plan.stop_grace_s
        )

    def stop(self, gone: list[Observed]) -> None:
        """What the inventory no longer has: stopped and removed."""
        if not gone:
            return
        self.token.check()
        for o in gone:
            self.emit(ServiceAction(o.key, "remove", "no longer in the inventory"))
        stop_remove(self.hosts, gone, self.emit, self.plan.stop_grace_s)

    # ---- start and wait

    def start(self, steps: list[Step]) -> None:
        self.token.check()
        self.emit(StageStarted("start", tuple(s.service.key for s in steps)))
        errors = start_all(self.hosts, self.plan, self.dir, steps, self.emit)
        self.token.check()
        if errors:
            report_errors(self.emit, "cannot start services on", errors)
            raise UpStopped

    def locate(self, services: Sequence[Service]) -> None:
        """Each service's container, found by its labels (never by a built name)."""
        observed = self.observe(sorted({s.host for s in services}))
        for svc in services:
            o = find_container(observed, self.plan.deployment, svc)
            if o is not None:
                self.prober.container_ids[svc.key] = o.id

    def wait(self, services: list[Service], *, router: bool) -> None:
        self.token.check()
        self.locate(services)
        t = self.w.inv.timeouts
        if router:
            engines = [s for s in self.plan.services() if s.is_engine]
            register = self.register_all if self.w.live else None
            if register is not None:
                # a running router may still list engines that are gone (removed above);
                # a router that does not answer yet is registered by its probe below
                with contextlib.suppress(RouterApiError):
                    register()
            probes = {s.key: self.prober.router(s, engines, register) for s in services}
            deadline = t.router_ready_seconds
            what = "/health 200 and every engine in /workers"
        else:
            probes = {s.key: self.prober.engine(s) for s in services}
            deadline = t.ready_seconds
            what = "/health 200"
        self.emit(StageStarted("wait", tuple(probes)))
        announced: set[str] = set()
        try:
            took = wait_all(
                probes,
                what=what,
                deadline=deadline,
                interval=t.poll_interval_seconds,
                clock=self.w.clock,
                on_tick=lambda tick: self.on_tick(tick, announced),
            )
        except WaitError as e:
            self.fail(next(s for s in services if s.key == e.key), e)
            raise UpStopped from None
        tiers = (
            ("router",)
            if router
            else tuple(r for r in ENGINE_ROLES if any(s.role == r for s in services))
        )
        self.emit(TierReady(tiers, what, took))

    def on_tick(self, t: Tick, announced: set[str]) -> None:
        self.token.check()  # each poll of a wait is a step boundary: a lost lock stops it
        for key, p in t.states.items():
            if p.state == "ready" and key not in announced:
                announced.add(key)
                self.emit(ServiceReady(key, t.elapsed))
        rows = tuple(self.prober.service_wait(k, p.state, p.detail) for k, p in t.states.items())
        self.emit(WaitTick(t.elapsed, rows))

    def fail(self, svc: Service, e: WaitError) -> None:
        cid = self.prober.container_ids.get(svc.key)
        try:
            if cid is None:
                raise LookupError(f"no container labelled {svc.key} found")
            lines = self.hosts.links[svc.host].engine.logs(cid, tail=READ_LINES)
        except Exception as le:  # still report the failure itself
            lines = [f"(cannot read logs: {le})"]
        known = diagnose({svc.key: lines})
        self.emit(
            Failure(
                svc.key,
                str(e),
                isinstance(e, WaitFailed),
                tuple(lines[-LOG_LINES_ON_FAILURE:]),
                tuple(line for f in known for line in f.lines()),
                first_error(lines),
            )
        )
        self.token.check()  # a lost lock: nothing further, no rollback either
        if self.w.rollback:
            self.emit(Rollback("--rollback: removing this deployment's containers"))
            teardown(self.hosts, self.plan.deployment, self.emit, grace=self.plan.stop_grace_s)
            clean_files(self.hosts, self.w.inv, self.plan, False, self.emit)
        else:
            kind = "exited" if isinstance(e, WaitFailed) else "is not healthy"
            if e.probe.host_lost:
                kind = "is out of reach (its host was lost)"
            self.emit(
                Note(
                    f"{svc.key} {kind}; everything started is left in place for inspection "
                    f"(`pdboot logs INVENTORY {svc.key}`; `pdboot down INVENTORY` removes it)"
                )
            )

    # ---- the router's workers, an engine's drain

    def router_api(self) -> RouterWorkerApi:
        return RouterWorkerApi(
            self.plan.router.url, self.w.fetch, model_id=self.plan.served_model_name
        )

    def routers(self) -> Routers:
        """The home router's worker API, and with router.standby the standby's, through a
        channel of the standby host's own connection over the plain HTTP function
        (ingress.py); ``close()`` the value when done."""
        standby = self.plan.standby_router
        if standby is None:
            return Routers(self.router_api())
        plain = self.w.fetch.fetch if isinstance(self.w.fetch, AdminFetch) else self.w.fetch
        admin = AdminFetch(self.plan, self.hosts, plain, router=standby)
        api = RouterWorkerApi(standby.url, admin, model_id=self.plan.served_model_name)
        return Routers(self.router_api(), api, closing=admin.close)

    def executor_run(self, addresses: Mapping[str, str]) -> Run:
        """What a plan's steps run against: these services, the routers, the swap."""
        return Run(
            self.plan,
            self.emit,
            self,
            self.routers(),
            addresses,
            swap=self.swap_context(),
        )

    def settle_spare(self, observed: list[Observed]) -> list[Observed]:
        """A spare router an interrupted swap left: back home, or removed (router_swap.py);
        what runs then."""
        ctx = self.swap_context()
        try:
            if not settle_spare(ctx, observed):
                return observed
        except RouterSwapError as e:
            self.emit(Note(f"error: {e}", "error"))
            raise UpStopped from e
        finally:
            ctx.close()
        return self.observe()

    def swap_context(self) -> SwapContext:
        return SwapContext(
            self.w.inv,
            self.plan,
            self.hosts,
            self.w.fetch,
            self.emit,
            plan_workers(self.plan),
            self.plan.served_model_name,
            clock=self.w.clock,
        )

    # ---- a roll's pair guard (pair_guard.py)

    def pairs_ok(self, joining: list[Service], number: int) -> bool:
        """A roll's guard (rollout.ProbePairs): every P/D pair the joining engines create
        moves KV."""
        return pair_guard.pairs_ok(
            self.plan, self.w.fetch, self.w.headers, joining, self.emit, self.w.explain, number
        )

    def restore(self, steps: Sequence[Step]) -> None:
        """Undo a change to engines (steps.RestorePrevious); the engines brought back are
        waited for."""
        back = pair_guard.restore(
            steps, self.plan, self.hosts, self.dir, self.w.previous, self.observe(), self.emit
        )
        if back:
            self.prober.container_ids.clear()
            self.wait(back, router=False)

    def register_all(self) -> None:
        """Live workers: the router's list made equal to the inventory's (a new router
        knows no engine; this also removes what the inventory no longer has)."""
        for c in self.router_api().sync(plan_workers(self.plan)):
            self.emit(Note(f"router: {c.describe()}"))

    def drain(self, url: str, pullers: Sequence[str]) -> DrainResult:
        t = self.w.inv.timeouts
        return drain(
            url,
            self.w.fetch,
            self.w.clock,
            timeout=t.drain_seconds,
            interval=t.poll_interval_seconds,
            pullers=pullers,
        )
