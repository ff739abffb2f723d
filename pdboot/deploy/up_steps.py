"""`up`'s options, and its steps on a running deployment: rolling a change through the
running router (rolling.py decides, rollout.py runs it), or the recreate path, and what they
need of the router (its worker API) and of an engine leaving service (its drain). Mixed into
deploy.up._Up, which owns starting, waiting and the events around them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pdboot.deploy.changes import action_reason, roll_plan
from pdboot.deploy.down import stop_remove
from pdboot.deploy.drain import DrainResult, drain
from pdboot.deploy.readiness import Prober
from pdboot.deploy.rollout import Rollout, emit_plan
from pdboot.deploy.router_api import RouterWorkerApi, plan_workers
from pdboot.deploy.router_swap import RouterSwapError, SwapContext, move_router, settle_spare
from pdboot.deploy.waits import Clock
from pdboot.events import Emit, Note, ServiceAction, StageStarted
from pdboot.inventory.rules import advertised_address
from pdboot.inventory.schema import Inventory
from pdboot.plan.converge import Observed, Step, decode_restarts, plan_up, with_restarts
from pdboot.plan.model import WATCH_SECRETS_FILE, Plan, Service
from pdboot.plan.proxy import proxy_files
from pdboot.plan.rolling import RollPlan
from pdboot.plan.watch import watch_secrets_text
from pdboot.preflight import ucx_probe
from pdboot.preflight.findings import Findings, plan_from, records_to_ship
from pdboot.transport.hosts import Hosts
from pdboot.transport.http import HttpFn
from pdboot.weights.stage import NOTHING_STAGED, Staging

# asked with the outages in words before a tier that cannot roll goes down; True: go on
Confirm = Callable[[list[str]], bool]


class UpStopped(Exception):
    """A step failed and was reported; `up` exits 1."""


@dataclass(frozen=True)
class UpOptions:
    skip_preflight: bool = False
    rollback: bool = False
    accept_new_host_keys: bool = False
    speed: bool = True  # the long request that measures the KV path per pair (after prove)
    prove: bool = True
    no_wait: bool = False  # a held deployment lock: exit 1 at once instead of waiting
    rolling: bool = True  # False (--no-rolling): the recreate path, every change at once
    plan_only: bool = False  # --plan: print the steps, change nothing
    detailed_exitcode: bool = False  # with --plan: exit 2 when there are changes (terraform's)
    yes: bool = False  # --yes: accept the outage of a tier that cannot roll
    refresh_weights: bool = False  # move to the commit model_revision names now (weights/pin.py)


@dataclass(frozen=True)
class UpEnv:
    clock: Clock
    fetch: HttpFn
    token: dict[str, str] | None
    confirm: Confirm | None = None
    weights: Staging = NOTHING_STAGED  # the commit the engines load, staged during the pull
    tls: tuple[str, str] | None = None  # router.tls's (cert, key) PEM, read at `up`


class ChangeSteps:
    """What `up` does once it knows what runs; _Up provides the attributes and the
    start/wait/remove_orphans steps declared here."""

    inv: Inventory
    plan: Plan
    hosts: Hosts
    opts: UpOptions
    emit: Emit
    env: UpEnv
    live: bool
    records: dict[str, str]  # host -> RDMA record text to ship
    findings: Findings = Findings({}, {}, "recorded")  # what the plan was built on
    prober: Prober

    def check_ucx(self) -> bool:
        """After the image check: each engine's UCX backend as it will create it
        (preflight/ucx_probe.py); ``rdma: auto`` may move hosts to TCP (plan and records
        follow). False when an engine's fails: nothing may start."""
        before = self.findings
        self.plan, self.findings, ok = ucx_probe.check(
            self.plan,
            self.hosts,
            before,
            self.inv.kv_transfer.rdma,
            self.emit,
            lambda f: plan_from(self.inv, f),
        )
        if self.findings is not before:  # rdma auto fell back to TCP somewhere
            self.records, self.prober.plan = records_to_ship(self.findings), self.plan
        if not ok:
            self.emit(Note("UCX check failed: nothing was started", "error"))
        return ok

    def start(self, steps: list[Step]) -> None:
        raise NotImplementedError

    def wait(self, services: list[Service], *, router: bool) -> None:
        raise NotImplementedError

    def remove_orphans(self, observed: list[Observed]) -> None:
        raise NotImplementedError

    def observe(self, only: Sequence[str] | None = None) -> list[Observed]:
        raise NotImplementedError

    def start_proxy(self, proxy: list[Step]) -> None:
        """The public endpoint (plan/proxy.py), once the router behind it serves every
        engine; an unchanged proxy keeps serving throughout."""
        if any(s.kind != "unchanged" for s in proxy):
            self.start(proxy)
            self.wait([s.service for s in proxy], router=False)

    def files_to_ship(self) -> dict[str, dict[str, str]]:
        """Host -> files beside compose.yaml: the weights pin, the proxy's nginx.conf and its
        key check (PRIVATE_FILES: 0600)."""
        out = {h: dict(files) for h, files in self.env.weights.pin_files().items()}
        key = (self.env.token or {}).get("VLLM_API_KEY")
        here = out.setdefault(self.inv.router.host, {})
        here.update(proxy_files(self.inv, key, self.env.tls))
        watch_env = watch_secrets_text(key) if self.plan.watch is not None else None
        if watch_env is not None:
            here[WATCH_SECRETS_FILE] = watch_env
        return out

    def show_steps(self, stages: list[list[Step]], roll: RollPlan | None = None) -> None:
        self.emit(StageStarted("converge"))
        for steps in stages:
            for s in steps:
                self.emit(ServiceAction(s.service.key, s.kind, action_reason(s, roll)))

    def roll(self, observed: list[Observed]) -> None:
        """Live workers: the router stays, engines change one worker at a time
        (rolling.py's order, rollout.py's steps)."""
        observed = self.settle_spare(observed)
        stages, roll = roll_plan(self.plan, observed, live=True, rolling=True)
        self.show_steps(stages, roll)
        emit_plan(self.emit, roll)
        self.accept_outages(roll.outages)
        addresses = {h: advertised_address(spec) for h, spec in self.inv.hosts.items()}
        Rollout(self.plan, roll, self, self.router_api(), self.emit, addresses).run()
        if not any(s.action == "router" for s in roll.steps):
            self.wait([self.plan.router], router=True)  # every engine registered, healthy

    def recreate(self, observed: list[Observed]) -> None:
        """The recreate path (static router lists, or --no-rolling): every changed engine at
        once, then the router, recreated when its workers changed."""
        observed = self.settle_spare(observed)
        first = plan_up(self.plan, observed)
        restarts = decode_restarts(first)  # decodes holding NIXL state for an old prefill
        stages = with_restarts(first, restarts)
        self.show_steps(stages)
        _, roll = roll_plan(self.plan, observed, live=False, rolling=False)
        emit_plan(self.emit, roll)
        self.remove_orphans(observed)
        engines = [s for steps in first for s in steps if s.service.is_engine]
        router = [s for steps in stages for s in steps if s.service.role == "router"]
        self.start(engines)
        self.wait([s.service for s in engines], router=False)
        if restarts:  # after the prefill tier is ready, before the router registers them
            self.start(restarts)
            self.wait([s.service for s in restarts], router=False)
        self.start(router)
        self.wait([s.service for s in router], router=True)

    def accept_outages(self, outages: list[str]) -> None:
        if not outages or self.opts.yes:
            return
        for line in outages:
            self.emit(Note(f"outage: {line}", "warn"))
        confirm = self.env.confirm
        if confirm is None or not confirm(outages):
            self.emit(
                Note(
                    "error: this change takes a tier down (above); nothing was "
                    "changed; run again with --yes to accept it",
                    "error",
                )
            )
            raise UpStopped

    def register_all(self) -> None:
        """Live workers: the router's list made equal to the inventory's (a new router
        knows no engine; this also removes what the inventory no longer has)."""
        for c in self.router_api().sync(plan_workers(self.plan)):
            self.emit(Note(f"router: {c.describe()}"))

    def settle_spare(self, observed: list[Observed]) -> list[Observed]:
        """A spare router an interrupted swap left: back home, or removed (router_swap.py);
        what runs then."""
        try:
            if not settle_spare(self.swap_context(), observed):
                return observed
        except RouterSwapError as e:
            self.emit(Note(f"error: {e}", "error"))
            raise UpStopped from e
        return self.observe()

    def swap_router(self) -> None:
        """The router's settings changed: swapped with no outage (router_swap.py), the
        new settings from the compose.yaml `up` shipped."""
        try:
            move_router(self.swap_context())
        except RouterSwapError as e:
            self.emit(Note(f"error: {e}", "error"))
            raise UpStopped from e

    def swap_context(self) -> SwapContext:
        return SwapContext(
            self.inv,
            self.plan,
            self.hosts,
            self.env.fetch,
            self.emit,
            plan_workers(self.plan),
            self.plan.served_model_name,
            clock=self.env.clock,
        )

    def router_api(self) -> RouterWorkerApi:
        return RouterWorkerApi(
            self.plan.router.url, self.env.fetch, model_id=self.plan.served_model_name
        )

    def drain(self, url: str, pullers: Sequence[str]) -> DrainResult:
        t = self.inv.timeouts
        return drain(
            url,
            self.env.fetch,
            self.env.clock,
            timeout=t.drain_seconds,
            interval=t.poll_interval_seconds,
            pullers=pullers,
        )

    def stop(self, gone: list[Observed]) -> None:
        for o in gone:
            self.emit(ServiceAction(o.key, "remove", "no longer in the inventory"))
        if gone:
            stop_remove(self.hosts, gone, self.emit)
