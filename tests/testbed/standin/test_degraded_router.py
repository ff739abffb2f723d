"""Degraded mode against the real vllm-router 0.1.17 (--enable-igw) and stand-in engines (an
emulation) on loopback, 1 prefill x 1 decode, a client loop through the router:

- the router's rule the switch rests on (plan/degraded.py): decode workers alone answer 503,
  the same engine registered again as a plain (regular) worker under its plain URL (its URL
  and "/.") serves, and a prefill added beside it turns P/D on again;
- `pdboot watch` (its real loop, on loopback) with the only prefill stopped and left down: it
  drains first, as real vLLM does on SIGTERM (500 to each completion, /health answering); the
  switch within two rounds of the stop, while it drains, 0 failed requests after it, the
  decode serving alone;
  the prefill started again: P/D again, the decode pulls KV again, 0 failed requests from the
  switch on but for the switch back's documented window (the router's 503 between the two P/D
  registrations, at most two).

Nothing asserts on seconds; the seconds are printed (pytest -s).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pdboot.deploy.router_api import RouterWorkerApi
from pdboot.deploy.watch.run import WatchDeps, Watcher
from pdboot.events import Event
from pdboot.plan.degraded import plain_url
from pdboot.plan.watch.events import WatchActionTaken, WatchServingChanged
from pdboot.plan.watch.metrics import WatchMetrics
from pdboot.plan.watch.policy import WatchConfig, WatchedEngine
from pdboot.transport.http import http
from pdboot.verify.exposition import parse_exposition
from tests.testbed.standin.test_standin import alone_text, get, started, stop_bed, stopped
from tests.testbed.standin.watch_bed import MODEL, ClientLoop, Proc, Router, switch_back_window

INTERVAL = 1.5
CFG = WatchConfig(interval_seconds=INTERVAL, deadline_seconds=1.0, readmit_after=2)
WAIT = 60.0  # bound for "it happened"; nothing asserts on durations
PREFILL_DRAIN = 5.0  # seconds the stopped prefill drains (real vLLM: 5-10 s on the testbed)
PROMPT = "the client loop asks this every time"


def complete(url: str) -> tuple[int, str]:
    body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "temperature": 0})
    req = urllib.request.Request(
        url + "/v1/completions", body.encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def pulled_tokens(p: Proc) -> float:
    """The decode's prompt tokens that came as KV from a prefill (vLLM's own metric)."""
    text = get(p.url + "/metrics")[1]
    return sum(
        s.value
        for s in parse_exposition(text)
        if s.name == "vllm:prompt_tokens_by_source_total"
        and s.labels.get("source") == "external_kv_transfer"
    )


def test_the_router_routes_plain_workers_only_while_it_has_no_pd_worker(tmp_path: Path) -> None:
    """The rule plan/degraded.py rests on, with the real router: any prefill or decode entry
    for the model turns P/D routing on (503 without a complete pair); regular entries alone
    serve; the plain entry (the URL with "/.") is its own entry, and the engine gets the
    request at its own path (the stand-in answers 404 to "//v1/...", as real vLLM does)."""
    prefill = Proc(tmp_path, "p", "prefill", {})
    decode = Proc(tmp_path, "d", "decode", {})
    router = Router(tmp_path, prefill.url, decode.url)
    try:
        api = RouterWorkerApi(router.url, http, model_id=MODEL)
        api.add(plain_url(decode.url), "regular")
        status, body = complete(router.url)
        assert status == 200 and "prefill_addr" not in json.loads(body)["id"], body
        api.add(decode.url, "decode")
        assert {(w.url, w.worker_type) for w in api.workers()} == {
            (decode.url, "decode"),
            (plain_url(decode.url), "regular"),
        }
        status, body = complete(router.url)
        assert (status, "0 prefill, 1 decode" in body) == (503, True), body
        before = pulled_tokens(decode)
        api.add(prefill.url, "prefill")
        status, body = complete(router.url)
        assert status == 200 and "prefill_addr" in json.loads(body)["id"], body
        assert pulled_tokens(decode) > before
        assert api.remove(plain_url(decode.url)) and decode.url in {w.url for w in api.workers()}
    finally:
        router.stop()
        prefill.stop()
        decode.stop()


def test_a_pd_entry_under_another_model_id_completes_no_pair(tmp_path: Path) -> None:
    """Why the switch back keeps its window (docs/known-limits.md): the router pairs a
    prefill with a decode of the same model id only. Entries staged under another id take
    no traffic, and the served model's first P/D entry still answers 503 until its own pair
    is complete. A router that paired across ids would fail this test, and would offer a
    switch back with no window."""
    prefill = Proc(tmp_path, "p", "prefill", {})
    decode = Proc(tmp_path, "d", "decode", {})
    router = Router(tmp_path, prefill.url, decode.url)
    try:
        served = RouterWorkerApi(router.url, http, model_id=MODEL)
        staged = RouterWorkerApi(router.url, http, model_id="pdboot-staging")
        served.add(plain_url(decode.url), "regular")
        staged.add(decode.url, "decode")
        staged.add(prefill.url, "prefill")
        status, body = complete(router.url)
        assert status == 200 and "prefill_addr" not in json.loads(body)["id"], body
        served.add(prefill.url + "/./.", "prefill")  # its own entry, apart from the staged
        status, body = complete(router.url)
        assert (status, "No eligible P/D pair" in body) == (503, True), body
        served.add(decode.url + "/./.", "decode")
        status, body = complete(router.url)
        assert status == 200 and "prefill_addr" in json.loads(body)["id"], body
    finally:
        router.stop()
        prefill.stop()
        decode.stop()


@dataclass
class Bed:
    prefill: Proc
    decode: Proc
    watcher: Watcher
    events: list[tuple[float, Event]]
    client: ClientLoop

    def switch(self, mode: str) -> tuple[float, int]:
        """When watch switched to ``mode`` (monotonic) and its round count then."""
        end = time.monotonic() + WAIT
        while True:
            for t, e in list(self.events):
                if isinstance(e, WatchServingChanged) and e.mode == mode:
                    return t, self.watcher.rounds
            assert time.monotonic() < end, f"no switch to {mode}: {self.events}"
            time.sleep(0.05)

    def failed_since(self, t: float) -> list[tuple[float, str]]:
        return [(round(t0 - t, 2), why) for t0, why in self.client.errors if t0 >= t]


@pytest.fixture
def bed(tmp_path: Path) -> Iterator[Bed]:
    stop = threading.Event()
    threads: list[threading.Thread] = []
    procs: list[Proc] = []
    router: Router | None = None
    client: ClientLoop | None = None
    try:
        # it drains on SIGTERM as real vLLM does (vllm_standin.py DRAINING)
        drain = {"STANDIN_SHUTDOWN_SECONDS": str(PREFILL_DRAIN)}
        prefill = Proc(tmp_path, "p", "prefill", drain, args=("--shutdown-timeout", "30"))
        procs.append(prefill)
        decode = Proc(tmp_path, "d", "decode", {})
        procs.append(decode)
        router = Router(tmp_path, prefill.url, decode.url)
        router.add(prefill.url, "prefill")
        router.add(decode.url, "decode")
        engines = [
            WatchedEngine("p", "prefill", prefill.url),
            WatchedEngine("d", "decode", decode.url),
        ]
        events: list[tuple[float, Event]] = []
        deps = WatchDeps(
            http,
            RouterWorkerApi(router.url, http, model_id=MODEL),
            lambda e: events.append((time.monotonic(), e)),
            WatchMetrics(),
            None,  # no restarts: the prefill stays down until the test starts it
            drain_seconds=0.5,
            ready_seconds=30,
        )
        watcher = Watcher(engines, MODEL, CFG, deps)
        client = ClientLoop(router.url, alone_text(decode.url, MODEL, PROMPT), PROMPT)
        threads += started(watcher.run, client.run, stop)
        end = time.monotonic() + WAIT
        while watcher.rounds < 2:
            assert time.monotonic() < end, events
            time.sleep(0.05)
        yield Bed(prefill, decode, watcher, events, client)
    finally:
        stopped(stop, client, threads)
        stop_bed(router, procs)


def test_a_lost_prefill_degrades_to_the_decode_alone_and_pd_resumes_when_it_is_back(
    bed: Bed,
) -> None:
    assert bed.failed_since(0) == [] and bed.watcher.serving == "pd"
    t_stop, rounds_then = time.monotonic(), bed.watcher.rounds
    exited: list[float] = []

    def stop_prefill() -> None:
        bed.prefill.stop()  # SIGTERM: it drains PREFILL_DRAIN s, then exits
        exited.append(time.monotonic())

    stopping = threading.Thread(target=stop_prefill)
    stopping.start()
    t_switch, rounds_switch = bed.switch("decode_only")
    stopping.join(WAIT)
    # detected by the next round's canary: the draining prefill refused its step (HTTP 500,
    # its /health still answering), blamed alone and evicted before it exited; the round
    # under way counts too
    assert rounds_switch - rounds_then <= 2
    evicted = [e for _, e in bed.events if isinstance(e, WatchActionTaken) and e.action == "evict"]
    assert [(e.engine, e.fault) for e in evicted] == [("p", "error")], evicted
    assert exited and t_switch < exited[0], (t_switch - t_stop, exited)
    assert bed.watcher.deps.metrics.value("pdboot_watch_degraded") == 1
    time.sleep(3 * INTERVAL)  # serving alone for a few rounds
    served_alone = bed.client.after(t_switch)
    assert bed.failed_since(t_switch) == [] and served_alone["ok"] > 0, served_alone
    pulled = pulled_tokens(bed.decode)
    assert bed.failed_since(t_stop + 10) == []

    t_start = time.monotonic()
    bed.prefill.start()
    t_back, _ = bed.switch("pd")
    end = time.monotonic() + WAIT
    while pulled_tokens(bed.decode) <= pulled:  # the decode pulls KV again
        assert time.monotonic() < end, "no KV pulled after P/D resumed"
        time.sleep(0.1)
    time.sleep(INTERVAL)
    bed.client.stop.set()
    # none failed but in the switch back's documented window (docs/watch.md), at most two
    window = switch_back_window(bed.client.errors, t_start, t_back)
    failed = [e for e in bed.client.errors if e[0] >= t_switch]
    assert failed == window and len(window) <= 2, bed.failed_since(t_switch)
    assert bed.watcher.deps.metrics.value("pdboot_watch_degraded") == 0
    lost = bed.client.after(t_stop)["failed"]
    print(
        f"\nswitch {t_switch - t_stop:.1f} s after the stop ({lost} failed before it), "
        f"the prefill exited {exited[0] - t_stop:.1f} s after it; "
        f"P/D again {t_back - t_start:.1f} s after the start; "
        f"degraded {t_back - t_switch:.1f} s, {served_alone['ok']} served alone"
    )
