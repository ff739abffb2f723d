"""Issue 13 end to end, the real CLI against testbed hosts with stand-in engines and the real
vllm-router 0.1.17:

- the correctness gate fails `up` when the decode's pulled KV lands corrupted (HTTP 200,
  wrong tokens: STANDIN_CORRUPT_PULLED_KV=1) and prints both outputs; it passes normally;
- the KV speed line of `up` reports a measured throughput (tens of MB moved: the stand-in
  moves STANDIN_KV_BLOCK_BYTES per 16-token block) next to the declared link rate;
- after a few requests, `status --json` carries per-engine P/D metrics and the spread.

Under CI=true a testbed that cannot start fails these tests; elsewhere they skip.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli import Cli, output
from tests.e2e.test_up_status_down import (
    down_clean,
    http_json,
    ids,
    started_at,
    token_cli,
    write_inventory,
)

pytestmark = [pytest.mark.testbed, pytest.mark.slow]


@pytest.fixture(scope="module")
def cli(cli: Cli) -> Cli:
    return token_cli(cli)


BLOCK_BYTES = "1000000"  # 1 MB per 16-token block: the 900-token speed prompt moves ~57 MB


@pytest.fixture
def tb3(testbed_clean: Any) -> Any:
    return testbed_clean


def _with(path: Path, **top: Any) -> Path:
    doc = yaml.safe_load(path.read_text())
    doc.update(top)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_gate_fails_up_on_corrupted_kv_with_both_outputs(
    cli: Cli, tb3: Any, tmp_path: Path
) -> None:
    inv = write_inventory(
        tb3, tmp_path / "inv.yaml", name="e2egate", decode_env={"STANDIN_CORRUPT_PULLED_KV": "1"}
    )
    res = cli("up", str(inv))
    out = res.stdout
    assert res.returncode == 1, output(res)
    assert "error: correctness gate: the P/D answer differs" in out, out
    pd = next(ln for ln in out.splitlines() if "through the router:" in ln)
    alone = next(ln for ln in out.splitlines() if "decode alone:" in ln)
    assert pd.split(":", 1)[1].strip() != alone.split(":", 1)[1].strip()
    assert len(alone.split(":", 1)[1].strip()) > 10  # a real answer, not an empty one
    assert "GPUDirect" in out and "Do not serve traffic" in out
    assert "endpoint:" not in out  # no endpoint advertised for a deployment that lies
    down_clean(cli, tb3, inv, "e2egate")


def test_gate_passes_speed_line_and_pd_status(cli: Cli, tb3: Any, tmp_path: Path) -> None:
    env = {"STANDIN_KV_BLOCK_BYTES": BLOCK_BYTES}
    inv = write_inventory(tb3, tmp_path / "inv.yaml", name="e2epd", prefill_env=env, decode_env=env)
    inv = _with(inv, requirements={"min_free_disk_gb": 1, "link_gbps": 100})
    res = cli("up", str(inv))
    out = res.stdout
    assert res.returncode == 0, output(res)
    assert "correctness gate: the P/D answer equals the single-engine answer" in out, out
    line = next(ln for ln in out.splitlines() if ln.startswith("KV speed: "))
    m = re.search(
        r"prefill@prefill -> decode@decode: ([\d.]+) MB in ([\d.]+) s = "
        r"([\d.]+) Gbit/s of a 100 Gbit/s link",
        line,
    )
    assert m is not None, line
    assert 20 <= float(m.group(1)) <= 100 and float(m.group(3)) > 0
    # a Python socket between network namespaces is far below 100 Gbit/s: "TCP fallback"
    assert "looks like UCX falling back to TCP" in out and "UCX_TLS" in out

    # a few requests through the router, then the P/D view of status
    endpoint = json.loads(cli("status", str(inv), "--json").stdout)["endpoint"]
    for i in range(3):
        body = {"model": "Qwen/Qwen3-0.6B", "prompt": f"Count to {i + 3}.", "max_tokens": 4}
        assert http_json(f"{endpoint}/completions", body)["choices"][0]["text"]
    doc = cli.status_json(inv)
    engines = {e["service"]: e for e in doc["pd"]["engines"]}
    assert set(engines) == {"prefill@prefill", "decode@decode"}
    dec, pre = engines["decode@decode"], engines["prefill@prefill"]
    assert dec["scraped"] and pre["scraped"]
    # prove + gate (router, direct) + speed pair + 3 requests
    assert dec["requests"] >= 6 and pre["requests"] >= 5
    assert dec["kv_transfers"] >= 5 and dec["kv_megabytes"] > 50
    assert dec["failed_transfers"] == 0 and pre["expired_leases"] == 0
    assert dec["ttft"]["p50"] is not None and dec["itl"]["p99"] is not None
    spread = {s["tier"]: s["requests"] for s in doc["pd"]["spread"]}
    assert spread["decode"] == {"decode@decode": dec["requests"]}
    assert doc["pd"]["window_seconds"] is None
    assert "decode_recomputes" not in {f["code"] for f in doc["pd"]["flags"]}
    # and the table in the terminal
    res = cli("status", str(inv))
    assert "P/D metrics, totals since start" in res.stdout, output(res)
    assert "decode spread: decode@decode" in res.stdout
    down_clean(cli, tb3, inv, "e2epd")


def test_prefill_removed_under_running_decode_restarts_it(
    cli: Cli, tb3: Any, tmp_path: Path
) -> None:
    """Part of the deployment gone (the prefill container removed, decode kept running):
    the next `up` creates the prefill, then restarts the decode, then the router."""
    inv = write_inventory(tb3, tmp_path / "inv.yaml", name="e2epart")
    assert cli("up", str(inv), "--no-speed").returncode == 0
    decode_started = started_at(tb3, "e2epart", "decode")
    pre = ids(tb3, "e2epart")["prefill@prefill"]
    tb3.hosts["prefill"].docker("rm", "-f", pre)
    res = cli("up", str(inv), "--no-speed")
    out = res.stdout
    assert res.returncode == 0, output(res)
    lines = out.splitlines()
    assert any("prefill@prefill" in ln and "create" in ln for ln in lines), out
    decode_line = next(ln for ln in lines if "decode@decode" in ln and "recreate" in ln)
    assert "prefill@prefill is (re)created in this run" in decode_line, out
    assert started_at(tb3, "e2epart", "decode") != decode_started
    # the decode restarted after the prefill was ready, and before the router
    ready = [ln for ln in lines if ln.startswith("ready ") and "proxy@" not in ln]
    order = [next(k for k in ("prefill@", "decode@", "router@") if k in ln) for ln in ready]
    assert order.index("prefill@") < len(order) - 1 - order[::-1].index("decode@")
    assert order[-1] == "router@", ready
    assert "correctness gate: the P/D answer equals" in out
    down_clean(cli, tb3, inv, "e2epart")
