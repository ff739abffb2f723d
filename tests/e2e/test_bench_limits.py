"""Issue 42 point 3 end to end: the proxy's limits (router.proxy_limits) let a full-speed
benchmark client through untouched, and do limit a client above them. The real nginx, the real
router, stand-in engines, `pdboot bench` with the real AIPerf. The limited count is what
`pdboot bench` reads from AIPerf's files (HTTP 429, the limiter's status); nginx's own error
log is read too, so neither side alone decides."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli import Cli, output
from tests.conftest import aiperf_for_tests
from tests.testbed import images

pytestmark = [pytest.mark.testbed, pytest.mark.slow]
NAME = "e2elimits"
FAST = {"STANDIN_LOAD_SECONDS": "0.5"}
REQUESTS = 150  # per level; at 64 at once a stand-in answers in well under a second


def tokenizer_dir() -> Path:
    """A tokenizer for AIPerf: the tiny model's directory .ci/setup makes (its files only;
    the stand-in engines never read it)."""
    found = sorted(images.CACHE_DIR.glob(f"model-{images.CPU_MODEL_NAME}-*/tokenizer.json"))
    if not found:
        pytest.fail(f"no tiny model tokenizer under {images.CACHE_DIR} (.ci/setup makes it)")
    return found[-1].parent


def bench(
    cli: Cli, inv: Path, out: Path, aiperf: list[str], levels: str
) -> tuple[Any, dict[str, Any]]:
    res = cli(
        "bench", str(inv), "--tokenizer", str(tokenizer_dir()),
        "--concurrency", levels, "--requests", str(REQUESTS), "--isl", "32", "--osl", "4",
        "--out-dir", str(out),
        env={"PDBOOT_AIPERF": aiperf[0]}, timeout=600,
    )  # fmt: skip
    results = out / "results.json"
    return res, json.loads(results.read_text()) if results.exists() else {}


def proxy_log(tb: Any) -> str:
    host = tb.hosts["ingress"]
    logs = host.docker("logs", f"pdboot-{NAME}-proxy", check=False)
    return logs.stdout + logs.stderr


def test_full_speed_bench_is_never_limited_and_a_faster_client_is(
    testbed_clean: Any, tmp_path: Path, cli: Cli
) -> None:
    tb = testbed_clean
    aiperf = aiperf_for_tests()
    inv = tb.inventory(
        tmp_path / "inv.yaml", name=NAME,
        overrides={"prefill": {"env": FAST}, "decode": {"env": FAST}},
    )  # fmt: skip
    cli("up", str(inv), "--skip-preflight", check=True)
    try:
        res, doc = bench(cli, inv, tmp_path / "defaults", aiperf, "4,64")
        assert res.returncode == 0, output(res)[-6000:]
        pd = [r for r in doc["runs"] if r["role"] == "pd"]
        assert pd, doc
        for run in pd:  # every level through the proxy: all answered, none limited
            assert run["refused"] is None, run
            assert run["result"]["failed_requests"] == 0, run["result"]
            assert run["result"]["limited_requests"] == 0, run["result"]
            assert run["result"]["ok_requests"] == REQUESTS, run["result"]
        assert "limiting" not in proxy_log(tb)  # nginx logs each limited request
        # the reverse, so the check above could fail: two requests a second, a burst of 20
        # (`up`'s own checks through the endpoint fit in it)
        low = yaml.safe_load(inv.read_text())
        low["router"]["proxy_limits"] = {
            "requests_per_second_per_client": 2, "request_burst_per_client": 20,
        }  # fmt: skip
        inv.write_text(yaml.safe_dump(low, sort_keys=False))
        cli("up", str(inv), "--skip-preflight", check=True)
        res, doc = bench(cli, inv, tmp_path / "low", aiperf, "16")
        said = output(res) + json.dumps(doc)
        assert "limited by the proxy" in said, said[-6000:]
        assert "limiting requests" in proxy_log(tb)
    finally:
        cli("down", str(inv))
