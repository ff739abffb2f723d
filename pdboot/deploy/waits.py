"""Waiting for things to become ready: deadlines, intervals and an injectable clock.

Pure: the probes are callables handed in by the caller, the clock is an object with
``now()`` and ``sleep()``. Tests drive it with :class:`FakeClock`; `up` with the real one.
A probe answers ``ready``, ``waiting`` (any connection error or non-200 is this) or
``failed`` (the container exited: waiting longer cannot help, so the wait stops at once).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

ProbeState = Literal["ready", "waiting", "failed"]


@dataclass(frozen=True)
class Probe:
    state: ProbeState
    detail: str = ""  # e.g. "connection refused", "HTTP 503", "container exited (code 1)"
    host_lost: bool = False  # failed because the service's host stopped answering


READY = Probe("ready")


def waiting(detail: str) -> Probe:
    return Probe("waiting", detail)


def failed(detail: str, *, host_lost: bool = False) -> Probe:
    return Probe("failed", detail, host_lost)


class Clock(Protocol):
    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


@dataclass
class FakeClock:
    """A clock for tests: sleeping only moves time forward."""

    t: float = 0.0
    sleeps: list[float] = field(default_factory=list)

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += max(seconds, 0.0)


@dataclass(frozen=True)
class Tick:
    """What the caller may show while waiting: elapsed time and each probe's last answer."""

    elapsed: float
    states: Mapping[str, Probe]


class WaitError(Exception):
    def __init__(self, message: str, key: str, elapsed: float, probe: Probe) -> None:
        super().__init__(message)
        self.key = key
        self.elapsed = elapsed
        self.probe = probe


class WaitTimeout(WaitError):
    """The deadline passed before everything was ready."""


class WaitFailed(WaitError):
    """A probe reported a state that waiting cannot fix (e.g. the container exited)."""


def wait_all(
    probes: Mapping[str, Callable[[], Probe]],
    *,
    what: str,
    deadline: float,
    interval: float,
    clock: Clock | None = None,
    on_tick: Callable[[Tick], None] | None = None,
) -> float:
    """Probe every key until all are ready; return the seconds it took.

    ``what`` describes the condition (``"/health 200"``) and appears in the errors.
    Ready keys are not probed again. Raises WaitFailed as soon as one probe fails and
    WaitTimeout once ``deadline`` seconds have passed.
    """
    clk = clock or MonotonicClock()
    start = clk.now()
    last: dict[str, Probe] = {k: waiting("not probed yet") for k in probes}
    pending = list(probes)
    while True:
        for key in list(pending):
            result = _safe(probes[key])
            last[key] = result
            if result.state == "ready":
                pending.remove(key)
            elif result.state == "failed":
                elapsed = clk.now() - start
                raise WaitFailed(
                    f"{key}: gave up waiting for {what} after {elapsed:.1f}s: {result.detail}",
                    key,
                    elapsed,
                    result,
                )
        elapsed = clk.now() - start
        if on_tick is not None:
            on_tick(Tick(elapsed, dict(last)))
        if not pending:
            return elapsed
        if elapsed >= deadline:
            key = pending[0]
            others = f" (and {len(pending) - 1} more)" if len(pending) > 1 else ""
            raise WaitTimeout(
                f"{key}{others}: no {what} within {deadline:g}s "
                f"(last: {last[key].detail or last[key].state})",
                key,
                elapsed,
                last[key],
            )
        clk.sleep(min(interval, max(deadline - elapsed, 0.0)))


def _safe(probe: Callable[[], Probe]) -> Probe:
    # A probe that raises (a dropped connection, a parse error) means "not ready yet":
    # the deadline, not an exception, decides when to give up.
    try:
        return probe()
    except Exception as e:
        return waiting(f"{type(e).__name__}: {e}")
