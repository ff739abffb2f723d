"""A prefill/decode pair that cannot exchange KV, end to end (issue 11): the real CLI against
testbed hosts, stand-in engines that refuse the NIXL handshake the way vLLM 0.33 does (the
real "NIXL compatibility hash mismatch" on the decode, a bare HTTP 500 to the client).

`up` must say why (cause and fix from the engines' logs), and must not call a deployment
healthy when the decode silently recomputed every prompt (kv_load_failure_policy=recompute).
Under CI=true a testbed that cannot start fails these tests; elsewhere they skip.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.cli import Cli, output
from tests.testbed.inventory import write_inventory

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

TOKEN_ENV = "PDBOOT_E2E_HF_TOKEN"


@pytest.fixture(scope="module")
def cli(cli: Cli) -> Cli:
    return cli.with_(env={TOKEN_ENV: "hf_e2eDIAGtoken0123456789"})


def inventory(tb: Any, path: Path, name: str, policy: str) -> Path:
    env = {"STANDIN_LOAD_SECONDS": "0.5"}
    overrides = {
        # the prefill tier alone stores its KV cache in fp8: NIXL's compatibility hash differs
        "prefill": {"env": env, "extra_args": ["--kv-cache-dtype", "fp8"]},
        "decode": {"env": env},
        "kv_transfer": {"kv_load_failure_policy": policy},
        "timeouts": {"ready_seconds": 60},
        "secrets": {"hf_token": f"env:{TOKEN_ENV}"},
    }
    return write_inventory(tb, path, name=name, overrides=overrides)


CAUSE = "cause (decode@decode): prefill and decode run incompatible configurations"


def up_fails(cli: Cli, inv: Path) -> str:
    """`up` without preflight, which must exit 1: what the operator read."""
    res = cli("up", str(inv), "--skip-preflight")
    out = output(res)
    print(out)  # shown with -s: what an operator reads
    assert res.returncode == 1, out
    return out


def test_kv_cache_dtype_mismatch_fails_up_with_cause_and_fix(
    cli: Cli, testbed_clean: Any, tmp_path: Path
) -> None:
    inv = inventory(testbed_clean, tmp_path / "inv.yaml", "kvdiag-fail", "fail")
    try:
        out = up_fails(cli, inv)
        assert "test chat completion through the router failed: HTTP 500" in out, out
        assert CAUSE in out and "NIXL compatibility hash mismatch" in out, out
        assert "fix: give both tiers the same image, model, --dtype, --kv-cache-dtype" in out
        assert "side-channel" not in out  # the broad handshake advice stays out of the way

        # the decode's own log carries vLLM's text; `logs --diagnose` reads it the same way
        logs = cli("logs", str(inv), "decode", "--diagnose", "--tail", "200")
        text = output(logs)
        assert logs.returncode == 0, text
        assert "RuntimeError: NIXL compatibility hash mismatch. Local: " in text
        assert "cause (decode@decode): prefill and decode run incompatible" in text
    finally:
        cli("down", str(inv))


def test_recompute_policy_makes_up_fail_on_the_recompute(
    cli: Cli, testbed_clean: Any, tmp_path: Path
) -> None:
    inv = inventory(testbed_clean, tmp_path / "inv.yaml", "kvdiag-recompute", "recompute")
    try:
        out = up_fails(cli, inv)
        assert "test completion: " in out  # the client got an answer ...
        # ... computed by the decode alone: vLLM's prompt-token accounting says so
        assert "the decode engine recomputed the prompt" in out, out
        assert 'prompt_tokens_by_source_total{source="local_compute"} grew by' in out
        assert "decode pulled the KV cache" not in out
        assert CAUSE in out, out
    finally:
        cli("down", str(inv))
