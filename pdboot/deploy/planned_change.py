"""What `up` changes on a running deployment, before it changes it: the change plan
(plan/change_plan.py) from what runs (config hash labels) against the inventory, decided
once and shown as events; all that `up --plan` (UpRun with apply off) shows of it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pdboot.deploy import versions
from pdboot.deploy.rollout import emit_plan
from pdboot.events import Emit, Note, ServiceAction, StageStarted
from pdboot.exitcodes import EXIT_CHANGES, EXIT_OK
from pdboot.plan.change_plan import ChangeOptions, ChangePlan, change_plan
from pdboot.plan.converge import Observed, Step
from pdboot.plan.model import Plan
from pdboot.plan.nixl_compat import ImageVersion
from pdboot.plan.rolling import RollPlan
from pdboot.plan.upgrade import Decision, decide
from pdboot.transport.hosts import Hosts

ROUTER_OUTAGE = "a short outage: the endpoint refuses connections until the new router answers"
ROUTER_SWAP = "swapped with no outage: a new router beside the old, then the proxy moves"


def action_reason(s: Step, roll: RollPlan | None = None) -> str:
    """The converge table's reason; a router change says what it costs."""
    if s.service.role == "router" and s.kind == "recreate":
        swap = roll is not None and roll.router_swap
        return f"{s.reason}; {ROUTER_SWAP if swap else ROUTER_OUTAGE}"
    return s.reason


def show_changes(emit: Emit, change: ChangePlan, stage: str) -> None:
    """The converge table, then the roll steps: what `up` shows before it acts, and all
    that `up --plan` shows."""
    emit(StageStarted(stage))
    for steps in (*change.stages, change.ingress):
        for s in steps:
            emit(ServiceAction(s.service.key, s.kind, action_reason(s, change.roll)))
    emit_plan(emit, change.roll)


def planned(
    emit: Emit,
    hosts: Hosts,
    plan: Plan,
    observed: Sequence[Observed],
    opts: ChangeOptions,
    pulled: Mapping[str, ImageVersion] | None,
) -> Decision:
    """The change `up` makes and `up --plan` shows, decided once: converge (change_plan),
    then the path a replaced engine's build allows (plan/upgrade.py's decide: roll,
    blue/green, degraded mode or outage), from the builds read first. ``pulled``: what
    `up`'s image check read in the pulled images; None for `up --plan`, which pulls
    nothing."""
    change = change_plan(plan, observed, opts)
    builds = versions.read_builds(hosts, change, pulled)
    decided = (
        Decision(change)
        if builds is None
        else decide(plan, change, builds.running, builds.images, pulled=pulled is not None)
    )
    versions.emit_decision(emit, decided)
    return decided


def shown(emit: Emit, decided: Decision) -> int:
    """All that `up --plan` shows of the decided change: EXIT_CHANGES when it changes
    anything (blue/green and degraded mode always do), else EXIT_OK."""
    change = decided.change
    show_changes(emit, change, "plan")
    for line in change.roll.notes:
        emit(Note(line, "warn"))
    phased = decided.taken("blue-green") or decided.taken("degraded")  # no roll steps
    return EXIT_CHANGES if change.changes or phased else EXIT_OK
