"""The one executor of a change: a plan is an ordered list of typed steps (frozen dataclasses:
deploy/steps.py, the roll's in rollout.py, the router swap's in router_swap.py, blue/green's in
bluegreen.py, the degraded upgrade's in tier_upgrade.py), planned by pure functions beside them
from what they decide on; nothing changes a plan once it is planned. Each step runs against one
context (``Run``: the ops seam of service_ops.py, the routers' worker APIs, the swap's context)
and returns its inverse when it has one.

The executor alone checks the cancellation token (once, before each step), lets Ctrl-C and a
lost lock through untouched (nothing further runs, not even an undo: frame.py reports it),
and on a failed step runs the inverses recorded so far, newest first, then raises the step's
own error. A step that ``commits`` (a roll step done, the proxy moved to a new router) ends
what can be undone: the inverses recorded before it are dropped."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from pdboot.deploy.drain import DrainResult
from pdboot.deploy.frame import Cancelled, CancelToken
from pdboot.deploy.router_api import RouterApiError, RouterWorkerApi
from pdboot.events import Emit, Note
from pdboot.inventory.schema import TierName
from pdboot.plan.converge import Observed, Step
from pdboot.plan.model import Plan, Service

if TYPE_CHECKING:
    from pdboot.deploy.router_swap import SwapContext


@dataclass(frozen=True)
class Seen:
    """What the hosts that answered run, and the hosts that did not: a report after a
    failed step still says what it can, and names an engine on a lost host as lost."""

    observed: list[Observed]
    unread: frozenset[str] = frozenset()  # hosts whose containers could not be listed
    lost: frozenset[str] = frozenset()  # of those, the ones the SSH watchdog gave up on


class Ops(Protocol):
    """What steps ask of the deployment's services (service_ops.ServiceOps)."""

    def start(self, steps: list[Step]) -> None: ...

    def wait(self, services: list[Service], *, router: bool) -> None: ...

    def stop(self, gone: list[Observed]) -> None: ...

    def remove(self, services: Sequence[Service]) -> None: ...

    def drain(self, url: str, pullers: Sequence[str]) -> DrainResult: ...

    def observe(self, only: Sequence[str] | None = None) -> list[Observed]: ...

    def look(self) -> Seen: ...

    def pairs_ok(self, joining: list[Service], number: int) -> bool: ...

    def restore(self, steps: Sequence[Step]) -> None: ...


@dataclass
class Routers:
    """The worker APIs a registration acts on: the home router's, and with router.standby
    the standby's (issue 44: kept in step during the change, not only at the end of `up`).
    A standby that does not answer is left for `up`'s ingress stage, which syncs it."""

    home: RouterWorkerApi
    standby: RouterWorkerApi | None = None
    closing: Callable[[], None] = lambda: None  # the standby's channel

    def close(self) -> None:
        self.closing()

    def add(self, url: str, worker_type: TierName, *, home: bool = True) -> None:
        if home:
            self.home.add(url, worker_type)
        if self.standby is not None:
            with contextlib.suppress(RouterApiError):
                self.standby.add(url, worker_type)

    def remove(self, url: str) -> bool:
        if self.standby is not None:
            with contextlib.suppress(RouterApiError):
                self.standby.remove(url)
        return self.home.remove(url)


@dataclass
class Run:
    """What a plan's steps run against. ``addresses``: every inventory host's advertised
    address (a leaving engine's router URL starts with it); ``restored``: engines a roll's
    undo brought back in their old configuration (its report says so)."""

    plan: Plan
    emit: Emit
    lent_ops: Ops | None = None  # None: a plan of router swap steps alone
    lent_routers: Routers | None = None
    addresses: Mapping[str, str] = field(default_factory=dict)
    swap: SwapContext | None = None
    restored: set[str] = field(default_factory=set)

    @property
    def ops(self) -> Ops:
        if self.lent_ops is None:
            raise RuntimeError("a step on services in a plan run without them")
        return self.lent_ops

    @property
    def routers(self) -> Routers:
        if self.lent_routers is None:
            raise RuntimeError("a worker step in a plan run without the routers")
        return self.lent_routers

    def swap_context(self) -> SwapContext:
        if self.swap is None:
            raise RuntimeError("a router swap step in a plan run without a swap context")
        return self.swap

    def close(self) -> None:
        """The admin channels the run opened: the routers' and the swap's."""
        if self.lent_routers is not None:
            self.lent_routers.close()
        if self.swap is not None:
            self.swap.close()


class Action(Protocol):
    """One step of a plan: ``run`` acts and returns its inverse (None: nothing to undo)."""

    @property
    def commits(self) -> bool: ...

    def describe(self) -> str: ...

    def run(self, run: Run) -> Action | None: ...


class Executor:
    def __init__(self, run: Run, token: CancelToken) -> None:
        self.ctx, self.token = run, token
        self.done: list[Action] = []  # every step that ran to the end, in order

    def execute(self, plan: Sequence[Action]) -> None:
        undo: list[Action] = []
        for step in plan:
            self.token.check()
            try:
                inverse = step.run(self.ctx)
            except (KeyboardInterrupt, Cancelled):
                raise  # nothing further, not even an undo: the frame reports it
            except Exception:
                self.undo(undo)
                raise
            self.done.append(step)
            if step.commits:
                undo.clear()
            if inverse is not None:
                undo.append(inverse)

    def undo(self, inverses: Sequence[Action]) -> None:
        """Newest first; an inverse that fails is reported and the rest still run (each
        brings back what it can)."""
        for inverse in reversed(inverses):
            try:
                inverse.run(self.ctx)
            except (KeyboardInterrupt, Cancelled):
                raise
            except Exception as e:
                self.ctx.emit(Note(f"undo: {inverse.describe()} failed: {e}", "warn"))


def execute(run: Run, token: CancelToken, plan: Sequence[Action]) -> None:
    Executor(run, token).execute(plan)


__all__ = ["Action", "Executor", "Ops", "Routers", "Run", "execute"]
