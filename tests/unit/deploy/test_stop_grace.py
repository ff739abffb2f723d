"""`down` gives Docker the engines' stop grace (beyond their --shutdown-timeout, which is
timeouts.drain_seconds), not Docker's 10 s or the old fixed 30 s, so vLLM's own wait for its
requests in flight ends before Docker's SIGKILL (plan/vllm_args.py)."""

from __future__ import annotations

from pdboot.plan.build import build_plan
from pdboot.plan.vllm_args import STOP_MARGIN_S
from tests.unit.orchestrator_fakes import Recorder, World, inventory, run_down, run_up


def test_down_stops_every_container_with_the_engines_grace() -> None:
    world = World(inventory())
    code, _ = run_up(world)
    assert code == 0 and world.containers
    assert run_down(world, Recorder()) == 0
    assert not world.containers
    grace = build_plan(world.inv).stop_grace_s
    assert grace == world.inv.timeouts.drain_seconds + STOP_MARGIN_S
    assert world.graces and set(world.graces) == {grace}
