"""Issue 28, point 2: `secrets.api_key` with live workers, on the testbed (real sshd, dockerd,
Compose, vllm-router 0.1.17, nginx; stand-in engines that check the key like vLLM).

The proxy checks the clients' key (401 / 200); the router runs in gateway mode and takes its
workers at runtime, each registration naming the served model (without it 0.1.17 read the
model from the engines' /v1/models without a key, got 401, filed the workers under "unknown"
and answered 200 from one engine with no KV moved); the decode's counters show the prompt came
from the prefill (external_kv_transfer tokens); a decode host added under a client loop keeps
the router and fails no request."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.cli import Cli
from tests.testbed.rolling_load import change_under_load, inventory, router_identity
from tests.testbed.router_admin import router_json

pytestmark = [pytest.mark.testbed, pytest.mark.slow]
KEY = "pdk-live-Key-0123-abcdef"  # fake
KEY_ENV = "PDBOOT_E2E_LIVE_KEY"
# pinned: the default decode policy follows the tier's size (round_robin for one engine), and
# a policy change is a router change (test_router_swap.py), not what this test is about
POLICY = "round_robin"


def chat(endpoint: str, key: str | None) -> int:
    body = json.dumps(
        {"model": "Qwen/Qwen3-0.6B", "prompt": "one two three four five six", "max_tokens": 2}
    ).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(f"{endpoint}/v1/completions", data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def prompt_tokens(engine: str, source: str) -> float:
    """vllm:prompt_tokens_by_source_total{source=...} of one engine (/metrics is open)."""
    with urllib.request.urlopen(f"{engine}/metrics", timeout=30) as r:
        text = r.read().decode()
    pat = rf'^vllm:prompt_tokens_by_source_total\{{[^}}]*source="{source}"[^}}]*\}} (\S+)$'
    return sum(float(v) for v in re.findall(pat, text, re.M))


def test_a_key_keeps_live_workers_and_the_kv_path(
    cli: Cli, make_testbed: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    tb = make_testbed(["p1", "d1", "d2"])
    path = tb.dir / "inv.yaml"
    inventory(tb, path, prefill=["p1"], decode=["d1"], api_key_env=KEY_ENV, decode_policy=POLICY)
    res = cli("up", str(path), "--skip-preflight", "--no-speed")
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout + res.stderr
    assert "decode pulled the KV cache from a prefill engine" in out, out
    assert KEY not in out

    # live workers: the router was started in gateway mode and took both engines at runtime,
    # filed under the served model (not "unknown")
    cmd = tb.hosts["p1"].docker("inspect", "--format", "{{json .Config.Cmd}}", "pdboot-roll-router")
    assert "--enable-igw" in cmd.stdout, cmd.stdout + cmd.stderr
    workers = router_json(tb.hosts["p1"])["workers"]
    assert sorted((w["worker_type"], w["model_id"]) for w in workers) == [
        ("decode", "Qwen/Qwen3-0.6B"),
        ("prefill", "Qwen/Qwen3-0.6B"),
    ], workers

    endpoint = f"http://{tb.hosts['p1'].address}:8000"
    decode = f"http://{tb.hosts['d1'].address}:8201"
    assert chat(endpoint, None) == 401
    assert chat(endpoint, "wrong") == 401
    before = prompt_tokens(decode, "external_kv_transfer")
    assert chat(endpoint, KEY) == 200
    # the decode took the prompt's KV from the prefill: remote tokens, not its own compute
    assert prompt_tokens(decode, "external_kv_transfer") > before

    # a decode host added under load: the same router, no request lost
    first = router_identity(tb)
    inventory(
        tb, path, prefill=["p1"], decode=["d1", "d2"], api_key_env=KEY_ENV, decode_policy=POLICY
    )
    case = change_under_load(tb, "add d2 with a key", "rolling", path, ["--skip-preflight"], KEY)
    assert case.rc == 0, case.output
    assert case.failed == 0 and case.served >= 20, (case.errors, case.output)
    assert case.router_kept and router_identity(tb) == first, case.output
    assert KEY not in case.output
    urls = sorted(w["url"] for w in router_json(tb.hosts["p1"])["workers"])
    assert urls == sorted(
        [
            f"http://{tb.hosts['p1'].address}:8200",
            f"http://{tb.hosts['d1'].address}:8201",
            f"http://{tb.hosts['d2'].address}:8201",
        ]
    ), urls
    d2 = f"http://{tb.hosts['d2'].address}:8201"
    assert prompt_tokens(d2, "external_kv_transfer") > 0  # the new decode pulled KV too
    assert cli("down", str(path)).returncode == 0
