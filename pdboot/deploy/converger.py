"""Applies one change plan (plan/change_plan.py) to a running deployment: planned as the
executor's steps (executor.py) by ``change_steps`` (pure), then run against the services
(service_ops.py): the roll through the running router (rolling.py decided the order,
rollout.py's steps run it), or the recreate path, then the proxy in front. Decides nothing
the change plan did not; only asks before an outage."""

from __future__ import annotations

from pdboot.deploy.executor import Action, Run, execute
from pdboot.deploy.frame import CancelToken
from pdboot.deploy.planned_change import show_changes
from pdboot.deploy.rollout import PairRefused, roll_steps
from pdboot.deploy.router_swap import RouterSwapError
from pdboot.deploy.steps import StartServices, StopGone, WaitServices
from pdboot.deploy.up_options import Confirm, UpStopped
from pdboot.events import Emit, Note
from pdboot.plan.change_plan import ChangePlan
from pdboot.plan.converge import Step
from pdboot.plan.model import Plan


def change_steps(plan: Plan, change: ChangePlan) -> list[Action]:
    """The change plan as the executor runs it: the roll or the recreate path, then the
    proxy."""
    body = roll_steps(plan, change.roll) if change.rolls else recreate_steps(change)
    return [*body, *proxy_steps(change.proxy)]


def recreate_steps(change: ChangePlan) -> list[Action]:
    """The recreate path (static router lists, --no-rolling, --rollback): every changed
    engine at once, then the router, recreated when its workers changed."""
    engines = change.engines
    restarts = change.restarts  # decodes holding NIXL state for an old prefill
    out: list[Action] = [
        StopGone(change.orphans),
        StartServices(tuple(engines)),
        WaitServices(tuple(s.service for s in engines)),
    ]
    if restarts:  # after the prefill tier is ready, before the router registers them
        out += [StartServices(restarts), WaitServices(tuple(s.service for s in restarts))]
    router = change.router
    return [
        *out,
        StartServices(tuple(router)),
        WaitServices(tuple(s.service for s in router), router=True),
    ]


def proxy_steps(proxy: list[Step]) -> list[Action]:
    """The public endpoint (plan/proxy.py), once the router behind it serves every engine;
    an unchanged proxy keeps serving throughout."""
    if not any(s.kind != "unchanged" for s in proxy):
        return []
    return [StartServices(tuple(proxy)), WaitServices(tuple(s.service for s in proxy))]


def apply_steps(run: Run, token: CancelToken, steps: list[Action]) -> None:
    """Run a change's steps; a failure the steps did not report yet is reported here."""
    try:
        execute(run, token, steps)
    except PairRefused:  # reported by the pair guard, the old engine back
        raise UpStopped from None
    except RouterSwapError as e:
        run.emit(Note(f"error: {e}", "error"))
        raise UpStopped from e


def accept_outages(emit: Emit, outages: list[str], *, yes: bool, confirm: Confirm | None) -> None:
    """An outage is accepted by --yes, else asked (``confirm``; None: refused)."""
    if not outages or yes:
        return
    for line in outages:
        emit(Note(f"outage: {line}", "warn"))
    if confirm is None or not confirm(outages):
        emit(
            Note(
                "error: this change takes a tier down (above); nothing was "
                "changed; run again with --yes to accept it",
                "error",
            )
        )
        raise UpStopped


def apply(
    run: Run, token: CancelToken, change: ChangePlan, *, yes: bool, confirm: Confirm | None
) -> None:
    """`up`'s converge stage: the table, the outages asked for, the steps run."""
    show_changes(run.emit, change, "converge")
    if change.rolls:
        accept_outages(run.emit, change.roll.outages, yes=yes, confirm=confirm)
    apply_steps(run, token, change_steps(run.plan, change))
