"""One change plan per `up` (pdboot/plan/change_plan.py): converge runs once and the plan is
built once per `up`, and `up --plan` computes the very value `up` then acts on, on a fresh
deployment, a roll, the recreate path (--no-rolling, static router lists) and a removed
host. Driven through the fakes of test_orchestrator."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pdboot import events as ev
from pdboot.deploy.up_options import UpOptions
from pdboot.inventory.schema import Inventory
from pdboot.plan import build, change_plan, converge
from pdboot.plan.change_plan import ChangePlan
from tests.unit.deploy.test_rollout import deployed
from tests.unit.deploy.test_rollout import inv as roll_inv
from tests.unit.orchestrator_fakes import World, inventory, run_up


def _count(monkeypatch: pytest.MonkeyPatch, original: Callable[..., Any]) -> list[int]:
    """Every pdboot module's binding of ``original`` wrapped to count its calls (the test
    fakes' own calls, under tests/, are not counted)."""
    calls = [0]

    def counted(*a: Any, **k: Any) -> Any:
        calls[0] += 1
        return original(*a, **k)

    for name, mod in list(sys.modules.items()):
        if name.startswith("pdboot") and getattr(mod, original.__name__, None) is original:
            monkeypatch.setattr(mod, original.__name__, counted)
    return calls


@pytest.fixture
def computed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ChangePlan]]:
    """Each change plan computed, in order, whoever computed it."""
    out: list[ChangePlan] = []
    original = change_plan.change_plan

    def keep(*a: Any, **k: Any) -> ChangePlan:
        value = original(*a, **k)
        out.append(value)
        return value

    for name, mod in list(sys.modules.items()):
        if name.startswith("pdboot") and getattr(mod, "change_plan", None) is original:
            monkeypatch.setattr(mod, "change_plan", keep)
    yield out


def test_converge_runs_once_and_the_plan_is_built_once_per_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = deployed()
    world.inv = roll_inv("v0.33.0-rebuild", decode="d1, d2, d3")
    converged = _count(monkeypatch, converge.plan_up)
    restarts = _count(monkeypatch, converge.decode_restarts)
    built = _count(monkeypatch, build.build_plan)
    code, rec = run_up(world)
    assert code == 0 and len(rec.of(ev.RollPlanned)) == 5  # a real roll happened
    assert converged == [1] and restarts == [1] and built == [1]


@pytest.mark.parametrize("opts", [UpOptions(skip_preflight=True, rolling=False),
                                  UpOptions(skip_preflight=True, rollback=True)])  # fmt: skip
def test_the_recreate_path_converges_once_too(
    monkeypatch: pytest.MonkeyPatch, opts: UpOptions
) -> None:
    world = deployed()
    world.inv = roll_inv("v0.33.0-rebuild")
    converged = _count(monkeypatch, converge.plan_up)
    built = _count(monkeypatch, build.build_plan)
    code, rec = run_up(world, opts)
    assert code == 0 and next(s.action for s in rec.of(ev.RollPlanned)) == "together"
    assert converged == [1] and built == [1]


def _plan_then_up(
    world: World, opts: UpOptions, computed: list[ChangePlan], inv: Inventory | None = None
) -> tuple[ChangePlan, ChangePlan, list[ev.Event], list[ev.Event]]:
    computed.clear()  # what deployed() computed
    code, shown = run_up(world, UpOptions(**{**opts.__dict__, "plan_only": True}), inv)
    assert code == 0 and len(computed) == 1
    code, done = run_up(world, opts, inv)
    assert code == 0 and len(computed) == 2
    return computed[0], computed[1], shown.events, done.events


def _actions(events: list[ev.Event]) -> list[tuple[Any, ...]]:
    """The converge table and the roll steps: the events right after the stage that shows
    them (`plan` for --plan, `converge` for up), up to the first that is neither."""
    start = next(
        i for i, e in enumerate(events)
        if isinstance(e, ev.StageStarted) and e.stage in ("plan", "converge")
    )  # fmt: skip
    rows: list[tuple[Any, ...]] = []
    for e in events[start + 1 :]:
        if not isinstance(e, ev.ServiceAction | ev.RollPlanned):
            break
        if isinstance(e, ev.ServiceAction):
            rows.append((e.service, e.action, e.reason))
        elif isinstance(e, ev.RollPlanned):
            rows.append((e.number, e.action, e.services, e.capacity, e.endpoint_up))
    return rows


@pytest.mark.parametrize(
    "change, opts",
    [
        ("fresh", UpOptions(skip_preflight=True)),
        ("image", UpOptions(skip_preflight=True)),
        ("image", UpOptions(skip_preflight=True, rolling=False)),
        ("removed", UpOptions(skip_preflight=True)),
        ("added", UpOptions(skip_preflight=True, rollback=True)),
    ],
)
def test_up_plan_and_up_compute_the_same_change_plan(
    computed: list[ChangePlan], change: str, opts: UpOptions
) -> None:
    if change == "fresh":
        world = World(roll_inv())
    else:
        world = deployed()
        world.inv = {
            "image": roll_inv("v0.33.0-rebuild"),
            "removed": roll_inv(prefill="p1"),
            "added": roll_inv(decode="d1, d2, d3"),
        }[change]
    planned, acted, shown, done = _plan_then_up(world, opts, computed)
    assert planned == acted  # the one value, equal field by field
    assert planned.rolls == (opts.rolling and not opts.rollback)
    assert planned.changes
    # and what `up --plan` printed is what `up` showed before it acted
    assert _actions(shown) == _actions(done) and _actions(shown)


def test_a_static_router_list_plans_and_acts_the_same(computed: list[ChangePlan]) -> None:
    static = {"router.live_workers": False}
    world = World(inventory(static))
    assert run_up(world)[0] == 0  # no live workers: the recreate path, the router recreated
    world.inv = inventory({**static, "decode.env": {"X": "1"}})
    planned, acted, _shown, _done = _plan_then_up(world, UpOptions(skip_preflight=True), computed)
    assert planned == acted and not planned.rolls
    assert [s.kind for s in planned.router] == ["recreate"]


def test_a_new_build_with_a_tier_of_one_converges_once_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through degraded mode (old and new vLLM builds must never pair; no half for
    blue/green): the one converge's steps, tier by tier, not a second converge."""
    world = World(roll_inv(prefill="p1", decode="d1"))
    assert run_up(world)[0] == 0
    world.running_version = "0.33.0"
    world.inv = roll_inv("v0.34.0", prefill="p1", decode="d1")
    converged = _count(monkeypatch, converge.plan_up)
    code, rec = run_up(world)
    assert code == 0 and not rec.of(ev.RollPlanned)
    assert any("degraded upgrade phase 6" in n.message for n in rec.of(ev.Note))
    assert converged == [1]
