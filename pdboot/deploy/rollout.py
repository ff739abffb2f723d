"""A rolling plan (plan/rolling.py) as the executor's steps (executor.py): each roll step
deregisters what leaves the router, drains it (drain.py), (re)starts through `up`'s own start
and wait, probes the pairs it creates, and registers what is healthy (router_api.py). A
failing step stops the roll: its undo brings an engine whose pair failed back in its old
configuration, keeps the engines still serving registered, and reports which engine runs
which configuration.

``roll_steps`` is pure: it decides nothing that rolling.py did not, and the steps only act
and emit events."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from urllib.parse import urlsplit

from pdboot.deploy.executor import Action, Run, Seen
from pdboot.deploy.readiness import find_container
from pdboot.deploy.router_api import RouterApiError, Worker, plan_workers, worker_of
from pdboot.deploy.router_swap import move_steps
from pdboot.deploy.steps import (
    Drain,
    Register,
    RestorePrevious,
    StartServices,
    StopGone,
    WaitServices,
)
from pdboot.events import Emit, RollPlanned, RollProgress, RollStopped
from pdboot.plan.converge import Observed
from pdboot.plan.model import Plan, Service
from pdboot.plan.rolling import RollPlan, RollStep


class PairRefused(Exception):
    """A pair the step created failed its P/D probe: the step was undone and reported."""


def emit_plan(emit: Emit, roll: RollPlan) -> None:
    for s in roll.steps:
        emit(
            RollPlanned(
                s.number,
                s.action,
                s.tier,
                s.keys,
                s.how,
                s.reason,
                tuple(c.describe() for c in s.capacity),
                s.endpoint_up,
                s.outage,
            )
        )


def router_later(roll: RollPlan) -> bool:
    """A router created or recreated in this roll registers every engine when it is up;
    until then there is no (or no lasting) router to register with (a swapped router is
    not: the old one serves, and takes the changes, until then)."""
    return not roll.router_swap and any(s.action == "router" for s in roll.steps)


def roll_steps(plan: Plan, roll: RollPlan) -> list[Action]:
    """The roll as the executor runs it; with no router step, a last wait until the router
    serves every engine."""
    later = router_later(roll)
    decodes = tuple(s.url for s in plan.services() if s.role == "decode" and not s.headless)
    out: list[Action] = []
    for step in roll.steps:
        out.append(RollBegun(step, later))
        if step.action == "router":
            router = step.steps[0].service
            if roll.router_swap:  # the new settings from the compose.yaml `up` shipped
                out.extend(move_steps(router))
            else:
                out.append(StartServices(step.steps))
            out.append(WaitServices((router,), router=True))
        else:
            for o in step.drains:
                pullers = decodes if (o.role or "") == "prefill" else ()
                out.append(TakeOut(step.number, o, pullers, deregister=not later))
            out.append(StopGone(step.gone))
            if step.steps:
                out.extend(_start(step, roll.was_up, later))
        out.append(RollDone(step.number, ", ".join(step.keys)))
    if not any(s.action == "router" for s in roll.steps):
        out.append(WaitServices((plan.router,), router=True))  # every engine registered
    return out


def _start(step: RollStep, was_up: bool, later: bool) -> list[Action]:
    out: list[Action] = [StartServices(step.steps, step.number)]
    # before the router may send a client to it: every pair it creates moves KV
    # (a deployment that was not serving is proven whole after: the KV proof, gate)
    joining = tuple(s for s in step.services if s.is_engine) if was_up else ()
    # once waited for, the new engines are what a failed pair takes back
    undo = RestorePrevious(step.steps, step.number) if joining else None
    out.append(WaitServices(tuple(step.services), undo=undo))
    if joining:
        out.append(ProbePairs(step.number, joining))
    if not later:
        for svc in step.services:
            w = worker_of(svc)
            if w is not None:
                out.append(Register(w[0], w[1], step.number))
    return out


# ---- the roll's own steps


@dataclass(frozen=True)
class RollBegun:
    """A roll step starts; its inverse, should it fail, is the report (RollReport)."""

    step: RollStep
    router_later: bool
    commits = False

    def describe(self) -> str:
        return f"roll step {self.step.number}"

    def run(self, run: Run) -> Action | None:
        return RollReport(self.step, self.router_later)


@dataclass(frozen=True)
class RollDone:
    number: int
    keys: str
    commits = True  # a finished roll step stays, whatever a later one does

    def describe(self) -> str:
        return f"roll step {self.number} done"

    def run(self, run: Run) -> Action | None:
        run.emit(RollProgress(self.number, "done", self.keys))
        return None


@dataclass(frozen=True)
class TakeOut:
    """A running engine leaves the router (unless no router is up to take it out of) and
    drains."""

    number: int
    container: Observed
    pullers: tuple[str, ...]
    deregister: bool
    commits = False

    def describe(self) -> str:
        return f"take out {self.container.key}"

    def run(self, run: Run) -> Action | None:
        for url in urls_of(run, self.container):
            if self.deregister:
                gone = run.routers.remove(url)
                detail = url if gone else f"{url} (was not registered)"
                run.emit(RollProgress(self.number, "deregister", detail))
            Drain(url, self.pullers, self.number).run(run)
        return None


@dataclass(frozen=True)
class ProbePairs:
    """Every P/D pair the joining engines create moves KV (pair_guard.py), or the step
    fails (PairRefused) and its undo brings the old engines back."""

    number: int
    joining: tuple[Service, ...]
    commits = False

    def describe(self) -> str:
        return f"probe the pairs of {', '.join(s.key for s in self.joining)}"

    def run(self, run: Run) -> Action | None:
        if not run.ops.pairs_ok(list(self.joining), self.number):
            raise PairRefused(self.number)
        return None


@dataclass(frozen=True)
class RollReport:
    """Keep serving what runs: register every plan engine whose container runs and answers
    (not the step's own, unless its undo brought it back), and report each engine's
    configuration."""

    step: RollStep
    router_later: bool
    commits = False

    def describe(self) -> str:
        return f"report roll step {self.step.number}"

    def run(self, run: Run) -> Action | None:
        plan, step = run.plan, self.step
        seen: Seen | None
        try:
            seen = run.ops.look()
        except Exception:  # the failure itself was reported; say what we can
            seen = None
        rows: list[tuple[str, str]] = []
        for svc in plan.services():
            if not svc.is_engine:
                continue
            if seen is None or svc.host in seen.unread:
                # unread is not "not running": it may well serve; the router keeps it
                lost = seen is not None and svc.host in seen.lost
                why = (
                    "out of reach (its host was lost)"
                    if lost
                    else "unknown (its state could not be read)"
                )
                rows.append((svc.key, why))
                continue
            o = find_container(seen.observed, plan.deployment, svc)
            if o is None or not o.running:
                rows.append((svc.key, "not running"))
                self._deregister_quietly(run, svc)
                continue
            new = o.config_hash == svc.config_hash
            failed = (
                svc.key in step.keys and step.action != "remove" and svc.key not in run.restored
            )
            state = "new configuration " if new else "old configuration "
            rows.append(
                (svc.key, state + f"({o.config_hash})" + (" - failed its wait" if failed else ""))
            )
            if not failed and not self.router_later:
                w = worker_of(svc)
                if w is not None:
                    with contextlib.suppress(RouterApiError):
                        run.routers.add(*w)
            elif failed:
                self._deregister_quietly(run, svc)
        run.emit(RollStopped(step.number, tuple(rows)))
        return None

    def _deregister_quietly(self, run: Run, svc: Service) -> None:
        w = worker_of(svc)
        if w is None or self.router_later:
            return
        with contextlib.suppress(RouterApiError):
            run.routers.remove(w[0])


def urls_of(run: Run, o: Observed) -> list[str]:
    """A running container's router URL: the plan's when it is still in it (replaced in
    place), else the router's workers on its host's address that the plan lacks."""
    plan = run.plan
    svc = next((s for s in plan.services() if s.host == o.host and s.name == o.service_name), None)
    if svc is not None:
        w = worker_of(svc)
        return [w[0]] if w is not None else []
    address = run.addresses.get(o.host, "")
    wanted = plan_workers(plan)
    try:
        present: list[Worker] = run.routers.home.workers()
    except RouterApiError:
        return []
    return [
        w.url
        for w in present
        if w.url not in wanted
        and w.worker_type == o.role
        and urlsplit(w.url).hostname == address.strip("[]")
    ]


__all__ = ["PairRefused", "emit_plan", "roll_steps", "router_later", "urls_of"]
