"""`pdboot watch` against the real vllm-router (--enable-igw) and stand-in engines (an
emulation) on loopback, 2 prefills x 2 decodes, one injected fault at a time:

- detected within two rounds of the injection (rounds, not seconds: the seconds are printed),
- the engine removed through the router's worker API (gone from its GET /workers),
- a bounded client loop through the router counts 0 wrong and 0 failed requests started
  after the eviction,
- back in the router after the fault clears (a restart by watch for the peer faults, the test
  clearing the knob for the others), with events and watch's /metrics showing each step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pdboot.deploy.router_api import RouterWorkerApi
from pdboot.deploy.watch.run import WatchDeps, Watcher
from pdboot.deploy.watch.service import serve
from pdboot.events import Event
from pdboot.plan.watch.events import WatchActionTaken, WatchRound
from pdboot.plan.watch.metrics import WatchMetrics
from pdboot.plan.watch.policy import WatchConfig, WatchedEngine
from pdboot.transport.http import http
from pdboot.verify.exposition import parse_exposition
from tests.testbed.standin.router_proc import free_port
from tests.testbed.standin.test_standin import alone_text, get, started, stop_bed, stopped
from tests.testbed.standin.watch_bed import MODEL, ClientLoop, Proc, Router

INTERVAL = 1.5
CFG = WatchConfig(
    interval_seconds=INTERVAL,
    deadline_seconds=1.0,
    evict_after=1,
    readmit_after=2,
    restart_after=2,
    restart_backoff_seconds=300,
)
WAIT = 60.0  # bound for "it happened"; nothing asserts on durations


@dataclass
class Bed:
    procs: dict[str, Proc]
    router: Router
    watcher: Watcher
    events: list[Event]
    metrics_url: str
    client: ClientLoop

    times: list[float]

    @property
    def action_times(self) -> list[tuple[float, str]]:
        return [
            (round(t, 2), f"{e.action} {e.engine}")
            for t, e in zip(self.times, self.events)
            if isinstance(e, WatchActionTaken)
        ]

    def action(self, kind: str, engine: str) -> WatchActionTaken | None:
        return next(
            (
                e
                for e in list(self.events)
                if isinstance(e, WatchActionTaken) and e.action == kind and e.engine == engine
            ),
            None,
        )

    def wait_action(self, kind: str, engine: str) -> tuple[WatchActionTaken, float, int]:
        """The action, the time it was seen, and the round count then."""
        end = time.monotonic() + WAIT
        while (a := self.action(kind, engine)) is None:
            assert time.monotonic() < end, f"no {kind} {engine}: {self.summary()}"
            time.sleep(0.05)
        return a, time.monotonic(), self.watcher.rounds

    def errors_since(self, t: float) -> list[tuple[float, str]]:
        return [(round(t0, 2), why) for t0, why in self.client.errors if t0 >= t]

    def summary(self) -> list[str]:
        return [
            f"{e.action} {e.engine} ok={e.ok} {e.reason} {e.detail}"
            for e in self.events
            if isinstance(e, WatchActionTaken)
        ]

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = get(self.metrics_url)[1]
        return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in parse_exposition(text)}


class BedRestarter:
    def __init__(self, procs: dict[str, Proc]) -> None:
        self.procs = procs

    def restart(self, engine: WatchedEngine) -> None:
        self.procs[engine.key].restart()


@pytest.fixture
def bed(tmp_path: Path) -> Iterator[Bed]:
    procs: dict[str, Proc] = {}
    router: Router | None = None
    stop = threading.Event()
    threads: list[threading.Thread] = []
    server = None
    client: ClientLoop | None = None
    try:
        for name in ("p0", "p1"):
            procs[name] = Proc(tmp_path, name, "prefill", {})
        for name in ("d0", "d1"):
            procs[name] = Proc(tmp_path, name, "decode", {})
        router = Router(tmp_path, procs["p0"].url, procs["d0"].url)
        for name, p in procs.items():
            router.add(p.url, p.role)
        engines = [WatchedEngine(k, p.role, p.url) for k, p in procs.items()]  # type: ignore[arg-type]
        events: list[Event] = []
        times: list[float] = []

        def emit(e: Event) -> None:
            times.append(time.monotonic())
            events.append(e)

        metrics = WatchMetrics()
        deps = WatchDeps(
            http,
            RouterWorkerApi(router.url, http),
            emit,
            metrics,
            BedRestarter(procs),
            drain_seconds=0.5,
            ready_seconds=30,
        )
        watcher = Watcher(engines, MODEL, CFG, deps)
        port = free_port()
        server = serve(watcher, metrics, "127.0.0.1", port)
        prompt = "the client loop asks this every time"
        client = ClientLoop(router.url, alone_text(procs["d1"].url, MODEL, prompt), prompt)
        threads += started(watcher.run, client.run, stop)
        b = Bed(procs, router, watcher, events, f"http://127.0.0.1:{port}/metrics", client, times)
        end = time.monotonic() + WAIT
        while watcher.rounds < 2:  # a baseline: every pair good before any fault
            assert time.monotonic() < end, b.summary()
            time.sleep(0.05)
        rounds = [e for e in events if isinstance(e, WatchRound)]
        assert all(not p.fault for r in rounds for p in r.pairs), rounds
        yield b
    finally:
        stopped(stop, client, threads)
        if server is not None:
            server.shutdown()
            server.server_close()
        stop_bed(router, procs.values())


def _requests_served(p: Proc) -> int:
    text = get(p.url + "/metrics")[1]
    return int(
        sum(s.value for s in parse_exposition(text) if s.name == "vllm:request_success_total")
    )


FAULTS: dict[str, tuple[str, Callable[[Proc], Any], Callable[[Proc], Any] | None, str]] = {
    # name: (engine, inject, clear (None: watch's restart clears it), fault kind)
    "corrupt_kv_after_n": (
        "d0",
        lambda p: p.faults(corrupt_pulled_kv_after=_requests_served(p) + 3),
        lambda p: p.faults(corrupt_pulled_kv_after=None),
        "wrong_answer",
    ),
    "hung_transfer": ("d0", lambda p: p.faults(hang_transfer=True), None, "hang"),
    "dead_side_channel": (
        "p0",
        lambda p: p.faults(drop_side_channel=True),
        None,
        "failed_transfers",
    ),
    "health_failing": (
        "d1",
        lambda p: p.faults(health_fail=True),
        lambda p: p.faults(health_fail=False),
        "health",
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_watch_evicts_and_readmits_through_the_real_router(bed: Bed, fault: str) -> None:
    key, inject, clear, kind = FAULTS[fault]
    proc = bed.procs[key]
    rounds_at_injection = bed.watcher.rounds
    t_inject = time.monotonic()
    inject(proc)

    evict, t_evict, rounds_then = bed.wait_action("evict", key)
    assert evict.ok and evict.fault == kind, bed.summary()
    # detected by the round running at the injection or the next one: within two intervals
    assert rounds_then - rounds_at_injection <= 2, (rounds_at_injection, rounds_then)
    assert proc.url not in bed.router.listed(), bed.router.listed()
    m = bed.scrape()
    tier = proc.role
    assert (
        m[("pdboot_watch_evictions_total", (("engine", key), ("fault", kind), ("tier", tier)))] == 1
    )
    assert m[("pdboot_watch_engine_in_rotation", (("engine", key), ("tier", tier)))] == 0

    time.sleep(3 * INTERVAL)  # the client loop runs on through the other engines
    after = bed.client.after(t_evict)
    print(
        f"\n{fault}: evicted {t_evict - t_inject:.2f} s after the injection "
        f"({rounds_then - rounds_at_injection} rounds); client requests started after the "
        f"eviction: {after}"
    )
    assert after["wrong"] == 0 and after["failed"] == 0 and after["ok"] > 0, (
        after,
        round(t_evict, 2),
        bed.errors_since(t_evict),
        bed.summary(),
        bed.action_times,
    )

    if clear is None:  # a peer fault: watch restarts the engine (drained), which clears it
        restart, _, _ = bed.wait_action("restart", key)
        assert restart.ok, bed.summary()
        assert proc.starts == 2
        if tier == "prefill":  # then every decode, one at a time
            for d in ("d0", "d1"):
                assert bed.wait_action("restart", d)[0].ok, bed.summary()
    else:
        clear(proc)
    readmit, t_back, _ = bed.wait_action("readmit", key)
    assert readmit.ok, bed.summary()
    assert bed.router.listed().get(proc.url) == tier
    print(f"{fault}: back in the router {t_back - t_evict:.2f} s after the eviction")
    m = bed.scrape()
    assert m[("pdboot_watch_readmissions_total", (("engine", key), ("tier", tier)))] == 1
    assert m[("pdboot_watch_engine_in_rotation", (("engine", key), ("tier", tier)))] == 1
    total = bed.client.after(t_evict)
    assert total["wrong"] == 0 and total["failed"] == 0, (
        total,
        round(t_evict, 2),
        bed.errors_since(t_evict),
        bed.action_times,
    )


def test_the_bed_router_takes_new_ports_when_its_port_was_taken_before_it_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from tests.testbed.standin import router_proc

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # bound, not listening: as an outgoing connection's port
        first = iter([taken.getsockname()[1]])
        monkeypatch.setattr(router_proc, "free_port", lambda: next(first, None) or free_port())
        router = Router(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9")
        try:
            assert router.port != taken.getsockname()[1]
            assert get(router.url + "/workers")[0] == 200
        finally:
            router.stop()
        # a port the caller chose is not changed behind its back: the failure is reported
        with pytest.raises(AssertionError, match="Address already in use"):
            Router(
                tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", port=taken.getsockname()[1]
            )
