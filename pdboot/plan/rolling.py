"""The order `up` changes a running deployment in (pure): converge's steps -> roll steps.

With live workers (router.live_workers) the router stays up and the engine set changes under
it, one worker at a time, so each tier keeps N-1 engines serving:
1. add: every new engine (a host added to a tier) starts, and is registered once healthy
   (surge: capacity only grows). A first `up` is this step alone: every engine together.
   A new engine on a host that an engine leaves (replaced or removed) is added last instead,
   after that engine has gone: it may be given that engine's GPUs or ports.
2. remove: engines no longer in the inventory are deregistered, drained, then stopped (after
   the adds, so a replaced host's successor serves before it leaves).
3. replace, prefill first: an engine whose configuration changed is deregistered, drained and
   recreated in place, then registered once healthy. In place means its own GPUs and ports, so
   it cannot surge; the tier serves with one engine fewer meanwhile.
4. replace/restart decodes: changed decodes, and those restarted because a prefill was
   recreated (NIXL state, converge.decode_restarts), one at a time, after every prefill.
5. router: recreated only when its own settings changed (policy, port, arguments, image):
   the endpoint refuses connections until it answers /health again, then every engine is
   registered (a short outage).
A tier of one worker cannot roll (its replacement is an outage, said in the step), nor can a
data-parallel tier: vLLM's head only accepts its ranks while it starts, so the tier restarts
as a whole (one step, one worker).

Without rolling (`--no-rolling`, or the static router lists) the plan is the old recreate
path: every changed engine at once, then the router, recreated when its workers changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pdboot.inventory.schema import TIERS
from pdboot.plan.converge import Cause, Observed, Step
from pdboot.plan.model import LABEL_DP_RANKS, Plan, Service

RollAction = Literal["add", "remove", "replace", "restart", "router", "together"]


@dataclass(frozen=True)
class Capacity:
    tier: str
    serving: int  # workers registered and serving while the step runs
    wanted: int  # workers the inventory wants

    def describe(self) -> str:
        return f"{self.tier} {self.serving}/{self.wanted}"


@dataclass(frozen=True)
class RollStep:
    number: int
    action: RollAction
    tier: str  # prefill, decode, router, or "engines" for a step over both
    steps: tuple[Step, ...]  # converge steps of what it (re)starts
    gone: tuple[Observed, ...]  # what it stops for good
    how: str  # in words: "drain, then replace in place"
    reason: str
    capacity: tuple[Capacity, ...]
    endpoint_up: bool
    outage: str = ""  # why the endpoint or a whole tier goes down during it

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(s.service.key for s in self.steps) + tuple(o.key for o in self.gone)

    @property
    def services(self) -> list[Service]:
        return [s.service for s in self.steps]

    @property
    def drains(self) -> tuple[Observed, ...]:
        """The running containers it takes out of the router before they stop."""
        out = [s.current for s in self.steps if s.current is not None and s.current.running]
        return tuple(out) + tuple(o for o in self.gone if o.running)


@dataclass(frozen=True)
class RollPlan:
    steps: tuple[RollStep, ...]
    rolling: bool
    notes: tuple[str, ...] = ()  # what cannot roll, in words
    was_up: bool = True  # both tiers had a serving worker before the change
    # the router's step swaps it (deploy/router_swap.py): the old router serves until the
    # proxy moves to the new one, so engine steps before it go through the old one as usual
    router_swap: bool = False

    @property
    def changes(self) -> bool:
        return bool(self.steps)

    @property
    def outages(self) -> list[str]:
        """Engine-tier outages (a tier of one, a DP tier) of an endpoint that serves now:
        `up` asks for --yes first. Bringing back a deployment that is down causes none."""
        if not self.was_up:
            return []
        return [
            f"step {s.number}: {s.outage}" for s in self.steps if s.outage and s.action != "router"
        ]


def _unit_key(s: Service) -> str:
    """Workers roll one at a time; a data-parallel tier is one worker (head + followers)."""
    return f"dp:{s.role}" if s.dp_role else s.key


def _units(steps: Sequence[Step]) -> list[tuple[Step, ...]]:
    order: dict[str, list[Step]] = {}
    for s in steps:
        order.setdefault(_unit_key(s.service), []).append(s)
    return [tuple(v) for v in order.values()]


def _is_worker(s: Service) -> bool:
    return s.is_engine and not s.headless


def _serving(steps: Sequence[Step], gone: Sequence[Observed]) -> dict[str, int]:
    out: dict[str, int] = {t: 0 for t in TIERS}
    for s in steps:
        if _is_worker(s.service) and s.current is not None and s.current.running:
            out[s.service.role] += 1
    for o in gone:
        if o.role in TIERS and o.running and not _follower(o):
            out[str(o.role)] += 1
    return out


def _follower(o: Observed) -> bool:
    """A DP follower's container (its ranks do not start at 0): not a router worker."""
    ranks = o.labels.get(LABEL_DP_RANKS, "")
    return bool(ranks) and not ranks.startswith("0-")


def _wanted(plan: Plan) -> dict[str, int]:
    return {t: sum(1 for s in plan.services() if s.role == t and _is_worker(s)) for t in TIERS}


class _Builder:
    def __init__(self, plan: Plan, serving: dict[str, int]) -> None:
        self.plan = plan
        self.serving = dict(serving)
        self.wanted = _wanted(plan)
        self.out: list[RollStep] = []
        self.router_down = False

    def capacity(self, during: dict[str, int]) -> tuple[Capacity, ...]:
        return tuple(Capacity(t, during[t], self.wanted[t]) for t in TIERS)

    def add(
        self,
        action: RollAction,
        tier: str,
        steps: Sequence[Step],
        gone: Sequence[Observed],
        how: str,
        reason: str,
        during: dict[str, int],
        outage: str = "",
    ) -> None:
        up = not self.router_down and all(during[t] > 0 for t in TIERS)
        self.out.append(
            RollStep(
                len(self.out) + 1,
                action,
                tier,
                tuple(steps),
                tuple(gone),
                how,
                reason,
                self.capacity(during),
                up,
                outage,
            )
        )


def plan_roll(
    plan: Plan,
    stages: Sequence[Sequence[Step]],
    restarts: Sequence[Step],
    gone: Sequence[Observed],
    *,
    rolling: bool,
    swap: bool = False,
) -> RollPlan:
    """``stages``: converge.plan_up's; ``restarts``: converge.decode_restarts'; ``gone``:
    converge.orphans'; ``swap``: a router change swaps the router (can_swap) rather than
    recreating it. Steps in the order `up` runs them; none when nothing changes."""
    every = [s for stage in stages for s in stage]
    engines = [s for s in every if s.service.is_engine]  # watch: up starts it at the end
    router = [s for s in every if s.service.role == "router"]
    b = _Builder(plan, _serving(engines, gone))
    was_up = all(b.serving[t] > 0 for t in TIERS)
    if not rolling:
        return _together(b, engines, restarts, router, gone)
    by_key = {s.service.key: s for s in restarts}
    engines = [by_key.get(s.service.key, s) for s in engines]
    notes: list[str] = []
    new = [s for s in engines if s.kind == "create"]
    # A new engine on a host where an engine is replaced or removed starts after that one:
    # the old container may hold the GPUs or ports the new one is given (GPUs regrouped, an
    # engine moving tiers on its host). Only an engine on a host with nothing leaving surges.
    busy = {s.service.host for s in engines if s.kind == "recreate"} | {o.host for o in gone}
    _adds(b, [s for s in new if s.service.host not in busy])
    _removals(b, gone)
    for tier in TIERS:
        changed = [s for s in engines if s.service.role == tier and s.kind == "recreate"]
        for unit in _units(changed):
            _replace(b, tier, unit, notes)
    _adds(b, [s for s in new if s.service.host in busy], after="the engines leaving its host")
    swapped = swap and can_swap(every)
    _router_steps(b, router, swapped)
    return RollPlan(tuple(b.out), True, tuple(notes), was_up, swapped)


def _adds(b: _Builder, new: list[Step], after: str = "") -> None:
    if not new:
        return
    how = (
        f"start after {after}, then register once healthy"
        if after
        else ("start, then register once healthy (surge)")
    )
    b.add("add", "engines", new, (), how, "not running", dict(b.serving))
    for t in TIERS:
        units = {
            _unit_key(s.service) for s in new if s.service.role == t and not s.service.headless
        }
        b.serving[t] += len(units)


def _removals(b: _Builder, gone: Sequence[Observed]) -> None:
    for tier in TIERS:
        for o in sorted((o for o in gone if o.role == tier), key=lambda o: o.key):
            during = dict(b.serving)
            if o.running and not _follower(o):
                during[tier] -= 1
            b.add(
                "remove",
                tier,
                (),
                (o,),
                "deregister, drain, then stop",
                "no longer in the inventory",
                during,
            )
            b.serving = during


ROUTER_SWAP_HOW = (
    "swap: the new router starts beside the old one, gets every engine, the proxy moves to "
    "it (graceful reload), the old one drains and stops"
)


def can_swap(steps: Sequence[Step]) -> bool:
    """A router change can swap the router (no outage) when the old router runs and the
    proxy in front of it runs unchanged: its nginx.conf already names the spare upstream,
    and nothing else recreates it in this `up`."""
    router = [s for s in steps if s.service.role == "router"]
    proxy = [s for s in steps if s.service.role == "proxy"]
    return (
        len(router) == 1
        and router[0].kind == "recreate"
        and router[0].current is not None
        and router[0].current.running
        and len(proxy) == 1
        and proxy[0].kind == "unchanged"
    )


def _router_steps(b: _Builder, router: Sequence[Step], swap: bool = False) -> None:
    for s in router:
        if s.kind == "unchanged":
            continue
        if swap:
            b.add("router", "router", (s,), (), ROUTER_SWAP_HOW, s.reason, dict(b.serving))
            continue
        b.router_down = s.kind == "recreate"
        outage = (
            "the router restarts: the endpoint refuses connections until it answers "
            "/health, then pdboot registers every engine (seconds)"
            if s.kind == "recreate"
            else ""
        )
        b.add(
            "router",
            "router",
            (s,),
            (),
            "recreate, then register every engine",
            s.reason,
            dict(b.serving),
            outage,
        )
        b.router_down = False


def _replace(b: _Builder, tier: str, unit: tuple[Step, ...], notes: list[str]) -> None:
    head = unit[0]
    serving_now = any(
        s.current is not None and s.current.running and _is_worker(s.service) for s in unit
    )
    during = dict(b.serving)
    if serving_now:
        during[tier] -= 1
    dp = bool(head.service.dp_role)
    action: RollAction = "restart" if head.cause is Cause.NIXL_STATE else "replace"
    outage = ""
    if serving_now and during[tier] == 0:
        what = (
            "a data-parallel tier restarts as a whole (vLLM needs that)"
            if dp
            else (f"the {tier} tier has one engine: it cannot roll")
        )
        outage = f"{what}; requests fail until {head.service.key} is ready again"
        notes.append(outage)
    elif dp:
        notes.append(f"the {tier} data-parallel tier restarts as a whole (vLLM needs that)")
    how = "drain, then replace in place" if serving_now else "replace (it is not serving)"
    b.add(action, tier, unit, (), how, head.reason, during, outage)
    if not serving_now and any(_is_worker(s.service) for s in unit):
        b.serving[tier] += 1  # one that was down (exited) serves once replaced


def _together(
    b: _Builder,
    engines: Sequence[Step],
    restarts: Sequence[Step],
    router: Sequence[Step],
    gone: Sequence[Observed],
) -> RollPlan:
    """The recreate path: orphans stopped, every changed engine (re)started at once, the
    decode restarts after them, then the router (recreated when its workers changed)."""
    during = dict(b.serving)
    for o in gone:
        if o.role in TIERS and o.running and not _follower(o):
            during[str(o.role)] -= 1
    changed = [s for s in engines if s.kind != "unchanged"]
    for s in changed:
        if s.current is not None and s.current.running and _is_worker(s.service):
            during[s.service.role] -= 1
    if gone or changed:
        b.add(
            "together",
            "engines",
            changed,
            gone,
            "stop, then (re)start every changed engine",
            "recreate path (no rolling)",
            during,
        )
    if restarts:
        d2 = dict(during)
        d2["decode"] = max(0, d2["decode"] - len(restarts))
        b.add("restart", "decode", restarts, (), "restart together", restarts[0].reason, d2)
    for s in router:
        if s.kind != "unchanged":
            b.router_down = s.kind == "recreate"
            b.add(
                "router",
                "router",
                (s,),
                (),
                "recreate",
                s.reason,
                dict(b.serving),
                "the router restarts" if s.kind == "recreate" else "",
            )
    return RollPlan(tuple(b.out), False)
