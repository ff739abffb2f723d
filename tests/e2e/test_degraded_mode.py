"""Degraded mode end to end (issue 43): `up` with the watch service beside the router, 1
prefill x 1 decode, the real CLI against testbed hosts (real sshd, dockerd, Compose v2,
registry, nginx proxy, vllm-router), stand-in engines (an emulation), a client loop through
the public endpoint:

- the prefill's container stopped and left down: watch switches the router to the decode
  alone (plain) within its interval plus one round; 0 failed requests from 10 s after the stop;
  `status` and watch's /verdicts and /metrics show the mode;
- started again: P/D again (the decode pulls KV again), 0 failed requests after the switch to
  degraded mode but for the switch back's documented window (docs/watch.md: the router
  answers 503 between the two P/D registrations; at most two of the client's requests).

Under CI=true a testbed that cannot start fails this test; elsewhere it skips.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from typing import Any

import pytest

from pdboot.inventory.load import load_inventory
from pdboot.plan.build import build_plan
from pdboot.plan.degraded import plain_url
from pdboot.verify.exposition import parse_exposition
from tests.cli import Cli
from tests.testbed.harness import HostSpec
from tests.testbed.inventory import watched_inventory
from tests.testbed.polling import wait_for
from tests.testbed.router_admin import router_json
from tests.testbed.standin.watch_bed import ClientLoop, switch_back_window

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

INTERVAL = 1.5
PROMPT = "the client loop asks this every time"


def get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())


def post_json(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def metric(text: str, name: str, **labels: str) -> float:
    return sum(
        s.value
        for s in parse_exposition(text)
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_a_stopped_prefill_degrades_to_the_decode_alone_and_pd_resumes(
    cli: Cli, make_testbed: Any
) -> None:
    tb = make_testbed(
        [HostSpec("prefill"), HostSpec("decode"), HostSpec("ingress", profile="cpu-only")]
    )
    inv_path = watched_inventory(
        tb, tb.dir / "degraded-e2e.yaml", "degradede2e", ["decode"], INTERVAL, readmit_after=2
    )
    plan = build_plan(load_inventory(inv_path))
    assert plan.watch is not None
    watch = plan.watch.url
    (prefill,) = [s for s in plan.services() if s.role == "prefill"]
    (decode,) = [s for s in plan.services() if s.role == "decode"]
    client: ClientLoop | None = None
    thread: threading.Thread | None = None
    up = cli("up", str(inv_path), "--skip-preflight", timeout=600)
    try:
        assert up.returncode == 0, up.stdout + up.stderr

        def diag() -> str:
            ids = tb.hosts["ingress"].docker(
                "ps", "-q", "--filter", "label=io.pdboot.role=watch", check=False
            )
            cid = ids.stdout.split()[0] if ids.stdout.split() else ""
            logs = tb.hosts["ingress"].docker("logs", "--tail", "40", cid, check=False)
            return logs.stdout + logs.stderr

        def verdicts() -> Any:
            return json.loads(get_text(watch + "/verdicts"))

        wait_for(
            "two good rounds",
            lambda: (v := verdicts())["rounds"] >= 2 and all(p["ok"] for p in v["pairs"]),
            diag,
        )
        assert verdicts()["serving"]["mode"] == "pd"
        alone = post_json(
            decode.url + "/v1/completions",
            {"model": plan.served_model_name, "prompt": PROMPT, "max_tokens": 16, "temperature": 0},
        )
        client = ClientLoop(
            plan.endpoint, alone["choices"][0]["text"], PROMPT, model=plan.served_model_name
        )
        thread = threading.Thread(target=client.run, daemon=True)
        thread.start()
        wait_for("the client served", lambda: client.after(0)["ok"] >= 5, diag)

        # the prefill lost, and left down (its restart policy does not restart a stopped one)
        rounds_at_stop = verdicts()["rounds"]
        t_stop = time.monotonic()
        tb.hosts["prefill"].docker("stop", "--time", "5", prefill.container_name)
        wait_for("degraded mode", lambda: verdicts()["serving"]["mode"] == "decode_only", diag)
        t_switch = time.monotonic()
        # detected by the next round after the stop at the latest, switched in it
        assert verdicts()["rounds"] - rounds_at_stop <= 3, (rounds_at_stop, verdicts())
        listed = {(w["url"], w["worker_type"]) for w in router_json(tb.hosts["ingress"])["workers"]}
        assert listed == {(plain_url(decode.url), "regular")}, listed
        text = get_text(watch + "/metrics")
        assert metric(text, "pdboot_watch_degraded") == 1
        assert metric(text, "pdboot_watch_serving_switches_total", mode="decode_only") == 1
        st = cli("status", str(inv_path), "--json", timeout=120)
        doc = json.loads(st.stdout)
        assert doc["watch"]["serving"] == "decode_only", doc["watch"]
        assert doc["router_workers"]["plain"] == [decode.url.rstrip("/")], doc["router_workers"]
        assert doc["router_workers"]["foreign"] == [], doc["router_workers"]
        time.sleep(4 * INTERVAL)  # serving from the decode alone for a few rounds
        alone_counts = client.after(t_switch)
        assert alone_counts["failed"] == 0 and alone_counts["ok"] > 0, (
            alone_counts,
            [e for e in client.errors if e[0] >= t_switch],
        )
        assert client.after(t_stop + 10)["failed"] == 0
        kv = get_text(decode.url + "/metrics")
        pulled = metric(kv, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")

        # the prefill back: P/D again, the decode pulls KV from it again
        t_start = time.monotonic()
        tb.hosts["prefill"].docker("start", prefill.container_name)
        wait_for("P/D again", lambda: verdicts()["serving"]["mode"] == "pd", diag)
        t_back = time.monotonic()
        wait_for(
            "the decode pulls KV again",
            lambda: (
                metric(
                    get_text(decode.url + "/metrics"),
                    "vllm:prompt_tokens_by_source_total",
                    source="external_kv_transfer",
                )
                > pulled
            ),
            diag,
        )
        listed = {(w["url"], w["worker_type"]) for w in router_json(tb.hosts["ingress"])["workers"]}
        assert listed == {(prefill.url, "prefill"), (decode.url, "decode")}, listed
        assert metric(get_text(watch + "/metrics"), "pdboot_watch_degraded") == 0
        time.sleep(2 * INTERVAL)
        client.stop.set()
        thread.join(timeout=30)
        total = client.after(t_switch)
        print(
            f"\nswitch {t_switch - t_stop:.1f} s after the stop "
            f"({client.after(t_stop)['failed']} failed before it); P/D again "
            f"{t_back - t_start:.1f} s after the start; from the switch on: {total}"
        )
        # The one window docs/watch.md names: the switch back registers the two P/D entries
        # together, and the router answers 503 "No available workers" between them. A request
        # may meet it (each client sends one at a time: one or two at most); no other failure,
        # and none outside the switch back, is allowed.
        errors = [e for e in client.errors if e[0] >= t_switch]
        window = switch_back_window(errors, t_start, t_back)
        assert total["wrong"] == 0 and total["failed"] == len(window) <= 2, (total, errors)
    finally:
        if client is not None:
            client.stop.set()
        if thread is not None:
            thread.join(timeout=30)
        down = cli("down", str(inv_path), timeout=300)
        assert down.returncode == 0, down.stdout + down.stderr
