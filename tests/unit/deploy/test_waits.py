"""wait_all with a fake clock: deadlines, intervals, early failure."""

from __future__ import annotations

import pytest

from pdboot.deploy.waits import (
    READY,
    FakeClock,
    Probe,
    Tick,
    WaitFailed,
    WaitTimeout,
    failed,
    wait_all,
    waiting,
)


def _script(clock: FakeClock, answers: dict[float, Probe], default: Probe):
    """A probe answering by the fake time: the latest entry at or before now."""

    def probe() -> Probe:
        best = default
        for t in sorted(answers):
            if clock.now() >= t:
                best = answers[t]
        return best

    return probe


def test_ready_after_some_polls_returns_elapsed() -> None:
    clock = FakeClock()
    probe = _script(clock, {3.0: READY}, waiting("connection refused"))
    took = wait_all({"t": probe}, what="/health 200", deadline=10, interval=0.5, clock=clock)
    assert took == 3.0
    assert clock.sleeps == [0.5] * 6


def test_timeout_names_what_and_last_detail() -> None:
    clock = FakeClock()
    probe = _script(clock, {}, waiting("HTTP 503"))
    with pytest.raises(WaitTimeout) as ei:
        wait_all({"decode@b": probe}, what="/health 200", deadline=2, interval=0.5, clock=clock)
    msg = str(ei.value)
    assert "decode@b" in msg and "/health 200" in msg and "HTTP 503" in msg and "2s" in msg
    assert clock.now() == 2.0  # never sleeps past the deadline


def test_failed_stops_at_once_not_at_the_deadline() -> None:
    clock = FakeClock()
    probe = _script(clock, {1.0: failed("container exited (code 1)")}, waiting("refused"))
    with pytest.raises(WaitFailed) as ei:
        wait_all({"t": probe}, what="/health 200", deadline=1200, interval=0.5, clock=clock)
    assert ei.value.elapsed == 1.0
    assert "exited" in str(ei.value)


def test_exception_in_probe_counts_as_not_ready() -> None:
    clock = FakeClock()
    calls = {"n": 0}

    def probe() -> Probe:
        calls["n"] += 1
        if calls["n"] < 3:
            raise ConnectionResetError("reset by peer")
        return READY

    assert wait_all({"t": probe}, what="x", deadline=5, interval=1, clock=clock) == 2.0


def test_all_keys_and_ticks() -> None:
    clock = FakeClock()
    ticks: list[Tick] = []
    probes = {
        "decode@a": _script(clock, {1.0: READY}, waiting("refused")),
        "decode@b": _script(clock, {2.0: READY}, waiting("refused")),
    }
    took = wait_all(
        probes, what="/health", deadline=9, interval=0.5, clock=clock, on_tick=ticks.append
    )
    assert took == 2.0
    assert ticks[0].states["decode@a"].state == "waiting"
    assert ticks[-1].states["decode@b"].state == "ready"


def test_timeout_reports_how_many_are_missing() -> None:
    clock = FakeClock()
    probes = {k: _script(clock, {}, waiting("refused")) for k in ("p@a", "p@b")}
    with pytest.raises(WaitTimeout, match=r"p@a \(and 1 more\)"):
        wait_all(probes, what="/health", deadline=1, interval=0.5, clock=clock)
