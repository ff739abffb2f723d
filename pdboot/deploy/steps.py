"""The steps every plan is made of (run by executor.py): start, wait for, stop and remove
services, drain an engine, register and deregister a worker, bring back the compose file
that ran before this `up`, say something. Frozen values: a planner builds them from what it
decided on, the executor runs them in order, and each returns its inverse when it has one
(``undo``, set by the planner where what undoes a step depends on the plan it is in)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pdboot.deploy.executor import Action, Run
from pdboot.deploy.router_api import RouterApiError, RouterWorkerApi
from pdboot.events import Level, Note, RollProgress
from pdboot.inventory.schema import TierName
from pdboot.plan.converge import Observed, Step
from pdboot.plan.model import Service


def keys(services: Sequence[Service]) -> str:
    return ", ".join(s.key for s in services)


@dataclass(frozen=True)
class StartServices:
    """Create or recreate services (converge's steps: their kind says which)."""

    steps: tuple[Step, ...]
    number: int = 0  # a roll step's number: its progress is reported
    undo: Action | None = None
    commits = False

    def describe(self) -> str:
        return f"start {keys([s.service for s in self.steps])}"

    def run(self, run: Run) -> Action | None:
        if self.number:
            run.emit(RollProgress(self.number, "start", keys([s.service for s in self.steps])))
        run.ops.start(list(self.steps))
        return self.undo


@dataclass(frozen=True)
class WaitServices:
    """Until each answers /health; ``router``: until the router lists every engine (live
    workers: it registers them first)."""

    services: tuple[Service, ...]
    router: bool = False
    undo: Action | None = None
    commits = False

    def describe(self) -> str:
        return f"wait for {keys(self.services)}"

    def run(self, run: Run) -> Action | None:
        run.ops.wait(list(self.services), router=self.router)
        return self.undo


@dataclass(frozen=True)
class StopGone:
    """Containers the inventory no longer has: stopped and removed."""

    gone: tuple[Observed, ...]
    commits = False

    def describe(self) -> str:
        return f"stop {', '.join(o.key for o in self.gone)}"

    def run(self, run: Run) -> Action | None:
        run.ops.stop(list(self.gone))
        return None


@dataclass(frozen=True)
class RemoveServices:
    """The plan's services' containers, stopped and removed (found by their labels)."""

    services: tuple[Service, ...]
    undo: Action | None = None
    commits = False

    def describe(self) -> str:
        return f"stop and remove {keys(self.services)}"

    def run(self, run: Run) -> Action | None:
        run.ops.remove(self.services)
        return self.undo


@dataclass(frozen=True)
class Drain:
    """Until the engine has nothing in flight (``pullers``: decodes still pulling KV from a
    prefill)."""

    url: str
    pullers: tuple[str, ...] = ()
    number: int = 0
    label: str = ""  # blue/green names the engine by its key
    commits = False

    def describe(self) -> str:
        return f"drain {self.url}"

    def run(self, run: Run) -> Action | None:
        if self.number:
            run.emit(RollProgress(self.number, "drain", self.url))
        r = run.ops.drain(self.url, self.pullers)
        if self.number:
            run.emit(RollProgress(self.number, "drained", f"{self.url}: {r.describe()}"))
        else:
            run.emit(Note(f"blue/green: {self.label or self.url} drained: {r.describe()}"))
        return None


@dataclass(frozen=True)
class Register:
    """A worker added to a router and to the standby's, when there is one. ``where``: the
    home router, the router in the spare place (green's, during blue/green), or the
    standby's alone (green's first engines, once blue's have left it)."""

    url: str
    worker_type: TierName
    number: int = 0
    label: str = ""
    where: Literal["home", "spare", "standby"] = "home"
    commits = False

    def describe(self) -> str:
        return f"register {self.worker_type} {self.url}"

    def run(self, run: Run) -> Action | None:
        if self.where == "spare":
            ctx = run.swap_context()
            spare = ctx.placed(ctx.plan.router, "spare")
            api = RouterWorkerApi(spare.url, ctx.admin(spare), model_id=ctx.model_id)
            api.add(self.url, self.worker_type)
            run.routers.add(self.url, self.worker_type, home=False)
        else:
            run.routers.add(self.url, self.worker_type, home=self.where == "home")
        if self.number:
            run.emit(RollProgress(self.number, "register", f"{self.worker_type} {self.url}"))
        elif self.label:
            run.emit(Note(f"blue/green: {self.label}"))
        return None


@dataclass(frozen=True)
class Deregister:
    """A worker taken off the routers before it drains; its inverse registers it again.
    ``quiet``: a router that refuses is no failure (blue/green's blue half)."""

    url: str
    worker_type: TierName
    quiet: bool = False
    commits = False

    def describe(self) -> str:
        return f"deregister {self.url}"

    def run(self, run: Run) -> Action | None:
        if self.quiet:
            with contextlib.suppress(RouterApiError):
                run.routers.remove(self.url)
        else:
            run.routers.remove(self.url)
        return Register(self.url, self.worker_type)


@dataclass(frozen=True)
class RestorePrevious:
    """Undo of a change to engines: the ones it created stopped and removed, the ones it
    replaced recreated from the compose file that ran before this `up` (pair_guard.py), and
    waited for. Used by a roll's pair guard and by blue/green alike."""

    steps: tuple[Step, ...]
    number: int = 0
    commits = False

    def describe(self) -> str:
        return f"bring back {keys([s.service for s in self.steps])}"

    def run(self, run: Run) -> Action | None:
        if self.number:
            run.emit(RollProgress(self.number, "undo", keys([s.service for s in self.steps])))
        run.ops.restore(self.steps)
        run.restored.update(s.service.key for s in self.steps)
        return None


@dataclass(frozen=True)
class Say:
    """A line of the plan's story (a blue/green phase); ``undo``: what undoes the phase it
    announces, recorded before the phase acts (a start that fails half-way is undone too)."""

    message: str
    level: Level = "info"
    undo: Action | None = None
    commits = False

    def describe(self) -> str:
        return self.message

    def run(self, run: Run) -> Action | None:
        run.emit(Note(self.message, self.level))
        return self.undo


__all__ = [
    "Deregister",
    "Drain",
    "Register",
    "RemoveServices",
    "RestorePrevious",
    "Say",
    "StartServices",
    "StopGone",
    "WaitServices",
    "keys",
]
