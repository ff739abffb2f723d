"""up, down and stage when the deployment lock is lost (issue 18, item 1), driven with the fake
world of tests/unit/orchestrator_fakes.py. The lock's own heartbeat and takeover scripts:
tests/unit/transport/test_lock_heartbeat_and_takeover.py."""

from __future__ import annotations

from pdboot import events as ev
from pdboot.deploy.down import DownOptions, down
from pdboot.deploy.up import UpOptions
from tests.unit.orchestrator_fakes import Recorder, World, inventory, up_in


def test_up_stops_before_its_next_step_when_the_lock_is_lost() -> None:
    """Lost during the engine wait (which uses HTTP, not SSH): the router is never
    started, nothing is rolled back or removed, exit 1 with a message naming the lock."""
    world = World(inventory(), load={"decode": 30.0, "prefill": 30.0})
    world.lock_lost_at = 10.0
    rec = Recorder()
    code = up_in(world, UpOptions(skip_preflight=True, rollback=True), rec)
    assert code == 1
    started = [w for op, _h, w in world.calls if op == "compose_up"]
    assert "router" not in started and started  # engines started, the router never
    assert not rec.of(ev.Rollback) and not any(op == "remove" for op, _h, _w in world.calls)
    err = [n for n in rec.of(ev.Note) if n.level == "error"]
    assert err and "deployment lock on r was lost" in err[-1].message
    assert "pdboot status" in err[-1].message
    assert world.clock.now() < 12.0  # stopped within a poll or two of the loss
    assert isinstance(rec.events[-1], ev.Done) and rec.events[-1].exit_code == 1
    assert world.locks == ["take up", "release up"]


def test_down_stops_when_the_lock_is_lost_at_once() -> None:
    world = World(inventory())
    world.lock_lost_at = 0.0
    rec = Recorder()
    code = down(
        world.inv, DownOptions(purge=True), rec, hosts_factory=world.hosts,
        lock_factory=world.take_lock,
    )  # fmt: skip
    assert code == 1
    assert any("was lost" in n.message for n in rec.of(ev.Note))


def test_stage_stops_when_the_lock_is_lost_at_once() -> None:
    # pdboot stage holds the lock as up does (deploy/stage.py in the frame of deploy/frame.py)
    from pdboot.deploy.stage import stage

    world = World(inventory())
    world.lock_lost_at = 0.0
    rec = Recorder()
    code = stage(world.inv, rec, hosts_factory=world.hosts, fetch=world.fetch,
                 lock_factory=world.take_lock)  # fmt: skip
    assert code == 1
    assert any("deployment lock on r was lost" in n.message for n in rec.of(ev.Note))
    assert world.locks == ["take stage", "release stage"]
