"""Reading logs right after a failure (deploy/logscan.settled): an engine logs its error before
it answers 500, but Docker copies the line into its log file on its own schedule, so the first
reading may not show it yet (CI saw exactly this: a hash mismatch logged, `docker logs`
without it a moment later)."""

from __future__ import annotations

from collections.abc import Callable

from pdboot.deploy.logscan import LOG_REREAD_S, LOG_SETTLE_S, settled
from pdboot.deploy.waits import FakeClock
from pdboot.verify.diagnose import Finding, diagnose

MISMATCH = (
    "(EngineCore pid=7) ERROR 12-05 09:00:00 [base_worker.py:1197] RuntimeError: NIXL "
    "compatibility hash mismatch. Local: 5d673f, Remote: 7a1840. Prefill and decode instances "
    "have incompatible configurations."
)
ACCESS = '(APIServer pid=7) INFO:     10.0.0.3:4242 - "POST /v1/chat/completions HTTP/1.1" 500'


def readings(*logs: list[str]) -> tuple[list[int], Callable[[], list[Finding]]]:
    """A reader that returns these successive log contents (the last one repeats)."""
    calls: list[int] = []

    def read() -> list[Finding]:
        calls.append(1)
        return diagnose({"decode@d": logs[min(len(calls), len(logs)) - 1]})

    return calls, read


def test_a_line_that_arrives_late_is_still_found() -> None:
    calls, read = readings([ACCESS], [ACCESS], [ACCESS, MISMATCH])
    clock = FakeClock()
    found = settled(read, clock)
    assert [f.id for f in found] == ["nixl_compat_hash"]
    assert len(calls) == 3 and clock.sleeps == [LOG_REREAD_S, LOG_REREAD_S]


def test_a_cause_in_the_first_reading_costs_no_wait() -> None:
    calls, read = readings([ACCESS, MISMATCH])
    clock = FakeClock()
    assert settled(read, clock)
    assert len(calls) == 1 and clock.sleeps == []


def test_no_cause_at_all_gives_up_within_the_window() -> None:
    calls, read = readings([ACCESS])
    clock = FakeClock()
    assert settled(read, clock) == []
    assert clock.t <= LOG_SETTLE_S
    assert len(calls) == int(LOG_SETTLE_S / LOG_REREAD_S) + 1
