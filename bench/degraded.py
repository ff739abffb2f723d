"""Benchmark: the only prefill lost, with degraded mode against today's behaviour (issue 43).

On loopback: 1 prefill and 1 decode stand-in engine (an emulation, loading in 0 s), the real
vllm-router 0.1.17 in `--enable-igw` mode as `up` runs it, `pdboot watch`'s own loop (1.5 s
interval, no restarts) and a client loop sending a completion through the router every
50 ms. Per case the prefill is stopped, left down for ``--down`` seconds and started again;
the run ends once the pair has served P/D again for a few rounds. Two modes in the same run,
alternately: ``degraded`` (`watch.degraded: true`, the default now) and ``today`` (false: the
last prefill stays in the router with an alert, as before issue 43).

Printed per case and summed per mode: requests sent and failed after the stop, failed from
10 s after it, seconds until the switch to degraded mode, seconds degraded, failed after the
prefill came back. Nothing timed is asserted anywhere; the ratio is against `today` measured
in the same run.

    python bench/degraded.py [--runs 1] [--down 15] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pdboot.deploy.router_api import RouterWorkerApi  # noqa: E402
from pdboot.deploy.watch.run import WatchDeps, Watcher  # noqa: E402
from pdboot.plan.watch.events import WatchServingChanged  # noqa: E402
from pdboot.plan.watch.metrics import WatchMetrics  # noqa: E402
from pdboot.plan.watch.policy import WatchConfig, WatchedEngine  # noqa: E402
from pdboot.transport.http import http  # noqa: E402
from tests.testbed.standin.test_standin import post  # noqa: E402
from tests.testbed.standin.watch_bed import MODEL, ClientLoop, Proc, Router  # noqa: E402

INTERVAL = 1.5
PROMPT = "the client loop asks this every time"


@dataclass
class Case:
    mode: str  # degraded | today
    sent: int  # requests started after the stop
    failed: int  # of them failed
    failed_after_10s: int  # failed among those started 10 s or more after the stop
    switch_s: float | None  # stop -> switch to degraded mode (None: no switch)
    degraded_s: float  # seconds served degraded
    failed_after_start: int  # failed among those started after the prefill was started again


def one_case(tmp: Path, degraded: bool, down: float) -> Case:
    prefill = Proc(tmp, "p", "prefill", {})
    decode = Proc(tmp, "d", "decode", {})
    router = Router(tmp, prefill.url, decode.url)
    stop = threading.Event()
    client: ClientLoop | None = None
    threads: list[threading.Thread] = []
    try:
        router.add(prefill.url, "prefill")
        router.add(decode.url, "decode")
        events: list[tuple[float, object]] = []
        deps = WatchDeps(
            http,
            RouterWorkerApi(router.url, http, model_id=MODEL),
            lambda e: events.append((time.monotonic(), e)),
            WatchMetrics(),
            None,
        )
        cfg = WatchConfig(
            interval_seconds=INTERVAL, deadline_seconds=1.0, readmit_after=2, degraded=degraded
        )
        engines = [
            WatchedEngine("p", "prefill", prefill.url),
            WatchedEngine("d", "decode", decode.url),
        ]
        watcher = Watcher(engines, MODEL, cfg, deps)
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 16, "temperature": 0}
        alone = post(decode.url + "/v1/completions", body)[1]["choices"][0]["text"]
        client = ClientLoop(router.url, alone, PROMPT)
        threads = [
            threading.Thread(target=watcher.run, args=(stop,), daemon=True),
            threading.Thread(target=client.run, daemon=True),
        ]
        for t in threads:
            t.start()
        while watcher.rounds < 2:
            time.sleep(0.05)
        t_stop = time.monotonic()
        prefill.stop()
        time.sleep(down)
        t_start = time.monotonic()
        prefill.start()
        end = time.monotonic() + 60
        while watcher.serving != "pd" and time.monotonic() < end:
            time.sleep(0.1)
        time.sleep(3 * INTERVAL)
        client.stop.set()
        switches = [(t, e) for t, e in events if isinstance(e, WatchServingChanged)]
        into = next((t for t, e in switches if e.mode != "pd"), None)  # type: ignore[attr-defined]
        back = next((t for t, e in switches if e.mode == "pd"), None)  # type: ignore[attr-defined]
        after = client.after(t_stop)
        return Case(
            "degraded" if degraded else "today",
            sum(after.values()),
            after["failed"] + after["wrong"],
            client.after(t_stop + 10)["failed"],
            None if into is None else round(into - t_stop, 2),
            0.0 if into is None else round((back or time.monotonic()) - into, 2),
            client.after(t_start)["failed"],
        )
    finally:
        stop.set()
        if client is not None:
            client.stop.set()
        for t in threads:
            t.join(timeout=30)
        router.stop()
        prefill.stop()
        decode.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--down", type=float, default=15.0, help="seconds the prefill stays down")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    logging.getLogger("pdboot").setLevel(logging.CRITICAL)  # watch's lines: the cases say it
    cases: list[Case] = []
    with tempfile.TemporaryDirectory(prefix="pdboot-bench-degraded-") as d:
        for run in range(a.runs):
            for degraded in (False, True):
                tmp = Path(d) / f"{run}-{int(degraded)}"
                tmp.mkdir()
                c = one_case(tmp, degraded, a.down)
                cases.append(c)
                print(json.dumps(asdict(c)), flush=True)
    print(f"\nprefill down {a.down:g} s, {a.runs} run(s) per mode (sums):")
    print("mode       sent  failed  failed>=10s  after-start  switch s  degraded s")
    totals: dict[str, tuple[int, int, int, int]] = {}
    for mode in ("today", "degraded"):
        mine = [c for c in cases if c.mode == mode]
        sent, failed = sum(c.sent for c in mine), sum(c.failed for c in mine)
        late = sum(c.failed_after_10s for c in mine)
        after = sum(c.failed_after_start for c in mine)
        totals[mode] = (sent, failed, late, after)
        sw = [c.switch_s for c in mine if c.switch_s is not None]
        switch = f"{sum(sw) / len(sw):8.1f}" if sw else "       -"
        deg = sum(c.degraded_s for c in mine) / len(mine)
        print(f"{mode:9} {sent:5} {failed:7} {late:12} {after:12} {switch} {deg:11.1f}")
    t, g = totals["today"], totals["degraded"]
    ratio = f"{g[1] / t[1]:.2f}x" if t[1] else "n/a (today failed none)"
    print(f"failed requests, degraded / today: {ratio} ({g[1]} / {t[1]})")
    if a.json:
        a.json.write_text(json.dumps([asdict(c) for c in cases], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
