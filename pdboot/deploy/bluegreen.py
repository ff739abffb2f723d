"""Blue/green for a change that breaks NIXL compatibility (plan/upgrade.py decides, this
module plans it as the executor's steps, executor.py runs them): old (blue) and new (green)
engines never pair, and clients never meet green before it is proven.

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
gate) is undone by the steps' recorded inverses: green's router and engines removed, the
drained half back from the compose file `up` kept (steps.RestorePrevious, as a roll's pair
guard does) and registered with blue's router again; `up` exits 1.

With router.standby the standby's router follows (executor.Routers): blue's engines leave it
as they leave blue's router, and green's join it once blue's last engine has stopped."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from pdboot.deploy.executor import Action, Run
from pdboot.deploy.router_api import worker_of
from pdboot.deploy.router_swap import RouterSwapError, swap_steps
from pdboot.deploy.steps import (
    Deregister,
    Drain,
    Register,
    RemoveServices,
    RestorePrevious,
    Say,
    StartServices,
    WaitServices,
)
from pdboot.events import Emit, Note
from pdboot.inventory.schema import TIERS, TierName
from pdboot.plan.converge import Step
from pdboot.plan.model import Plan, Service
from pdboot.transport.http import HttpFn
from pdboot.verify.gate import run_gate
from pdboot.verify.kv_proof import prove_kv
from pdboot.verify.pairs import check_pairs


class BlueGreenFailed(Exception):
    """Green failed before clients reached it; blue serves again. Reported."""


class BlueGreen:
    def __init__(self, plan: Plan, fetch: HttpFn, headers: Mapping[str, str], emit: Emit) -> None:
        """``fetch``: pdboot's HTTP function for the engines (the pair probes); each router
        is reached through the router host's connection by the swap's own AdminFetch."""
        self.plan, self.fetch, self.headers, self.emit = plan, fetch, headers, emit
        self.green: list[Service] = []  # green's first engines (proven before the switch)

    def steps(self, steps: Sequence[Step]) -> list[Action]:
        """The whole change as the executor's steps (pure, but for ``prove``, the check it
        hands the swap)."""
        engines = [s for s in steps if s.service.is_engine and not s.service.headless]
        blue = {t: sorted((s for s in engines if _runs(s) and s.service.role == t), key=_key)
                for t in TIERS}  # fmt: skip
        freed = {t: blue[t][len(blue[t]) - len(blue[t]) // 2 :] for t in TIERS}
        gone = [s for t in TIERS for s in freed[t]]
        # green's first engines take exactly the freed engines' places (same host, name,
        # ports, GPUs or cores); another engine on the same host is blue's and still serves
        first = [s for s in engines if s in gone]
        rest = [s for s in engines if s not in first]
        kept = [s for s in engines if s not in gone and _runs(s)]
        self.green = [s.service for s in first]
        router = self.plan.router
        out: list[Action] = [_say(1, f"drain and stop half of each blue tier: {_keys(gone)}")]
        out += self.take_out(gone)
        out.append(RemoveServices(_services(gone), undo=RestorePrevious(tuple(gone))))
        out += [
            # what undoes the phase: green's first engines removed
            Say(_phase(2, f"start green on the freed room: {_keys(first)}"),
                undo=RemoveServices(_services(first))),
            StartServices(tuple(replace(s, kind="create") for s in first)),
            WaitServices(_services(first)),
            self.pairs(_services(first), ()),
            *swap_steps(router, "spare", check=self.prove, workers=_workers(first)),
            _say(3, "the proxy forwards to green's router; blue's router drained and stopped"),
            _say(4, f"blue's remaining engines stop: {_keys(kept)}"),
        ]  # fmt: skip
        # the standby's router serves blue's engines until they stop, then green's
        out += [Deregister(w[0], w[1], quiet=True) for w in _each_worker(kept)]
        out.append(RemoveServices(_services(kept)))
        out += [Register(w[0], w[1], where="standby") for w in _each_worker(first)]
        out.append(_say(5, f"green grows to the whole inventory: {_keys(rest)}"))
        if rest:
            joining = _services(rest)
            serving = tuple(s for s in _workers_of(self.plan) if s not in joining)
            out += [
                StartServices(tuple(replace(s, kind="create") for s in rest)),
                WaitServices(joining),
                self.pairs(joining, serving),
            ]
            out += [
                Register(w[0], w[1], where="spare", label=f"{s.service.key} registered with "
                         "green's router")
                for s in rest if (w := worker_of(s.service)) is not None
            ]  # fmt: skip
        return [
            *out,
            *swap_steps(router, "home", workers=_workers(engines)),
            Say("blue/green: done; green's router is home again"),
        ]

    def take_out(self, gone: Sequence[Step]) -> list[Action]:
        """Deregister from blue's router (a refusal is no failure), drain (a prefill: until
        the decodes that stay have pulled their KV)."""
        decodes = {s.service.url for s in gone if s.service.role == "decode"}
        pullers = tuple(u for u in _decode_urls(self.plan) if u not in decodes)
        out: list[Action] = []
        for s in gone:
            w = worker_of(s.service)
            if w is not None:
                out.append(Deregister(w[0], w[1], quiet=True))
            prefill = s.service.role == "prefill"
            out.append(Drain(s.service.url, pullers if prefill else (), label=s.service.key))
        return out

    def pairs(self, joining: tuple[Service, ...], serving: tuple[Service, ...]) -> GreenPairs:
        return GreenPairs(joining, serving, self.fetch, tuple(self.headers.items()))

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


@dataclass(frozen=True)
class GreenPairs:
    """Every pair the joining green engines make with green's serving ones moves KV."""

    joining: tuple[Service, ...]
    serving: tuple[Service, ...]
    fetch: HttpFn
    headers: tuple[tuple[str, str], ...] = ()
    commits = False

    def describe(self) -> str:
        return f"probe green's pairs of {', '.join(s.key for s in self.joining)}"

    def run(self, run: Run) -> Action | None:
        checks = check_pairs(
            run.plan, self.fetch, dict(self.headers), list(self.joining), list(self.serving)
        )
        for c in checks:
            run.emit(Note(f"blue/green pair {c.describe()}"))
        failed = [c for c in checks if not c.ok]
        if failed:
            raise BlueGreenFailed(f"green pair {failed[0].describe()}")
        return None


def _phase(n: int, what: str) -> str:
    return f"blue/green phase {n}: {what}"


def _say(n: int, what: str) -> Say:
    return Say(_phase(n, what))


def _runs(s: Step) -> bool:
    return s.current is not None and s.current.running


def _key(s: Step) -> str:
    return s.service.key


def _keys(steps: Sequence[Step]) -> str:
    return ", ".join(s.service.key for s in steps) or "none"


def _services(steps: Sequence[Step]) -> tuple[Service, ...]:
    return tuple(s.service for s in steps)


def _each_worker(steps: Sequence[Step]) -> list[tuple[str, TierName]]:
    return [w for s in steps if (w := worker_of(s.service)) is not None]


def _workers(steps: Sequence[Step]) -> dict[str, TierName]:
    return dict(_each_worker(steps))


def _workers_of(plan: Plan) -> list[Service]:
    return [s for s in plan.services() if s.is_engine and not s.headless]


def _decode_urls(plan: Plan) -> list[str]:
    return [s.url for s in plan.services() if s.role == "decode" and not s.headless]


__all__ = ["BlueGreen", "BlueGreenFailed", "GreenPairs"]
