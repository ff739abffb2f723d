"""What one `up` changes, computed once (pure): (plan, what runs, options) -> ChangePlan.

`up` acts on this value and `up --plan` prints it, so the two cannot disagree. Converge
(converge.py) runs once per `up`, here; the roll order comes from rolling.py.

Whether the change rolls is decided here too: with live workers (router.live_workers), unless
`--no-rolling` or `--rollback` (all or nothing) asks for the recreate path. Rolling, the
router's hash leaves the worker lists out and engines are registered at runtime, so converge
runs with ``live``; the recreate path recreates the router when its workers changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pdboot.plan.converge import (
    Observed,
    Step,
    decode_restarts,
    orphans,
    plan_ingress,
    plan_up,
    with_restarts,
)
from pdboot.plan.model import Plan
from pdboot.plan.rolling import RollPlan, plan_roll


@dataclass(frozen=True)
class ChangeOptions:
    live: bool  # router.live_workers: the router's workers are registered at runtime
    rolling: bool = True  # False: --no-rolling
    rollback: bool = False  # --rollback: all or nothing, never a roll

    @property
    def rolls(self) -> bool:
        return self.live and self.rolling and not self.rollback


@dataclass(frozen=True)
class ChangePlan:
    rolls: bool  # engines change one worker at a time under the running router
    converged: tuple[tuple[Step, ...], ...]  # converge's steps per stage (plan_up)
    restarts: tuple[Step, ...]  # decodes restarted for the NIXL state they hold
    stages: tuple[tuple[Step, ...], ...]  # the steps as `up` shows them (restarts in)
    orphans: tuple[Observed, ...]  # this deployment's containers the plan no longer has
    roll: RollPlan  # the roll steps (or the recreate path's, rolls False)
    # router.standby's router, proxy and keepalived (plan/ingress.py), after everything else
    ingress: tuple[Step, ...] = ()

    def _of(self, role: str) -> list[Step]:
        return [s for st in self.stages for s in st if s.service.role == role]

    @property
    def engines(self) -> list[Step]:
        """Every engine's converge step: the recreate path starts them together."""
        return [s for st in self.converged for s in st if s.service.is_engine]

    @property
    def router(self) -> list[Step]:
        return self._of("router")

    @property
    def proxy(self) -> list[Step]:
        return self._of("proxy")

    @property
    def watch(self) -> list[Step]:
        return self._of("watch")

    @property
    def changes(self) -> bool:
        """Anything to do (`up --plan`'s exit 2 with --detailed-exitcode)."""
        return self.roll.changes or any(s.kind != "unchanged" for s in (*self.proxy, *self.ingress))


def change_plan(plan: Plan, observed: Sequence[Observed], opts: ChangeOptions) -> ChangePlan:
    """Converge once, then order it: the one value `up` and `up --plan` both use."""
    rolls = opts.rolls
    first = plan_up(plan, observed, live=rolls)
    restarts = decode_restarts(first)
    stages = with_restarts(first, restarts, live=rolls)
    gone = orphans(plan, observed)
    return ChangePlan(
        rolls=rolls,
        converged=tuple(tuple(st) for st in first),
        restarts=tuple(restarts),
        stages=tuple(tuple(st) for st in stages),
        orphans=tuple(gone),
        roll=plan_roll(plan, first, restarts, gone, rolling=rolls, swap=rolls),
        ingress=tuple(plan_ingress(plan, observed)),
    )


def all_at_once(plan: Plan, change: ChangePlan) -> ChangePlan:
    """The same converge, applied all at once instead of rolled: a new vLLM build whose old
    and new engines must never pair, with a tier of one (no room for blue/green)."""
    roll = plan_roll(plan, change.converged, change.restarts, change.orphans, rolling=False)
    return replace(change, rolls=False, roll=roll)
