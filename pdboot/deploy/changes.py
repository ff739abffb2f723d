"""What `up` changes on a running deployment, before it changes it: the change plan
(plan/change_plan.py) from what runs (config hash labels) against the inventory, shown as
events, and `up --plan` (prints it, changes nothing)."""

from __future__ import annotations

from pdboot.deploy import versions
from pdboot.deploy.frame import Frame
from pdboot.deploy.rollout import emit_plan
from pdboot.deploy.seams import OP_DEADLINE, read_records, report_errors
from pdboot.deploy.weights.staging import as_recorded
from pdboot.events import Emit, Note, ServiceAction, StageStarted
from pdboot.exitcodes import EXIT_CHANGES, EXIT_FAILED, EXIT_OK
from pdboot.inventory.rules import deployment_hosts
from pdboot.plan.change_plan import ChangeOptions, ChangePlan, change_plan
from pdboot.plan.converge import Step
from pdboot.plan.rolling import RollPlan
from pdboot.preflight.findings import plan_from

# Internal, for bench/rolling.py's baseline only: "1" makes a router change recreate the
# router (the outage of before issue 28) instead of swapping it.
ROUTER_RECREATE_ENV = "PDBOOT_BENCH_ROUTER_RECREATE"
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


def plan_only(frame: Frame, opts: ChangeOptions) -> int:
    """`up --plan`: what runs (config hash labels) against the inventory, as the steps `up`
    would take; nothing is pulled, shipped, started or stopped. EXIT_OK: nothing to do,
    EXIT_CHANGES: changes, EXIT_FAILED: the hosts could not be read."""
    inv, emit = frame.inv, frame.emit
    hosts = frame.open(deployment_hosts(inv), former=True)
    if hosts.errors:
        report_errors(emit, "cannot reach", hosts.errors)
        return EXIT_FAILED
    inv, commit = as_recorded(inv, hosts)  # the commit `up` pinned: no hub request
    if commit:
        emit(Note(f"weights: {inv.model} at commit {commit} (pinned by an earlier up)"))
    findings, unread = read_records(inv, hosts)
    if unread:
        report_errors(emit, "cannot read the RDMA record on", unread)
        return EXIT_FAILED
    plan = plan_from(inv, findings)
    values, errors = hosts.each(
        lambda _h, link: link.engine.containers(plan.deployment), OP_DEADLINE
    )
    if errors:
        report_errors(emit, "cannot list containers on", errors)
        return EXIT_FAILED
    observed = [o for obs in values.values() for o in obs]
    change = change_plan(plan, observed, opts)
    decided = versions.decide(emit, hosts, plan, change, None)
    change = decided.change
    show_changes(emit, change, "plan")
    for line in change.roll.notes:
        emit(Note(line, "warn"))
    return EXIT_CHANGES if change.changes or decided.taken("blue-green") else EXIT_OK
