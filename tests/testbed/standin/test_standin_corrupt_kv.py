"""STANDIN_CORRUPT_PULLED_KV: a decode whose pulled KV lands wrong answers 200 with other
words, and pdboot's correctness gate tells it from a healthy pair (loopback, a few seconds)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pdboot.verify import gate
from tests.testbed.standin.router_proc import RouterProc
from tests.testbed.standin.test_standin import (
    REQ,
    Engine,
    engines,
    pd_pair,
    post,
    prefill,
)

__all__ = ["engines"]  # the fixture, re-exported for pytest


def _pd_answer(engines: Any, env: dict[str, str]) -> tuple[str, str, dict[str, float]]:
    p, d = pd_pair(engines, decode_env=env)
    params = prefill(p)
    status, body = post(d.url + "/v1/completions", {**REQ, "kv_transfer_params": params})
    assert status == 200, body
    status, alone = post(d.url + "/v1/completions", REQ)  # the decode prefilling locally
    assert status == 200, alone
    return body["choices"][0]["text"], alone["choices"][0]["text"], d.metrics()


def test_healthy_pull_gives_the_single_engine_answer(engines: Any) -> None:
    pd, alone, _ = _pd_answer(engines, {})
    assert gate.classify(pd, alone).verdict == "identical"


def test_corrupted_kv_answers_200_with_wrong_tokens_and_the_gate_fails(engines: Any) -> None:
    pd, alone, m = _pd_answer(engines, {"STANDIN_CORRUPT_PULLED_KV": "1"})
    # the transfer itself "succeeded", as on a broken GPUDirect path
    assert m["vllm:nixl_bytes_transferred_count"] == 1
    assert m["vllm:nixl_num_failed_transfers_total"] == 0
    assert pd != alone and len(pd.split()) == len(alone.split()) == REQ["max_tokens"]
    out = gate.classify(pd, alone)
    assert out.verdict == "broken" and not out.ok


def _post_text(url: str, body: dict[str, Any]) -> tuple[int, str]:
    status, data = post(url, body)
    return status, data if isinstance(data, str) else json.dumps(data)


@contextmanager
def _router(prefill_e: Engine, decode_e: Engine, tmp: Path) -> Iterator[str]:
    router = RouterProc(
        ["--vllm-pd-disaggregation", "--prefill", prefill_e.url, "--decode", decode_e.url],
        tmp / "router.log",
    )
    try:
        yield router.url
    finally:
        router.stop()


@pytest.mark.parametrize("corrupt", [False, True])
def test_gate_through_the_real_router(engines: Any, tmp_path: Path, corrupt: bool) -> None:
    env = {"STANDIN_CORRUPT_PULLED_KV": "1"} if corrupt else {}
    p, d = pd_pair(engines, decode_env=env)
    with _router(p, d, tmp_path) as url:
        out = gate.run_gate(_post_text, url, d.url, "m")
    assert d.metrics()["vllm:nixl_bytes_transferred_count"] == 1  # the P/D path was taken
    if corrupt:
        assert out.verdict == "broken" and not out.ok, out.message()
        assert "dynamo#12463" in out.message()
    else:
        assert out.verdict == "identical", out.message()
