"""Blue/green for a change that breaks NIXL compatibility (plan/upgrade.py decides, this
module acts): old (blue) and new (green) engines never pair, and clients never meet green
before it is proven.

1. half of each blue tier (rounded down, never below one) is deregistered from blue's
   router, drained and stopped; blue serves on the rest;
2. green's first engines start on the freed room (the inventory's engines on those hosts),
   their own pairs are probed, and green's router starts in the router host's spare place
   (deploy/router_swap.py) with only green's engines; there it passes the KV proof and the
   correctness gate before the proxy may send it a client;
3. the proxy switches to green's router (a graceful nginx reload); blue's router drains and
   stops;
4. blue's remaining engines, which no router reaches any more, stop;
5. green grows to the whole inventory on blue's room (live adds, each pair probed), then
   green's router moves home (the swap again, to the place compose.yaml names).
A green that fails before the switch (an engine that does not start, a pair, the proof, the
gate) is removed: the drained half comes back from the compose file `up` kept
(pair_guard.PREVIOUS_COMPOSE) and is registered with blue's router again; `up` exits 1."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from pdboot.deploy.admin import AdminFetch
from pdboot.deploy.down import stop_remove
from pdboot.deploy.drain import DrainResult
from pdboot.deploy.pair_guard import PREVIOUS_COMPOSE, holds
from pdboot.deploy.readiness import find_container
from pdboot.deploy.router_api import RouterApiError, RouterWorkerApi, worker_of
from pdboot.deploy.router_swap import RouterSwapError, SwapContext, swap_router
from pdboot.deploy.seams import OP_DEADLINE
from pdboot.events import Emit, Note
from pdboot.inventory.schema import TIERS, Inventory, TierName
from pdboot.plan.converge import Observed, Step
from pdboot.plan.model import Plan, Service
from pdboot.transport.hosts import Hosts
from pdboot.transport.http import HttpFn
from pdboot.verify.gate import run_gate
from pdboot.verify.kv_proof import prove_kv
from pdboot.verify.pairs import check_pairs


class BlueGreenFailed(Exception):
    """Green failed before clients reached it; blue serves again. Reported."""


class Ops(Protocol):
    """What `up` lends (deploy/service_ops.ServiceOps)."""

    def start(self, steps: list[Step]) -> None: ...

    def wait(self, services: list[Service], *, router: bool) -> None: ...

    def drain(self, url: str, pullers: Sequence[str]) -> DrainResult: ...

    def observe(self, only: Sequence[str] | None = None) -> list[Observed]: ...


class BlueGreen:
    def __init__(
        self,
        inv: Inventory,
        plan: Plan,
        hosts: Hosts,
        ops: Ops,
        emit: Emit,
        fetch: HttpFn,
        headers: Mapping[str, str],
        project_dir: str,
        previous: Mapping[str, str],
    ) -> None:
        """``fetch``: pdboot's plain HTTP function (each router is reached through the
        router host's connection by an AdminFetch of its own)."""
        self.inv, self.plan, self.hosts, self.ops, self.emit = inv, plan, hosts, ops, emit
        self.fetch, self.headers, self.dir = fetch, headers, project_dir
        self.previous = previous  # host -> the compose.yaml that ran (pair_guard.keep_previous)
        self.green: list[Service] = []  # green's first engines (proven before the switch)

    # ---- the whole change

    def run(self, steps: Sequence[Step]) -> None:
        engines = [s for s in steps if s.service.is_engine and not s.service.headless]
        blue = {t: sorted((s for s in engines if _runs(s) and s.service.role == t), key=_key)
                for t in TIERS}  # fmt: skip
        freed = {t: blue[t][len(blue[t]) - len(blue[t]) // 2 :] for t in TIERS}
        gone = [s for t in TIERS for s in freed[t]]
        # green's first engines take exactly the freed engines' places (same host, name,
        # ports, GPUs or cores); another engine on the same host is blue's and still serves
        first = [s for s in engines if s in gone]
        rest = [s for s in engines if s not in first]
        self.say(1, f"drain and stop half of each blue tier: {_keys(gone)}")
        self.take_out(gone, blue_router=True)
        self.say(2, f"start green on the freed room: {_keys(first)}")
        self.green = [s.service for s in first]
        try:
            self.start_green(first)
            spare = self.ctx(first)
            swap_router(spare, self.plan.router, to="spare", check=self.prove)
        except (BlueGreenFailed, RouterSwapError) as e:
            self.emit(Note(f"error: blue/green: green failed before any client reached it: {e}",
                           "error"))  # fmt: skip
            self.undo(first, gone)
            raise BlueGreenFailed(str(e)) from None
        self.say(3, "the proxy forwards to green's router; blue's router drained and stopped")
        kept = [s for s in engines if s not in gone and _runs(s)]
        self.say(4, f"blue's remaining engines stop: {_keys(kept)}")
        self.stop([s for s in kept])
        self.say(5, f"green grows to the whole inventory: {_keys(rest)}")
        self.grow(rest, spare)
        swap_router(self.ctx(engines), self.plan.router, to="home")
        self.emit(Note("blue/green: done; green's router is home again"))

    def say(self, n: int, what: str) -> None:
        self.emit(Note(f"blue/green phase {n}: {what}"))

    def ctx(self, green: Sequence[Step]) -> SwapContext:
        workers: dict[str, TierName] = {}
        for s in green:
            w = worker_of(s.service)
            if w is not None:
                workers[w[0]] = w[1]
        return SwapContext(
            self.inv, self.plan, self.hosts, self.fetch, self.emit, workers,
            model_id=self.plan.served_model_name,
        )  # fmt: skip

    # ---- pieces

    def take_out(self, steps: Sequence[Step], *, blue_router: bool) -> None:
        """Deregister from blue's router, drain, stop (the freed half)."""
        api = RouterWorkerApi(self.plan.router.url, AdminFetch(self.plan, self.hosts, self.fetch))
        decodes = [s.service.url for s in steps if s.service.role == "decode"]
        for s in steps:
            if blue_router:
                with contextlib.suppress(RouterApiError):
                    api.remove(s.service.url)
            pullers = [u for u in _decode_urls(self.plan) if u not in decodes]
            r = self.ops.drain(s.service.url, pullers if s.service.role == "prefill" else ())
            self.emit(Note(f"blue/green: {s.service.key} drained: {r.describe()}"))
        self.stop(steps)

    def stop(self, steps: Sequence[Step]) -> None:
        observed = self.ops.observe(sorted({s.service.host for s in steps}))
        found = [find_container(observed, self.plan.deployment, s.service) for s in steps]
        stop_remove(
            self.hosts, [o for o in found if o is not None], self.emit, self.plan.stop_grace_s
        )

    def start_green(self, first: Sequence[Step]) -> None:
        try:
            self.ops.start([replace(s, kind="create") for s in first])
            self.ops.wait([s.service for s in first], router=False)
        except Exception as e:  # the wait reported the engine's logs; undo below
            keys = ", ".join(s.service.key for s in first)
            raise BlueGreenFailed(f"a green engine of {keys} did not start (above)") from e
        self.pairs([s.service for s in first], [])

    def pairs(self, joining: list[Service], serving: list[Service]) -> None:
        checks = check_pairs(self.plan, self.fetch, self.headers, joining, serving)
        for c in checks:
            self.emit(Note(f"blue/green pair {c.describe()}"))
        failed = [c for c in checks if not c.ok]
        if failed:
            raise BlueGreenFailed(f"green pair {failed[0].describe()}")

    def prove(self, router: Service, fetch: HttpFn) -> None:
        """Green on its own router, before the proxy moves: the KV proof and the gate."""
        green = replace(self.plan, router=router, proxy=None)
        proof = prove_kv(green, fetch, self.headers)
        v = proof.verdict
        if v is None or not v.ok:
            why = proof.failure if v is None else v.message
            raise RouterSwapError(f"green's KV proof failed: {why}")
        self.emit(Note(f"blue/green: green's KV proof: {v.message}"))
        decode = next(s for s in self.green if s.role == "decode")  # never blue's build

        def post(url: str, body: dict[str, object]) -> tuple[int, str]:
            a = fetch(url, body=body, timeout=300.0, headers=dict(self.headers))
            return a.status, a.body if a.status else a.error

        gate = run_gate(post, router.url, decode.url, self.plan.served_model_name)
        if not gate.ok:
            raise RouterSwapError(f"green's correctness gate failed: {gate.message()}")
        self.emit(Note(f"blue/green: green's correctness gate: {gate.message()}"))

    def grow(self, rest: Sequence[Step], spare_ctx: SwapContext) -> None:
        if not rest:
            return
        self.ops.start([replace(s, kind="create") for s in rest])
        self.ops.wait([s.service for s in rest], router=False)
        serving = [s for s in self.plan.services() if s.is_engine and not s.headless]
        joining = [s.service for s in rest]
        self.pairs(joining, [s for s in serving if s not in joining])
        spare = spare_ctx.placed(self.plan.router, "spare")
        api = RouterWorkerApi(
            spare.url, spare_ctx.admin(spare), model_id=self.plan.served_model_name
        )
        for s in rest:
            w = worker_of(s.service)
            if w is None:
                continue
            try:
                api.add(*w)
            except RouterApiError as e:  # green serves on what it has; `up` stops and says so
                why = f"cannot register {s.service.key} with green's router: {e}"
                raise BlueGreenFailed(why) from e
            self.emit(Note(f"blue/green: {s.service.key} registered with green's router"))

    def undo(self, first: Sequence[Step], gone: Sequence[Step]) -> None:
        """Green removed; the drained half back in its old configuration, registered."""
        self.stop(first)
        api = RouterWorkerApi(
            self.plan.router.url,
            AdminFetch(self.plan, self.hosts, self.fetch),
            model_id=self.plan.served_model_name,
        )
        back = [s for s in gone if holds(self.previous, s)]
        for s in gone:
            if s not in back:
                self.emit(Note(f"blue/green: {s.service.key}: no kept compose file holds what ran"))
        gone = back
        for s in gone:
            link = self.hosts.links[s.service.host]
            link.engine.compose_up(
                self.dir, self.plan.hosts[s.service.host].project, s.service.name,
                recreate=True, timeout=OP_DEADLINE, file=PREVIOUS_COMPOSE,
            )  # fmt: skip
        self.ops.wait([s.service for s in gone], router=False)
        for s in gone:
            w = worker_of(s.service)
            if w is not None:
                with contextlib.suppress(RouterApiError):
                    api.add(*w)
            self.emit(Note(f"blue/green: {s.service.key} back in its old configuration"))


def _runs(s: Step) -> bool:
    return s.current is not None and s.current.running


def _key(s: Step) -> str:
    return s.service.key


def _keys(steps: Sequence[Step]) -> str:
    return ", ".join(s.service.key for s in steps) or "none"


def _decode_urls(plan: Plan) -> list[str]:
    return [s.url for s in plan.services() if s.role == "decode" and not s.headless]


Check = Callable[[Service, HttpFn], None]
__all__ = ["BlueGreen", "BlueGreenFailed", "Check"]
