"""A prefill/decode pair that cannot exchange KV, end to end (issue 11): the real CLI against
testbed hosts, stand-in engines that refuse the NIXL handshake the way vLLM 0.33 does (the
real "NIXL compatibility hash mismatch" on the decode, a bare HTTP 500 to the client).

`up` must say why (cause and fix from the engines' logs), and must not call a deployment
healthy when the decode silently recomputed every prompt (kv_load_failure_policy=recompute).
Under CI=true a testbed that cannot start fails these tests; elsewhere they skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TOKEN_ENV = "PDBOOT_E2E_HF_TOKEN"


def inventory(tb: Any, path: Path, name: str, policy: str) -> Path:
    env = {"STANDIN_LOAD_SECONDS": "0.5"}
    inv: dict[str, Any] = {
        "name": name,
        "model": "Qwen/Qwen3-0.6B",
        "image": tb.image,
        "router_image": tb.router_image,
        "ssh": {
            "user": "root",
            "identity_file": str(tb.identity_file),
            "known_hosts": str(tb.known_hosts),
            "use_ssh_config": False,
            "connect_timeout": 5,
        },
        "hosts": {h: {"address": tb.hosts[h].address} for h in ("prefill", "decode", "ingress")},
        # the prefill tier alone stores its KV cache in fp8: NIXL's compatibility hash differs
        "prefill": {"hosts": ["prefill"], "env": env, "extra_args": ["--kv-cache-dtype", "fp8"]},
        "decode": {"hosts": ["decode"], "env": env},
        "router": {"host": "ingress", "proxy_image": tb.proxy_image},
        "kv_transfer": {"kv_load_failure_policy": policy},
        "weights": {
            "stage": False
        },  # a name only: no hub serves it (tests/e2e/test_weights_staged_once_per_host.py)
        "container": {"ulimits": {"memlock": 8388608, "nofile": 20000}, "shm_size": "1g"},
        "requirements": {"min_free_disk_gb": 1},
        "timeouts": {
            "ready_seconds": 60,
            "router_ready_seconds": 60,
            "poll_interval_seconds": 0.2,
            "pull_seconds": 300,
        },
        "secrets": {"hf_token": f"env:{TOKEN_ENV}"},
    }
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def pdboot(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **{TOKEN_ENV: "hf_e2eDIAGtoken0123456789"}, COLUMNS="200", TERM="dumb")
    return subprocess.run(
        [sys.executable, "-m", "pdboot", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )


def output(res: subprocess.CompletedProcess[str]) -> str:
    return res.stdout + res.stderr


CAUSE = "cause (decode@decode): prefill and decode run incompatible configurations"


def test_kv_cache_dtype_mismatch_fails_up_with_cause_and_fix(
    testbed_clean: Any, tmp_path: Path
) -> None:
    inv = inventory(testbed_clean, tmp_path / "inv.yaml", "kvdiag-fail", "fail")
    try:
        res = pdboot("up", str(inv), "--skip-preflight")
        out = output(res)
        print(out)  # shown with -s: what an operator reads
        assert res.returncode == 1, out
        assert "test chat completion through the router failed: HTTP 500" in out, out
        assert CAUSE in out and "NIXL compatibility hash mismatch" in out, out
        assert "fix: give both tiers the same image, model, --dtype, --kv-cache-dtype" in out
        assert "side-channel" not in out  # the broad handshake advice stays out of the way

        # the decode's own log carries vLLM's text; `logs --diagnose` reads it the same way
        logs = pdboot("logs", str(inv), "decode", "--diagnose", "--tail", "200")
        text = output(logs)
        assert logs.returncode == 0, text
        assert "RuntimeError: NIXL compatibility hash mismatch. Local: " in text
        assert "cause (decode@decode): prefill and decode run incompatible" in text
    finally:
        pdboot("down", str(inv))


def test_recompute_policy_makes_up_fail_on_the_recompute(
    testbed_clean: Any, tmp_path: Path
) -> None:
    inv = inventory(testbed_clean, tmp_path / "inv.yaml", "kvdiag-recompute", "recompute")
    try:
        res = pdboot("up", str(inv), "--skip-preflight")
        out = output(res)
        print(out)  # shown with -s: what an operator reads
        assert res.returncode == 1, out
        assert "test completion: " in out  # the client got an answer ...
        # ... computed by the decode alone: vLLM's prompt-token accounting says so
        assert "the decode engine recomputed the prompt" in out, out
        assert 'prompt_tokens_by_source_total{source="local_compute"} grew by' in out
        assert "decode pulled the KV cache" not in out
        assert CAUSE in out, out
    finally:
        pdboot("down", str(inv))
