"""`down` stops the prefills only once no decode pulls KV from them (deploy/drain.py's rule):
KvPullsDone with plain /metrics texts and a fake clock."""

from __future__ import annotations

from typing import Any

from pdboot.deploy.down import KvPullsDone
from pdboot.events import Event, Note
from pdboot.plan.build import build_plan
from pdboot.transport.http import HttpAnswer
from tests.unit.builders import inventory

IDLE = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
PULLING = IDLE + 'vllm:num_requests_kv_fetch_by_stage{engine="0",stage="in_progress"} 1\n'


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


class Engines:
    """Every engine idle; the decodes report a KV pull in progress on their first ``pulls``
    reads (``pulls`` None: for ever)."""

    def __init__(self, pulls: int | None) -> None:
        self.pulls, self.reads = pulls, []  # type: ignore[var-annotated]

    def __call__(self, url: str, **_: Any) -> HttpAnswer:
        self.reads.append(url)
        decode_reads = sum(1 for u in self.reads if ":8201/" in u)
        busy = ":8201/" in url and (self.pulls is None or decode_reads <= self.pulls)
        return HttpAnswer(200, PULLING if busy else IDLE)


def setup(pulls: int | None) -> tuple[KvPullsDone, Engines, Clock, list[Event]]:
    inv = inventory(overrides={"timeouts": {"drain_seconds": 10, "poll_interval_seconds": 0.5}})
    events: list[Event] = []
    engines, clock = Engines(pulls), Clock()
    return KvPullsDone(inv, build_plan(inv), events.append, engines, clock), engines, clock, events


def test_the_prefill_waits_for_the_decodes_kv_pulls_then_stops() -> None:
    done, engines, clock, events = setup(pulls=3)
    done("prefill")
    decode_reads = [u for u in engines.reads if ":8201/" in u]
    assert len(decode_reads) >= 5  # 3 busy, then two calm reads in a row
    assert all(u.endswith("/metrics") for u in engines.reads)
    assert 0 < clock.now() < 10 and events == []


def test_a_pull_that_never_ends_is_stopped_at_the_deadline_with_a_note() -> None:
    done, _, clock, events = setup(pulls=None)
    done("prefill")
    assert clock.now() >= 10
    notes = [e for e in events if isinstance(e, Note)]
    assert (
        len(notes) == 1
        and "still busy" in notes[0].message
        and "decodes pulling" in notes[0].message
    )


def test_the_other_tiers_stop_without_a_read() -> None:
    done, engines, clock, _ = setup(pulls=None)
    for role in ("watch", "proxy", "router", "decode"):
        done(role)  # type: ignore[arg-type]
    assert engines.reads == [] and clock.now() == 0
