"""The degraded upgrade's plan (deploy/tier_upgrade.upgrade_steps), a tier of one per side,
as the executor gets it: with a proxy every degraded phase is served through the spare
router, so no client reaches a router whose list is between the two calls of a P/D pair."""

from __future__ import annotations

from pdboot.deploy.executor import Action
from pdboot.deploy.router_swap import DrainRouter, PointProxy, RouterReady, StartRouter
from pdboot.deploy.tier_upgrade import (
    RegisterAnew,
    ReplaceTier,
    ServeFrom,
    Serving,
    upgrade_steps,
)
from pdboot.deploy.waits import MonotonicClock
from pdboot.plan.build import build_plan
from pdboot.plan.converge import Observed, Step
from pdboot.plan.model import Plan
from pdboot.transport.http import http
from tests.unit.builders import inventory


def steps_of(p: Plan) -> list[Action]:
    engines = [s for s in p.services() if s.is_engine]
    running = [
        Step(s, "recreate", Observed(s.host, "id", s.container_name, dict(s.labels), "running"))
        for s in engines
    ]
    return upgrade_steps(p, running, [], Serving(MonotonicClock()), http, {})


def router_moves(steps: list[Action]) -> list[str]:
    """The steps that touch a router or the proxy, and the tier replacements, in order."""
    out = []
    for s in steps:
        if isinstance(s, StartRouter):
            out.append(f"start {s.to}")
        elif isinstance(s, RouterReady):
            out.append(f"ready {s.to} {sorted(t for _u, t in s.workers or ())}")
        elif isinstance(s, PointProxy):
            out.append(f"proxy -> {s.to}")
        elif isinstance(s, ServeFrom):
            out.append(f"serve {s.phase.mode} on {s.place}")
        elif isinstance(s, RegisterAnew):
            out.append("register anew on home")
        elif isinstance(s, DrainRouter):
            out.append(f"drain {s.place}")
        elif isinstance(s, ReplaceTier):
            out.append(f"replace {s.tier}")
    return out


def test_the_degraded_phases_run_on_the_spare_router_and_pd_returns_home() -> None:
    assert router_moves(steps_of(build_plan(inventory()))) == [
        "start spare",
        "ready spare []",
        "serve decode_only on spare",
        "proxy -> spare",
        "replace prefill",
        "serve prefill_only on spare",
        "replace decode",
        "register anew on home",
        "ready home ['decode', 'prefill']",
        "proxy -> home",
        "serve pd on home",
        "drain spare",
    ]


def test_the_home_router_is_never_switched_while_clients_reach_it() -> None:
    """Between the proxy leaving home and coming back, only the spare's list changes; home's
    list changes only then (registered anew, then checked healthy)."""
    moves = router_moves(steps_of(build_plan(inventory())))
    away, back = moves.index("proxy -> spare"), moves.index("proxy -> home")
    assert not any(m.endswith("on home") for m in moves[:away])
    assert moves.index("register anew on home") < back
    assert all("on spare" not in m for m in moves[back:])
