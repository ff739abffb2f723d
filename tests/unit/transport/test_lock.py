"""The deployment lock: pure decisions on plain values, and its scripts run by real bash
on a temporary directory (the same scripts run on the hosts over SSH)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pdboot.transport import lock
from pdboot.transport.connection import LocalConnection

OWNER = lock.Owner("ana", "laptop-1", 4242, "a1b2c3d4", "up", "2026-11-30T20:00:00+00:00")


def test_owner_round_trips_and_garbled_is_none() -> None:
    assert lock.Owner.parse(OWNER.text()) == OWNER
    assert lock.Owner.parse("user=ana\npid=x\n") is None
    assert lock.Owner.parse("") is None
    evil = lock.Owner("a\nrun_id=forged", "m", 1, "r1", "up", "t")
    assert lock.Owner.parse(evil.text()) is not None
    assert lock.Owner.parse(evil.text()).run_id == "r1"  # type: ignore[union-attr]


def test_probe_parsing_and_staleness_on_the_hosts_clock() -> None:
    assert lock.parse_probe("acquired\n").acquired
    text = "held\nnow=1000\nbeat=980\n" + OWNER.text()
    p = lock.parse_probe(text)
    assert not p.acquired and p.owner == OWNER and p.age_s == 20
    assert not lock.is_stale(p)  # 20 s < 3 heartbeats
    old = lock.parse_probe("held\nnow=1000\nbeat=969\n" + OWNER.text())
    assert lock.is_stale(old) and old.age_s == 31
    # being written (no owner yet): judged by the directory's age the same way
    fresh = lock.parse_probe("held\nnow=1000\nbeat=999\n")
    assert fresh.owner is None and not lock.is_stale(fresh)
    with pytest.raises(ValueError):
        lock.parse_probe("Permission denied\n")


def test_describe_says_who_and_since_when() -> None:
    p = lock.parse_probe("held\nnow=1000\nbeat=996\n" + OWNER.text())
    msg = lock.describe(p, "gpu-a")
    assert "held by ana@laptop-1 (pid 4242, `pdboot up`, run a1b2c3d4)" in msg
    assert "since 2026-11-30T20:00:00+00:00" in msg and "last heartbeat 4s ago" in msg
    assert lock.tombstone_tag(p) == "a1b2c3d4"
    assert lock.tombstone_tag(lock.parse_probe("held\nnow=1\nbeat=1\n")) == "noowner"


def test_scripts_quote_every_value() -> None:
    path = "/var/lib/pd boot/x;touch PWNED.lock"
    for script in (
        lock.acquire_script(path),
        lock.heartbeat_script(path, "r1"),
        lock.release_script(path, "r1"),
    ):
        assert "'/var/lib/pd boot/x;touch PWNED.lock" in script
    with pytest.raises(ValueError):
        lock.takeover_script(path, "x;y")


def _run(script: str, stdin: str | None = None) -> str:
    return LocalConnection("t").run(script, stdin=stdin).stdout


def test_acquire_held_heartbeat_release_in_real_bash(tmp_path: Path) -> None:
    path = str(tmp_path / "remote" / "demo.lock")
    assert _run(lock.acquire_script(path), OWNER.text()) == "acquired\n"
    assert Path(path, "owner").read_text() == OWNER.text()
    p = lock.parse_probe(_run(lock.acquire_script(path), "other"))
    assert not p.acquired and p.owner == OWNER and p.age_s < 5
    conn = LocalConnection("t")
    assert conn.run(lock.heartbeat_script(path, OWNER.run_id)).rc == 0
    assert conn.run(lock.heartbeat_script(path, "someoneelse")).rc != 0
    assert _run(lock.release_script(path, "someoneelse")).strip() == "not-ours"
    assert os.path.isdir(path)
    assert _run(lock.release_script(path, OWNER.run_id)).strip() == "released"
    assert not os.path.exists(path)


def test_stale_takeover_has_one_winner(tmp_path: Path) -> None:
    path = str(tmp_path / "demo.lock")
    _run(lock.acquire_script(path), OWNER.text())
    past = time.time() - 120
    os.utime(Path(path, "owner"), (past, past))
    p = lock.parse_probe(_run(lock.acquire_script(path), "x"))
    assert lock.is_stale(p)
    tag = lock.tombstone_tag(p)
    # two runs judged it stale; the first renames it, then takes a fresh lock...
    assert _run(lock.takeover_script(path, tag)).strip() == "taken"
    winner = lock.Owner("bo", "laptop-2", 7, "w1", "up", "t")
    assert _run(lock.acquire_script(path), winner.text()) == "acquired\n"
    # ...and the second one's rename fails on the tombstone: the fresh lock survives
    assert _run(lock.takeover_script(path, tag)).strip().startswith("lost: ")
    assert lock.Owner.parse(Path(path, "owner").read_text()) == winner


def test_acquire_waits_says_who_then_gives_up_or_fails_at_once(tmp_path: Path) -> None:
    path = str(tmp_path / "demo.lock")
    _run(lock.acquire_script(path), OWNER.text())
    said: list[str] = []
    t = [0.0]

    def sleep(s: float) -> None:
        t[0] += s
        os.utime(Path(path, "owner"))  # the holder's heartbeat goes on

    with pytest.raises(lock.LockBusy, match="gave up after waiting 10s"):
        lock.acquire(
            LocalConnection("h"),
            path,
            "up",
            wait_s=10,
            say=said.append,
            clock=lambda: t[0],
            sleep=sleep,
        )
    assert len(said) == 1 and "held by ana@laptop-1" in said[0] and "waiting up to 10s" in said[0]
    with pytest.raises(lock.LockBusy, match="--no-wait"):
        lock.acquire(LocalConnection("h"), path, "down", wait=False, say=said.append)


def test_acquire_takes_over_a_stale_lock_and_releases(tmp_path: Path) -> None:
    path = str(tmp_path / "demo.lock")
    _run(lock.acquire_script(path), OWNER.text())
    past = time.time() - 120
    os.utime(Path(path, "owner"), (past, past))
    said: list[str] = []
    held = lock.acquire(LocalConnection("h"), path, "down", say=said.append)
    try:
        assert "stale" in said[0] and "ana@laptop-1" in said[0]
        now = lock.Owner.parse(Path(path, "owner").read_text())
        assert now is not None and now.operation == "down" and now.pid == os.getpid()
        assert os.path.isdir(f"{path}.stale-{OWNER.run_id}")
    finally:
        held.release()
    assert not os.path.exists(path)
