"""Router /workers and engine /metrics parsing, on output captured from the real vllm-router
0.1.17 and the testbed's stand-in engine (tests/unit/fixtures/deploy/)."""

from __future__ import annotations

from pathlib import Path

from pdboot.probes import KVCounters, RouterWorkers, completion_text, kv_verdict, metric_sums

FIX = Path(__file__).parent / "fixtures" / "deploy"


def _read(name: str) -> str:
    return (FIX / name).read_text()


def test_router_workers_from_real_router() -> None:
    w = RouterWorkers.parse(_read("router-workers-1p1d.json"))
    assert w.prefill == {"http://127.0.0.1:18200": True}
    assert w.decode == {"http://127.0.0.1:18201": True}
    assert w.missing(["http://127.0.0.1:18200"], ["http://127.0.0.1:18201/"]) == []
    assert w.missing(["http://127.0.0.1:18200", "http://10.0.0.9:8200"], []) == [
        "prefill http://10.0.0.9:8200"
    ]


def test_metric_sums_over_label_sets() -> None:
    s = metric_sums(_read("standin-decode-metrics-after.txt"))
    assert s["vllm:nixl_kv_pulls_total"] == 1.0
    assert s["vllm:request_success_total"] == 1.0


def test_kv_pull_is_evidence() -> None:
    before = KVCounters.parse(_read("standin-prefill-metrics.txt").replace("pulls_total{", "x{"))
    zero = KVCounters(0, 0, 0, 0, True)
    after = KVCounters.parse(_read("standin-decode-metrics-after.txt"))
    v = kv_verdict(after - zero)
    assert v.ok and v.confirmed and "4096 bytes" in v.message
    assert before.known


def test_local_prefill_is_not_evidence() -> None:
    before = KVCounters.parse(_read("standin-decode-metrics-before-local.txt"))
    after = KVCounters.parse(_read("standin-decode-metrics-after-local.txt"))
    v = kv_verdict(after - before)
    assert not v.ok and "recomputed" in v.message


def test_unknown_metrics_cannot_confirm() -> None:
    d = KVCounters.parse("vllm:num_requests_running 0.0\n") - KVCounters.parse("")
    v = kv_verdict(d)
    assert v.ok and not v.confirmed


def test_total_over_engines() -> None:
    t = KVCounters.total([KVCounters(1, 10, 0, 0, True), KVCounters(0, 0, 1, 0, False)])
    assert (t.pulls, t.bytes, t.local_prefills, t.known) == (1, 10, 1, True)


def test_completion_text() -> None:
    body = '{"choices": [{"index": 0, "message": {"role": "assistant", "content": " window"}}]}'
    assert completion_text(body) == " window"
    assert completion_text("not json") == ""
