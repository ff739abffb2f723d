"""watch under the deployment lock (deploy/watch/lease.py): a round acts only while watch
holds the lock `up` and `down` take; while another run holds it, watch reads /health, says so
and changes nothing; a crashed run's stale lock is taken over. The lock's scripts run in real
bash on a temporary directory (as in tests/unit/transport/test_lock.py); the loop runs against
the fake world of test_watch_run.py."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pdboot.deploy.watch.lease import LockLease
from pdboot.plan.watch.events import WatchHeldBack
from pdboot.transport import lock
from pdboot.transport.connection import LocalConnection
from tests.unit.deploy.test_watch_run import World, actions, watcher


def _lease(path: Path) -> LockLease:
    return LockLease(str(path), "ingress", lambda: LocalConnection("ingress"), lambda _m: None)


def test_watch_takes_the_lock_only_when_no_up_holds_it_and_up_sees_watch(
    tmp_path: Path,
) -> None:
    path = tmp_path / "demo.lock"
    up = lock.acquire(LocalConnection("ingress"), str(path), "up", wait=False, say=print)
    lease = _lease(path)
    try:
        holder = lease.take()
        assert holder is not None and "`pdboot up`" in holder and "--no-wait" not in holder
        up.release()
        assert lease.take() is None
        assert "operation=watch" in (path / "owner").read_text()
        # an `up --no-wait` now finds watch holding the deployment, named
        with pytest.raises(lock.LockBusy, match="`pdboot watch`"):
            lock.acquire(LocalConnection("ingress"), str(path), "up", wait=False, say=print)
        lease.release()
        assert not path.exists()  # released at the round's end: `up` gets it at once
        up = lock.acquire(LocalConnection("ingress"), str(path), "up", wait=False, say=print)
    finally:
        up.release()
        lease.close()


def test_a_crashed_ups_stale_lock_does_not_block_watch(tmp_path: Path) -> None:
    path = tmp_path / "demo.lock"
    path.mkdir()
    owner = lock.Owner("ana", "laptop", 1, "deadbeef", "up", "2026-12-06T10:00:00+00:00")
    (path / "owner").write_text(owner.text())
    past = time.time() - 120  # older than STALE_AFTER_S: its heartbeat stopped
    for p in (path / "owner", path):
        os.utime(p, (past, past))
    said: list[str] = []
    lease = LockLease(str(path), "ingress", lambda: LocalConnection("ingress"), said.append)
    try:
        assert lease.take() is None
        assert "operation=watch" in (path / "owner").read_text()
        assert any("stale" in m for m in said)
    finally:
        lease.close()


@dataclass
class FakeLease:
    """Held by another run while ``holder`` is set; counts what watch did with it."""

    holder: str | None = None
    lost_reason: str | None = None
    taken: int = 0
    released: int = 0
    log: list[str] = field(default_factory=list)

    def take(self) -> str | None:
        if self.holder is None:
            self.taken += 1
        return self.holder

    def lost(self) -> str | None:
        return self.lost_reason

    def release(self) -> None:
        self.released += 1

    def close(self) -> None:
        self.log.append("closed")


def test_while_up_holds_the_deployment_watch_reports_and_does_not_act() -> None:
    world = World()
    w, router, events = watcher(world)
    lease = FakeLease(holder="the deployment lock on gpu-a is held by ana@laptop (`pdboot up`)")
    w.deps.lease = lease
    world.engines["d1"].healthy = False  # stopped while up replaces it
    world.engines["p1"].refuse_pulls = True  # a peer fault watch would restart for
    for _ in range(4):
        assert w.round() == []
    assert router.calls == [] and actions(events) == []
    assert world.engines["p1"].restarts == 0
    held = [e for e in events if isinstance(e, WatchHeldBack)]
    assert [e.rounds for e in held] == [1, 2, 3, 4] and all(e.held for e in held)
    assert "`pdboot up`" in held[0].holder and held[0].unhealthy == ("d1",)
    assert w.deps.metrics.value("pdboot_watch_held_back") == 1
    assert lease.taken == lease.released == 0  # never watch's: nothing to give back
    assert all(s.bad_rounds == 0 for s in w.state.engines.values())  # nothing counted

    lease.holder = None  # up is done: the next round acts, and gives the lock back
    w.round()
    assert ("evict", "d1", True) in actions(events)
    assert ("remove", "http://d1") in router.calls
    resumed = [e for e in events if isinstance(e, WatchHeldBack)][-1]
    assert not resumed.held and resumed.rounds == 4
    assert w.deps.metrics.value("pdboot_watch_held_back") == 0
    assert lease.taken == lease.released == 1


def test_a_lease_lost_mid_round_stops_its_actions() -> None:
    world = World()
    w, router, events = watcher(world)
    w.deps.lease = FakeLease(lost_reason="no heartbeat reached gpu-a for 21s")
    world.engines["d1"].corrupt = True
    w.round()
    assert router.calls == [] and actions(events) == []
    assert w.deps.lease.released == 1  # type: ignore[union-attr]
