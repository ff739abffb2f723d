"""Router /workers and engine /metrics parsing, on output captured from the real vllm-router
0.1.17 and the testbed's stand-in engine (tests/unit/fixtures/deploy/)."""

from __future__ import annotations

from pdboot.verify.metrics import server_facts
from pdboot.verify.probes import RouterWorkers, completion_text
from tests.unit.paths import FIXTURES

FIX = FIXTURES / "deploy"


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


def test_metrics_sum_over_label_sets() -> None:
    s = server_facts(_read("standin-decode-metrics-after.txt"))
    assert s.requests == 1.0


def test_completion_text() -> None:
    body = '{"choices": [{"index": 0, "message": {"role": "assistant", "content": " window"}}]}'
    assert completion_text(body) == " window"
    assert completion_text("not json") == ""
