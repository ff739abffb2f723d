"""pdmetrics on the stand-in's /metrics (vLLM names) after real pulls over the side channel
(loopback): the facts, the per-pair speed and the verdict against a declared link rate."""

from __future__ import annotations

from typing import Any

from pdboot.verify import metrics as pdmetrics
from tests.testbed.standin.test_standin import PREFILL_PARAMS, engines, get, kv_config, post

__all__ = ["engines"]
BLOCK = 1_000_000  # STANDIN_KV_BLOCK_BYTES: 1 MB per 16-token block
PROMPT = "The quick brown fox jumps over the lazy dog. " * 30  # 300 tokens: 19 blocks


def _facts(url: str) -> pdmetrics.EngineFacts:
    return pdmetrics.merged(pdmetrics.engine_facts(get(url + "/metrics")[1]))


def test_kv_speed_of_a_pair_from_real_metric_names(engines: Any) -> None:
    env = {"STANDIN_KV_BLOCK_BYTES": str(BLOCK)}
    p = engines(
        ["org/m", "--served-model-name", "m", "--kv-transfer-config", kv_config("kv_producer")],
        env,
        name="prefill",
    )
    d = engines(
        ["org/m", "--served-model-name", "m", "--kv-transfer-config", kv_config("kv_consumer")],
        env,
        name="decode",
    )
    before = _facts(d.url)
    req = {"model": "m", "prompt": PROMPT, "max_tokens": 4}
    for i in range(2):
        status, body = post(
            p.url + "/v1/completions",
            {**req, "max_tokens": 1, "kv_transfer_params": PREFILL_PARAMS},
            {"X-Request-Id": f"r{i}"},
        )
        assert status == 200, body
        status, body = post(
            d.url + "/v1/completions", {**req, "kv_transfer_params": body["kv_transfer_params"]}
        )
        assert status == 200, body
    delta = _facts(d.url) - before
    assert delta.kv_transfers == 2 and delta.kv_bytes == 2 * 19 * BLOCK
    assert delta.requests == 2 and delta.external_tokens == 2 * 300
    # TTFT and ITL histograms under vLLM's names and buckets: one TTFT per request, three
    # ITLs (4 tokens) per decode request
    assert delta.ttft.count == 2 and delta.itl.count == 2 * 3
    assert delta.percentiles("ttft")["p50"] is not None
    assert pdmetrics.decode_recomputes("decode", delta) is None
    assert pdmetrics.failing_transfers("decode", delta) is None

    speed = pdmetrics.pair_speed("prefill", "decode", delta)
    assert speed.gbps is not None and speed.gbps > 0
    # a Python socket on loopback is far below a declared 10 Tbit/s link: "TCP fallback"
    v = pdmetrics.speed_verdict(speed, 10_000.0)
    assert v.flag is not None and v.flag.code == "kv_tcp_fallback", v.line
    assert "38.0 MB" in v.line

    # the same decode answering without params prefills locally: the recompute flag fires
    before = _facts(d.url)
    assert post(d.url + "/v1/completions", req)[0] == 200
    flag = pdmetrics.decode_recomputes("decode", _facts(d.url) - before)
    assert flag is not None and flag.code == "decode_recomputes"
