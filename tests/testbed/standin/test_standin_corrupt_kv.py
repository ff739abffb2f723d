"""STANDIN_CORRUPT_PULLED_KV: a decode whose pulled KV lands wrong answers 200 with other
words, and pdboot's correctness gate tells it from a healthy pair (loopback, a few seconds)."""

from __future__ import annotations

from typing import Any

from pdboot import gate
from tests.testbed.standin.test_standin import REQ, engines, kv_config, post, prefill

__all__ = ["engines"]  # the fixture, re-exported for pytest


def _pd_answer(engines: Any, env: dict[str, str]) -> tuple[str, str, dict[str, float]]:
    p = engines(["org/m", "--served-model-name", "m", "--kv-transfer-config",
                 kv_config("kv_producer")], name="prefill")
    d = engines(["org/m", "--served-model-name", "m", "--kv-transfer-config",
                 kv_config("kv_consumer")], env, name="decode")
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
