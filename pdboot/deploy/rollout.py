"""Runs a rolling plan (rolling.py) against the running deployment: each step deregisters
what leaves the router, drains it (drain.py), (re)starts through `up`'s own start and wait,
and registers what is healthy (router_api.py). A failing step stops the roll: the engines
still serving stay registered, and which engine runs which configuration is reported.

`up` hands in itself as the RollOps (start, wait, stop, drain, observe); this module decides
nothing that rolling.py did not, and only emits events."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Protocol
from urllib.parse import urlsplit

from pdboot.deploy.drain import DrainResult
from pdboot.deploy.frame import NEVER_CANCELLED, Cancelled, CancelToken
from pdboot.deploy.readiness import find_container
from pdboot.deploy.router_api import (
    RouterApiError,
    RouterWorkerApi,
    Worker,
    plan_workers,
    worker_of,
)
from pdboot.events import Emit, RollPlanned, RollProgress, RollStopped
from pdboot.plan.converge import Observed, Step
from pdboot.plan.model import Plan, Service
from pdboot.plan.rolling import RollPlan, RollStep


class RollOps(Protocol):
    def start(self, steps: list[Step]) -> None: ...

    def wait(self, services: list[Service], *, router: bool) -> None: ...

    def stop(self, gone: list[Observed]) -> None: ...

    def drain(self, url: str, pullers: Sequence[str]) -> DrainResult: ...

    def observe(self, only: Sequence[str] | None = None) -> list[Observed]: ...

    def swap_router(self) -> None: ...

    def pairs_ok(self, joining: list[Service], number: int) -> bool: ...

    def restore(self, step: RollStep) -> None: ...


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


class Rollout:
    def __init__(
        self,
        plan: Plan,
        roll: RollPlan,
        ops: RollOps,
        api: RouterWorkerApi,
        emit: Emit,
        addresses: Mapping[str, str],
        token: CancelToken = NEVER_CANCELLED,
    ) -> None:
        """``addresses``: every inventory host's advertised address (a host that left its
        tier is not in the plan, and its engines' router URLs start with it)."""
        self.plan, self.roll, self.ops, self.api, self.emit = plan, roll, ops, api, emit
        self.addresses, self.token = addresses, token
        # a router created or recreated in this roll registers every engine when it is up;
        # until then there is no (or no lasting) router to register with
        # (a swapped router is not: the old one serves, and takes the changes, until then)
        self.router_later = not roll.router_swap and any(s.action == "router" for s in roll.steps)
        self.decodes = [s.url for s in plan.services() if s.role == "decode" and not s.headless]
        self.restored: set[str] = set()  # engines brought back in their old configuration

    def run(self) -> None:
        for step in self.roll.steps:
            self.token.check()
            try:
                self._step(step)
            except (KeyboardInterrupt, Cancelled):
                raise  # a lost lock: nothing further, not even re-registering
            except Exception:
                self.stopped(step)
                raise
            self.emit(RollProgress(step.number, "done", ", ".join(step.keys)))

    # ---- one step

    def _step(self, step: RollStep) -> None:
        if step.action == "router":
            self._router(step)
            return
        for o in step.drains:
            for url in self._urls_of(o):
                self._take_out(step.number, url, o.role or "")
        self.ops.stop([o for o in step.gone])
        if step.steps:
            self.emit(
                RollProgress(step.number, "start", ", ".join(s.service.key for s in step.steps))
            )
            self.ops.start(list(step.steps))
            self.ops.wait(step.services, router=False)
            # before the router may send a client to it: every pair it creates moves KV
            # (a deployment that was not serving is proven whole after: the KV proof, gate)
            joining = [s for s in step.services if s.is_engine] if self.roll.was_up else []
            if joining and not self.ops.pairs_ok(joining, step.number):
                self.emit(RollProgress(step.number, "undo", ", ".join(step.keys)))
                self.ops.restore(step)
                self.restored.update(step.keys)
                raise PairRefused(step.number)
            for svc in step.services:
                self._register(step.number, svc)

    def _router(self, step: RollStep) -> None:
        """`up`'s router wait registers every engine once the new router answers /health;
        a swap registers them on the new router before the proxy moves to it."""
        if self.roll.router_swap:
            self.ops.swap_router()
        else:
            self.ops.start(list(step.steps))
        self.ops.wait([step.steps[0].service], router=True)

    def _take_out(self, number: int, url: str, role: str) -> None:
        if not self.router_later:
            gone = self.api.remove(url)
            self.emit(
                RollProgress(number, "deregister", url if gone else f"{url} (was not registered)")
            )
        pullers = self.decodes if role == "prefill" else ()
        self.emit(RollProgress(number, "drain", url))
        r = self.ops.drain(url, pullers)
        self.emit(RollProgress(number, "drained", f"{url}: {r.describe()}"))

    def _register(self, number: int, svc: Service) -> None:
        w = worker_of(svc)
        if w is None or self.router_later:
            return
        self.api.add(*w)
        self.emit(RollProgress(number, "register", f"{w[1]} {w[0]}"))

    def _urls_of(self, o: Observed) -> list[str]:
        """A running container's router URL: the plan's when it is still in it (replaced in
        place), else the router's workers on its host's address that the plan lacks."""
        svc = next(
            (s for s in self.plan.services() if s.host == o.host and s.name == o.service_name), None
        )
        if svc is not None:
            w = worker_of(svc)
            return [w[0]] if w is not None else []
        address = self.addresses.get(o.host, "")
        wanted = plan_workers(self.plan)
        try:
            present: list[Worker] = self.api.workers()
        except RouterApiError:
            return []
        return [
            w.url
            for w in present
            if w.url not in wanted
            and w.worker_type == o.role
            and urlsplit(w.url).hostname == address.strip("[]")
        ]

    # ---- after

    def stopped(self, step: RollStep) -> None:
        """Keep serving what runs: register every plan engine whose container runs and
        answers, and report each engine's configuration."""
        observed: list[Observed] | None
        try:
            observed = self.ops.observe()
        except Exception:  # the failure itself was reported; say what we can
            observed = None
        rows: list[tuple[str, str]] = []
        for svc in self.plan.services():
            if not svc.is_engine:
                continue
            if observed is None:
                # unread is not "not running": it may well serve; the router keeps it
                rows.append((svc.key, "unknown (its state could not be read)"))
                continue
            o = find_container(observed, self.plan.deployment, svc)
            if o is None or not o.running:
                rows.append((svc.key, "not running"))
                self._deregister_quietly(svc)
                continue
            new = o.config_hash == svc.config_hash
            failed = (
                svc.key in step.keys and step.action != "remove" and svc.key not in self.restored
            )
            rows.append(
                (
                    svc.key,
                    ("new configuration " if new else "old configuration ")
                    + f"({o.config_hash})"
                    + (" - failed its wait" if failed else ""),
                )
            )
            if not failed and not self.router_later:
                w = worker_of(svc)
                if w is not None:
                    with contextlib.suppress(RouterApiError):
                        self.api.add(*w)
            elif failed:
                self._deregister_quietly(svc)
        self.emit(RollStopped(step.number, tuple(rows)))

    def _deregister_quietly(self, svc: Service) -> None:
        w = worker_of(svc)
        if w is None or self.router_later:
            return
        with contextlib.suppress(RouterApiError):
            self.api.remove(w[0])
