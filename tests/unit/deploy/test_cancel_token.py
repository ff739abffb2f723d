"""The frame's cancellation token (pdboot/deploy/frame.py): a lost deployment lock cancels
it with the lock's reason; `up`, `down` and `stage` check it at their step boundaries and
in the threads they start (the pulls), and end with the lock's error, exit 1 and a `done`
event, doing nothing further. Driven through the fakes of test_orchestrator."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from pdboot import events as ev
from pdboot.deploy.frame import Cancelled, CancelToken, Frame, LockSpec, run_framed
from pdboot.deploy.up import up
from pdboot.deploy.up_options import UpOptions
from pdboot.exitcodes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from pdboot.inventory.schema import Inventory
from tests.unit.deploy.test_rollout import deployed
from tests.unit.deploy.test_rollout import inv as roll_inv
from tests.unit.orchestrator_fakes import Recorder, World, inventory

LOST = "no heartbeat reached r for 21s (test)"


@dataclass
class Lock:
    """A HeldLock that counts as lost once ``lost()`` says so."""

    lost: Callable[[], bool]
    released: list[str]

    def release(self) -> None:
        self.released.append("release")

    @property
    def lost_reason(self) -> str | None:
        return LOST if self.lost() else None


def test_the_token_reads_the_locks_loss_and_keeps_it() -> None:
    flag = [False]
    token = CancelToken(Lock(lambda: flag[0], []))
    token.check()  # not lost: nothing happens
    assert token.reason is None
    flag[0] = True
    with pytest.raises(Cancelled) as got:
        token.check()
    assert got.value.reason == LOST
    flag[0] = False  # a lost lock stays lost for the run, as lock_holder's does
    assert token.reason == LOST
    seen: list[ev.Event] = []
    with pytest.raises(Cancelled):
        token.checking(seen.append)(ev.Note("x"))
    assert seen == []  # a checking emit stops before the event
    free = CancelToken()
    free.checking(seen.append)(ev.Note("x"))
    assert len(seen) == 1 and free.reason is None
    free.cancel("asked")
    with pytest.raises(Cancelled, match="asked"):
        free.check()


def test_a_thread_started_by_the_command_sees_the_token_too() -> None:
    """Not only the main thread or threads of a given name: any thread that checks it."""
    flag = [True]
    token = CancelToken(Lock(lambda: flag[0], []))
    out: list[BaseException] = []

    def work() -> None:
        try:
            token.check()
        except Cancelled as e:
            out.append(e)

    t = threading.Thread(target=work, name="not-pdboot")
    t.start()
    t.join()
    assert len(out) == 1 and isinstance(out[0], Cancelled)


def _framed(world: World, body: Callable[[Frame], int], lock: Lock) -> tuple[int, Recorder]:
    rec = Recorder()

    def factory(*_a: object) -> Lock:
        return lock

    code = run_framed(
        "up", world.inv, rec, body, lock_spec=LockSpec(factory), accept_new=False,
        hosts_factory=world.hosts, clock=world.clock,
        summary=lambda c, _t: "ok" if c == EXIT_OK else "",
    )  # fmt: skip
    return code, rec


def test_the_frame_turns_a_cancel_into_the_locks_error_exit_1_and_one_done() -> None:
    world = World(inventory())
    released: list[str] = []
    flag = [False]
    closed: list[str] = []

    def body(frame: Frame) -> int:
        frame.open(["p1", "d1"])
        frame.at_close(lambda h: closed.append(",".join(sorted(h.links))))
        frame.token.check()
        flag[0] = True  # the heartbeat gives up here
        frame.token.check()
        raise AssertionError("not reached")  # pragma: no cover

    code, rec = _framed(world, body, Lock(lambda: flag[0], released))
    assert code == EXIT_FAILED
    (err,) = [n for n in rec.of(ev.Note) if n.level == "error"]
    assert "deployment lock on r was lost" in err.message and LOST in err.message
    assert "`up` stopped before its next step" in err.message
    done = rec.events[-1]
    assert done == ev.Done("up", EXIT_FAILED, done.seconds, f"up failed after {done.seconds:.1f}s")  # type: ignore[attr-defined]
    assert released == ["release"] and closed == ["d1,p1"]


def test_the_frame_turns_ctrl_c_into_130_and_a_done_event() -> None:
    world = World(inventory())
    released: list[str] = []

    def body(frame: Frame) -> int:
        frame.open(["p1"])
        raise KeyboardInterrupt

    code, rec = _framed(world, body, Lock(lambda: False, released))
    assert code == EXIT_INTERRUPTED == 130
    assert isinstance(rec.events[-1], ev.Done) and rec.events[-1].exit_code == 130
    assert released == ["release"]


def _up(world: World, inv: Inventory, lock: Lock) -> tuple[int, Recorder]:
    rec = Recorder()

    def factory(*_a: object) -> Lock:
        return lock

    code = up(
        inv, UpOptions(skip_preflight=True), rec, clock=world.clock, hosts_factory=world.hosts,
        fetch=world.fetch, lock_factory=factory,
    )  # fmt: skip
    return code, rec


def test_a_lock_lost_during_the_pulls_stops_each_hosts_pull_thread() -> None:
    """The pull threads check the token at each progress report: the pulls stop there, and
    `up` ends with the lock's error, not with a failed pull."""
    world = World(inventory())
    released: list[str] = []
    lock = Lock(lambda: any(op == "pull" for op, _h, _w in world.calls), released)
    code, rec = _up(world, world.inv, lock)
    assert code == EXIT_FAILED
    assert [op for op, _h, _w in world.calls if op == "pull"]  # the pulls began
    assert not rec.of(ev.PullDone) and not rec.of(ev.HostErrors)  # stopped, not failed
    assert not [c for c in world.calls if c[0] in ("ship", "compose_up")]
    err = [n for n in rec.of(ev.Note) if n.level == "error"]
    assert len(err) == 1 and "deployment lock on r was lost" in err[0].message
    assert isinstance(rec.events[-1], ev.Done) and rec.events[-1].exit_code == 1
    assert released == ["release"]


def test_a_lock_lost_mid_roll_stops_at_the_next_step_and_registers_nothing() -> None:
    """Lost while the first engine is replaced: no further roll step, no re-registration of
    what serves (another run may own the deployment now), the lock's error, exit 1."""
    world = deployed()
    world.inv = roll_inv("v0.33.0-rebuild")  # the same build, retagged: it rolls
    started = world.clock.now()
    released: list[str] = []
    lock = Lock(lambda: world.clock.now() >= started + 1.0, released)
    code, rec = _up(world, world.inv, lock)
    assert code == EXIT_FAILED
    ups = [w + "@" + h for op, h, w in world.calls if op == "compose_up"]
    assert ups == ["prefill@p1"]  # step 1 began; step 2 never did
    assert [p.phase for p in rec.of(ev.RollProgress)].count("done") == 0
    assert not rec.of(ev.RollStopped)  # nothing re-registered after the loss
    posts = [w for op, m, w in world.calls if op == "router" and m == "POST"]
    assert posts == []
    err = [n for n in rec.of(ev.Note) if n.level == "error"]
    assert err and "deployment lock on r was lost" in err[-1].message
    assert isinstance(rec.events[-1], ev.Done) and rec.events[-1].exit_code == 1
    assert released == ["release"]
