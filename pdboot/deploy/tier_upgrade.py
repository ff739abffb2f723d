"""A new vLLM build through degraded mode, as steps for the one executor (executor.py;
plan/tier_upgrade.py decides the phases, plan/upgrade.py when this path is taken): each tier
serves alone, as plain engines, while the other is replaced, so an old and a new engine never
pair and the endpoint never goes down. The switches are worker-list changes
(router_api.switch_router, the switch watch's degraded mode makes); the engines are drained,
stopped and started through the executor's ops seam (service_ops.py).

With a proxy, clients never see the home router's list change: vllm-router takes one worker
per call, and between the two calls that add or remove a P/D pair it answers 503 for lack of
a complete pair (about a millisecond; 1 request in 243 failed so in CI). So phase 1 starts a
spare router (router_swap.py's spare place) that serves the old decode tier alone and points
the proxy at it (a graceful reload); phase 3 switches the spare's list (plain entries only:
no gap); phase 6 registers the new P/D pairs anew on the home router, which no client has
reached since phase 1, waits until it lists them healthy, points the proxy home and drains
and removes the spare. Without a proxy the home router's list is switched in place, with that
gap.

A phase that fails leaves the endpoint serving from the tier that serves then (degraded: with
a proxy, through the spare router), and `up` exits 1 saying which: the old decode tier while
the prefill tier is replaced, the new prefill tier after that. No step records an inverse:
going back would pair the two builds, so nothing is brought back automatically (`pdboot down`
then `up`, the message says).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NoReturn

from pdboot.deploy.executor import Action, Run
from pdboot.deploy.router_api import (
    RouterApiError,
    RouterWorkerApi,
    switch_router,
    worker_of,
)
from pdboot.deploy.router_swap import DrainRouter, PointProxy, RouterReady, StartRouter
from pdboot.deploy.steps import Say, StopGone
from pdboot.deploy.up_options import UpStopped
from pdboot.deploy.waits import Clock
from pdboot.events import Emit, Note
from pdboot.inventory.schema import TIERS, TierName
from pdboot.plan import degraded
from pdboot.plan.converge import Observed, Step
from pdboot.plan.degraded import engine_url, routed_workers
from pdboot.plan.model import Plan, Service
from pdboot.plan.router_slots import Slot
from pdboot.plan.tier_upgrade import TierPhase, changed_tiers, engines_in_rotation, tier_phases
from pdboot.transport.http import HttpFn
from pdboot.verify.pairs import check_pairs


@dataclass
class Serving:
    """What the endpoint serves while the steps run, and since when it is degraded: the
    run's state the phases report from (the plan itself never changes)."""

    clock: Clock
    mode: str = "pd"
    since: float | None = None

    def stopped(self, emit: Emit, why: str) -> NoReturn:
        emit(
            Note(
                f"error: degraded upgrade stopped: {why}; the endpoint serves "
                f"{degraded.describe(self.mode)} (`pdboot down` then `up` brings the whole set "
                "back)",
                "error",
            )
        )
        raise UpStopped


@dataclass(frozen=True)
class ServeFrom:
    """The list of the router in ``place`` made to serve the phase's engines (P/D, or one
    tier plain)."""

    phase: TierPhase
    serving: Serving
    place: Slot = "home"
    commits = False

    def describe(self) -> str:
        return f"serve {degraded.describe(self.phase.mode)} ({self.place} router)"

    def run(self, run: Run) -> Action | None:
        wanted = _in_rotation(run.plan, self.phase)
        api = _router_in(run, self.place)
        try:
            present = {w.url: w.worker_type for w in api.workers()}
            done, mode = switch_router(api, present, wanted)
        except RouterApiError as e:
            self.serving.stopped(run.emit, f"the router's worker list could not be switched: {e}")
        for c in done:
            run.emit(Note(f"router: {c.describe()}"))
        if mode != self.phase.mode:
            why = f"the router serves {degraded.describe(mode)}, not {self.phase.mode}"
            self.serving.stopped(run.emit, why)
        now, since = self.serving.clock.now(), self.serving.since
        if mode == "pd" and since is not None:
            run.emit(Note(f"degraded upgrade: P/D again after {now - since:.1f} s degraded"))
        elif mode != "pd" and since is None:
            self.serving.since = now
        self.serving.mode = mode
        run.emit(Note(f"degraded upgrade: the endpoint serves {degraded.describe(mode)}"))
        return None


@dataclass(frozen=True)
class RegisterAnew:
    """The home router, idle since the proxy moved to the spare, gets the phase's entries
    registered afresh: its old entries for these engines stand for containers replaced since
    (the router may have marked them unhealthy while they restarted); new entries start
    healthy. Foreign workers stay."""

    phase: TierPhase
    commits = False

    def describe(self) -> str:
        return "register the new engines anew on the idle home router"

    def run(self, run: Run) -> Action | None:
        wanted = routed_workers(_in_rotation(run.plan, self.phase))
        ours = {engine_url(u) for u in wanted}
        api = run.routers.home
        for w in api.workers():
            if engine_url(w.url) in ours:
                api.remove(w.url)
        for url, kind in sorted(wanted.items()):
            api.add(url, kind)
        return None


def _in_rotation(plan: Plan, phase: TierPhase) -> dict[str, TierName]:
    services = [s for s in plan.services() if worker_of(s) is not None]
    tiers = {s.key: w[1] for s in services if (w := worker_of(s)) is not None}
    urls = {s.key: w[0] for s in services if (w := worker_of(s)) is not None}
    return engines_in_rotation(phase, tiers, urls)


def _router_in(run: Run, place: Slot) -> RouterWorkerApi:
    """The worker API of the router in ``place`` (the spare's over the swap's admin channel
    for it, which the run closes)."""
    if place == "home":
        return run.routers.home
    ctx = run.swap_context()
    spare = ctx.placed(ctx.plan.router, "spare")
    return RouterWorkerApi(spare.url, ctx.admin(spare), model_id=ctx.model_id)


@dataclass(frozen=True)
class ReplaceTier:
    """A tier out of rotation already: drained (a prefill until no decode pulls from it),
    stopped, started on the new build and waited for."""

    tier: TierName
    steps: tuple[Step, ...]
    pullers: tuple[str, ...]  # the decodes' URLs a prefill waits on
    serving: Serving
    commits = False

    def describe(self) -> str:
        return f"replace the {self.tier} tier"

    def run(self, run: Run) -> Action | None:
        old = [s for s in self.steps if _runs(s)]
        for s in old:
            if not s.service.headless:
                r = run.ops.drain(s.service.url, self.pullers)
                run.emit(Note(f"degraded upgrade: {s.service.key} drained: {r.describe()}"))
        run.ops.remove([s.service for s in old])
        try:
            run.ops.start([replace(s, kind="create") for s in self.steps])
            run.ops.wait([s.service for s in self.steps], router=False)
        except UpStopped:  # the start or the wait reported why
            self.serving.stopped(run.emit, f"the new {self.tier} tier did not start (above)")
        return None


@dataclass(frozen=True)
class ProveNewPairs:
    """Every new prefill->decode pair moves KV before any client reaches it."""

    services: tuple[Service, ...]
    fetch: HttpFn = field(repr=False)
    headers: Mapping[str, str] = field(repr=False)  # the API key: never in a description
    serving: Serving = field(repr=False)
    commits = False

    def describe(self) -> str:
        return "prove the new pairs"

    def run(self, run: Run) -> Action | None:
        checks = check_pairs(run.plan, self.fetch, self.headers, list(self.services), [])
        for c in checks:
            run.emit(Note(f"degraded upgrade: pair {c.describe()}"))
        failed = [c for c in checks if not c.ok]
        if failed:
            self.serving.stopped(run.emit, f"the new pair {failed[0].describe()}")
        return None


def upgrade_steps(
    plan: Plan,
    steps: Sequence[Step],
    orphans: Sequence[Observed],
    serving: Serving,
    fetch: HttpFn,
    headers: Mapping[str, str],
    new_build: bool = True,
) -> list[Action]:
    """The plan: ``steps``, the change's engine steps (a new build: each running engine
    recreated, new ones created; ``new_build`` False, a change that keeps NIXL compatibility:
    the tiers with a step to take are replaced, the others keep running); ``orphans``,
    engines the inventory no longer has, out of rotation from the first switch on and
    stopped then. With a proxy the degraded phases serve through the spare router (the
    module docstring says why)."""
    engines = [s for s in steps if s.service.is_engine]
    blue = {t: [s.service.key for s in engines if _runs(s) and _tier(s) == t]
            for t in TIERS}  # fmt: skip
    green = {t: [s.key for s in plan.services() if s.is_engine and not s.headless
                 and s.role == t] for t in TIERS}  # fmt: skip
    decodes = tuple(s.url for s in plan.services() if s.role == "decode" and not s.headless)
    tiers = TIERS if new_build else changed_tiers(engines)
    change = "on the new build" if new_build else "with its new settings"
    out: list[Action] = []
    for p in tier_phases(blue, green, tiers, change):
        out.append(Say(f"degraded upgrade phase {p.number}: {p.describe()}"))
        if p.action == "serve":
            out += _serve(plan, p, serving)
            if p.number == 1 and orphans:
                out.append(StopGone(tuple(orphans)))
        elif p.action == "replace":
            assert p.tier is not None
            tier_steps = tuple(s for s in engines if s.service.role == p.tier)
            pullers = decodes if p.tier == "prefill" else ()
            out.append(ReplaceTier(p.tier, tier_steps, pullers, serving))
        else:
            out.append(ProveNewPairs(tuple(s.service for s in engines), fetch, headers, serving))
    done = "the new build" if new_build else "the new engines"
    out.append(Say(f"degraded upgrade: done; {done} serve P/D"))
    return out


def _serve(plan: Plan, p: TierPhase, serving: Serving) -> list[Action]:
    if plan.proxy is None:
        return [ServeFrom(p, serving)]
    router = plan.router
    if p.mode == "pd":  # back home: the home list is right and healthy before clients come
        pd = tuple(routed_workers(_in_rotation(plan, p)).items())
        return [
            RegisterAnew(p),
            RouterReady(router, "home", pd),
            PointProxy(router, "home"),
            ServeFrom(p, serving, "home"),
            DrainRouter(router, "spare"),
        ]
    if p.number == 1:  # the spare serves the first degraded phase before clients reach it
        return [
            StartRouter(router, "spare"),
            RouterReady(router, "spare", ()),
            ServeFrom(p, serving, "spare"),
            PointProxy(router, "spare"),
        ]
    return [ServeFrom(p, serving, "spare")]


def _runs(s: Step) -> bool:
    return s.current is not None and s.current.running


def _tier(s: Step) -> str:
    return "" if s.service.headless else s.service.role


__all__ = ["ProveNewPairs", "RegisterAnew", "ReplaceTier", "ServeFrom", "Serving", "upgrade_steps"]
