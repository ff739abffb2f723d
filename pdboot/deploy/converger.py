"""Applies one change plan (plan/change_plan.py) to a running deployment over the small
start/wait/stop protocol (rollout.RollOps, service_ops.py implements it): rolling through the
running router (rolling.py decided the order, rollout.py runs it), or the recreate path, then
the proxy in front. Decides nothing the change plan did not; only asks before an outage."""

from __future__ import annotations

from collections.abc import Mapping

from pdboot.deploy.changes import show_changes
from pdboot.deploy.frame import CancelToken
from pdboot.deploy.rollout import PairRefused, RollOps, Rollout
from pdboot.deploy.router_api import RouterWorkerApi
from pdboot.deploy.up_options import Confirm, UpStopped
from pdboot.events import Emit, Note
from pdboot.plan.change_plan import ChangePlan
from pdboot.plan.converge import Step
from pdboot.plan.model import Plan


class Converger:
    def __init__(
        self,
        plan: Plan,
        ops: RollOps,
        api: RouterWorkerApi,
        emit: Emit,
        token: CancelToken,
        *,
        addresses: Mapping[str, str],
        yes: bool,
        confirm: Confirm | None,
    ) -> None:
        """``addresses``: every inventory host's advertised address (rollout.py finds a
        leaving engine's router URL by it); ``yes``/``confirm``: an outage is accepted by
        --yes, else asked (None: refused)."""
        self.plan, self.ops, self.api, self.emit, self.token = plan, ops, api, emit, token
        self.addresses, self.yes, self.confirm = addresses, yes, confirm

    def apply(self, change: ChangePlan) -> None:
        show_changes(self.emit, change, "converge")
        if change.rolls:
            self.roll(change)
        else:
            self.recreate(change)
        self.start_proxy(change.proxy)

    def roll(self, change: ChangePlan) -> None:
        """Live workers: the router stays, engines change one worker at a time
        (rolling.py's order, rollout.py's steps)."""
        self.accept_outages(change.roll.outages)
        try:
            Rollout(
                self.plan, change.roll, self.ops, self.api, self.emit, self.addresses, self.token
            ).run()
        except PairRefused:  # reported by the pair guard, the old engine back
            raise UpStopped from None
        if not any(s.action == "router" for s in change.roll.steps):
            self.ops.wait([self.plan.router], router=True)  # every engine registered, healthy

    def recreate(self, change: ChangePlan) -> None:
        """The recreate path (static router lists, --no-rolling, --rollback): every changed
        engine at once, then the router, recreated when its workers changed."""
        self.ops.stop(list(change.orphans))
        engines = change.engines
        self.ops.start(engines)
        self.ops.wait([s.service for s in engines], router=False)
        restarts = list(change.restarts)  # decodes holding NIXL state for an old prefill
        if restarts:  # after the prefill tier is ready, before the router registers them
            self.ops.start(restarts)
            self.ops.wait([s.service for s in restarts], router=False)
        self.ops.start(change.router)
        self.ops.wait([s.service for s in change.router], router=True)

    def start_proxy(self, proxy: list[Step]) -> None:
        """The public endpoint (plan/proxy.py), once the router behind it serves every
        engine; an unchanged proxy keeps serving throughout."""
        if any(s.kind != "unchanged" for s in proxy):
            self.ops.start(proxy)
            self.ops.wait([s.service for s in proxy], router=False)

    def accept_outages(self, outages: list[str]) -> None:
        if not outages or self.yes:
            return
        for line in outages:
            self.emit(Note(f"outage: {line}", "warn"))
        if self.confirm is None or not self.confirm(outages):
            self.emit(
                Note(
                    "error: this change takes a tier down (above); nothing was "
                    "changed; run again with --yes to accept it",
                    "error",
                )
            )
            raise UpStopped
