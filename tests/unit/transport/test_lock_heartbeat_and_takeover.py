"""The deployment lock's heartbeat and takeover (issue 18, items 1-4): when it is lost, when a
takeover fails, when two runs race for an ownerless lock, and behind a login shell that prints.
The scripts run in real bash on a temporary directory (the same scripts the hosts run over SSH);
what up, down and stage do when the lock is lost: tests/unit/deploy/test_lock_lost.py."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from pdboot.transport import lock, lock_holder
from pdboot.transport.connection import CommandResult, LocalConnection, RemoteError
from tests.lock_race import race_for_lock

OWNER = lock.Owner("ana", "laptop-1", 4242, "a1b2c3d4", "up", "2026-11-30T20:00:00+00:00")


class Counting(LocalConnection):
    """Real bash; counts the remote calls (the review saw 200 in 2.5 s)."""

    def __init__(self, name: str = "ingress", prefix: str = "") -> None:
        super().__init__(name)
        self.calls = 0
        self.prefix = prefix  # a noisy login shell: printed before every command

    def run(
        self, cmd: Sequence[str] | str, timeout: float | None = None, stdin: str | None = None
    ) -> CommandResult:
        self.calls += 1
        line = cmd if isinstance(cmd, str) else " ".join(cmd)
        return super().run(self.prefix + line, timeout, stdin)


class Failing(LocalConnection):
    """A connection whose host went silent: every command fails like a dead link."""

    def __init__(self) -> None:
        super().__init__("ingress")
        self.closed = False

    def run(
        self, cmd: Sequence[str] | str, timeout: float | None = None, stdin: str | None = None
    ) -> CommandResult:
        raise RemoteError("ingress", "unreachable", "host ingress lost: no answer for 13s")

    def close(self) -> None:
        self.closed = True


def _stale(path: Path, owner: lock.Owner | None = OWNER) -> None:
    path.mkdir(parents=True)
    if owner is not None:
        (path / "owner").write_text(owner.text())
    past = time.time() - 120
    for p in (path / "owner", path):
        if p.exists():
            os.utime(p, (past, past))


# --------------------------------------------------------------------------- item 1


def test_the_lock_is_lost_after_silent_heartbeats_and_stays_lost(tmp_path: Path) -> None:
    path = str(tmp_path / "demo.lock")
    t = [0.0]
    conn = Counting()
    held = lock.acquire(conn, path, "up", say=lambda _m: None, clock=lambda: t[0])
    held._stop.set()  # drive the heartbeat by hand
    held.clock = lambda: t[0]
    assert held.beat_once() and held.lost_reason is None
    # the link drops: heartbeats fail; once LOST_AFTER_S passed without one, it is lost
    held.conn = Failing()
    t[0] = 5.0
    assert not held.beat_once() and held.lost_reason is None
    t[0] = lock_holder.LOST_AFTER_S + 0.5
    why = held.lost_reason
    assert why is not None and "no heartbeat reached ingress" in why
    assert (
        lock_holder.LOST_AFTER_S < lock_holder.STALE_AFTER_S
    )  # lost before anyone may take it over
    with pytest.raises(lock_holder.LockLost, match="was lost"):
        held.check()
    # the link comes back: a confirmed heartbeat does not make it ours again
    held.conn = conn
    assert not held.beat_once() and held.lost_reason == why


def test_the_heartbeat_reconnects_after_a_failure(tmp_path: Path) -> None:
    path = str(tmp_path / "demo.lock")
    fresh = Counting()
    dead = Failing()
    held = lock.acquire(Counting(), path, "up", say=lambda _m: None, reconnect=lambda: fresh)
    held._stop.set()
    held.conn = dead
    assert held.beat_once()  # fails, reopens, and beats again on the fresh connection
    assert held.conn is fresh and dead.closed and held.reconnects == 1
    assert held.lost_reason is None
    held.release()
    assert not os.path.exists(path)


def test_a_lock_taken_over_by_another_run_is_lost_at_the_next_beat(tmp_path: Path) -> None:
    path = tmp_path / "demo.lock"
    held = lock.acquire(Counting(), str(path), "up", say=lambda _m: None)
    held._stop.set()
    (path / "owner").write_text(OWNER.text())  # what a takeover and a fresh acquire leave
    assert not held.beat_once()
    assert "another run took it over" in (held.lost_reason or "")
    held.release()  # not ours: left alone
    assert (path / "owner").read_text() == OWNER.text()


# --------------------------------------------------------------------------- item 2


def test_a_failing_takeover_obeys_no_wait(tmp_path: Path) -> None:
    path = tmp_path / "demo.lock"
    _stale(path)
    # a same-name tombstone under 10 minutes old: the rename keeps failing
    (tmp_path / f"demo.lock.stale-{OWNER.run_id}").mkdir()
    (tmp_path / f"demo.lock.stale-{OWNER.run_id}" / "owner").write_text(OWNER.text())
    conn = Counting()
    said: list[str] = []
    t0 = time.monotonic()
    with pytest.raises(lock.LockBusy) as exc:
        lock.acquire(conn, str(path), "up", wait=False, say=said.append)
    assert time.monotonic() - t0 < 5 and conn.calls <= 3, conn.calls
    msg = str(exc.value)
    assert "taking it over failed" in msg and "Directory not empty" in msg and "--no-wait" in msg
    assert (path / "owner").read_text() == OWNER.text()  # untouched


def test_a_failing_takeover_sleeps_and_gives_up_after_wait_s(tmp_path: Path) -> None:
    path = tmp_path / "demo.lock"
    _stale(path)
    (tmp_path / f"demo.lock.stale-{OWNER.run_id}").mkdir()
    (tmp_path / f"demo.lock.stale-{OWNER.run_id}" / "owner").write_text(OWNER.text())
    t = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        t[0] += s

    conn = Counting()
    with pytest.raises(lock.LockBusy, match="gave up after waiting 10s"):
        lock.acquire(
            conn, str(path), "up", wait_s=10, say=lambda _m: None, clock=lambda: t[0], sleep=sleep
        )
    assert slept and all(s == lock.POLL_S for s in slept)
    assert conn.calls <= 2 * (len(slept) + 1), (conn.calls, len(slept))


# --------------------------------------------------------------------------- item 3


def test_an_ownerless_lock_has_one_winner_in_sequence(tmp_path: Path) -> None:
    path = tmp_path / "demo.lock"
    _stale(path, owner=None)
    p = lock.parse_probe(Counting().run(lock.acquire_script(str(path)), stdin="x").stdout)
    assert p.owner is None and lock.is_stale(p) and lock.tombstone_tag(p) == lock.NO_OWNER
    sh = Counting()
    # both judged it stale; the first takes it over and takes a fresh lock ...
    first = sh.run(lock.takeover_script(str(path), lock.NO_OWNER)).stdout
    assert lock.parse_takeover(first) == (True, "")
    winner = lock.Owner("bo", "laptop-2", 7, "w1", "up", "t")
    assert sh.run(lock.acquire_script(str(path)), stdin=winner.text()).stdout == "acquired\n"
    # ... and the second one's takeover fails on the fresh (never empty) lock
    taken, why = lock.parse_takeover(sh.run(lock.takeover_script(str(path), lock.NO_OWNER)).stdout)
    assert not taken and "not empty" in why
    assert lock.Owner.parse((path / "owner").read_text()) == winner


def test_racing_runs_on_an_ownerless_stale_lock_never_both_win(tmp_path: Path) -> None:
    for attempt in range(5):
        path = tmp_path / f"r{attempt}" / "demo.lock"
        _stale(path, owner=None)
        won, busy = race_for_lock(
            lambda: lock.acquire(Counting(), str(path), "up", wait=False, say=lambda _m: None),
            join_seconds=30,
        )
        assert len(won) == 1, (len(won), busy)
        assert len(busy) == 3
        owner = lock.Owner.parse((path / "owner").read_text())
        assert owner is not None and owner.run_id == won[0].owner.run_id
        won[0].release()


# --------------------------------------------------------------------------- item 4

NOISE = "echo 'Welcome to gpu-host'; echo acquired; echo held; echo 'now=1'; "


def test_a_noisy_login_shell_does_not_break_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "demo.lock"
    conn = Counting(prefix=NOISE)
    held = lock.acquire(conn, str(path), "up", say=lambda _m: None)
    assert lock.Owner.parse((path / "owner").read_text()) == held.owner
    # a second run behind the same shell sees it held, not "acquired" from the noise
    with pytest.raises(lock.LockBusy, match="held by"):
        lock.acquire(Counting(prefix=NOISE), str(path), "up", wait=False, say=lambda _m: None)
    held.release()
    assert not path.exists()


def test_an_unreadable_answer_is_a_remote_error_and_leaves_no_lock(tmp_path: Path) -> None:
    class Garbling(Counting):
        def run(
            self, cmd: Sequence[str] | str, timeout: float | None = None, stdin: str | None = None
        ) -> CommandResult:
            res = super().run(cmd, timeout, stdin)
            # a shell wrapper that eats the marker line (the answer cannot be trusted)
            out = "\n".join(ln for ln in res.stdout.splitlines() if "pdboot-lock" not in ln)
            return CommandResult(res.rc, out, res.stderr, res.seconds)

    path = tmp_path / "demo.lock"
    with pytest.raises(RemoteError) as exc:
        lock.acquire(Garbling(), str(path), "up", say=lambda _m: None)
    assert "no readable answer" in exc.value.message and "prints nothing" in exc.value.fix
    assert not path.exists()  # the lock it had just created was removed
