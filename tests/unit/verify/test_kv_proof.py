"""The KV proof on /metrics text in real vLLM 0.33.0's exposition format and names
(tests/unit/fixtures/vllm/, names from the shared fixture metrics.json)."""

from __future__ import annotations

import json

import pdboot.verify.metrics as metrics
import pdboot.verify.probes as probes
from pdboot.verify.metrics import EngineFacts, engine_facts, server_facts, total
from pdboot.verify.probes import kv_verdict
from tests.shared_data import METRICS_JSON
from tests.unit.paths import FIXTURES

FIX = FIXTURES / "vllm"


def local(n: float) -> dict[str, float]:
    return {"local_compute": float(n)}


METRICS = METRICS_JSON  # vLLM 0.33.0's real /metrics names (tests/shared_data.py)


def _c(name: str) -> EngineFacts:
    return server_facts((FIX / name).read_text())


def test_pdboot_reads_only_names_real_vllm_exports() -> None:
    exposed = {n for m in json.loads(METRICS.read_text())["metrics"] for n in m["exposed_as"]}
    # the KV proof reads the names of metrics.KV_EVIDENCE and cites probes' in its causes
    read = set(metrics.KV_EVIDENCE) | {probes.KV_XFERS, probes.KV_FAILED, probes.BY_SOURCE}
    assert read and read <= exposed, read - exposed


def test_remote_prefill_is_evidence() -> None:
    d = _c("decode-metrics-after-pull.txt") - _c("decode-metrics-before.txt")
    assert (d.kv_transfers, d.external_tokens, d.local_compute_tokens) == (1, 23, 1)
    v = kv_verdict(d, prompt_tokens=23)
    assert v.ok and v.confirmed and "458752 bytes" in v.message and v.cause == ""


def test_recompute_is_a_failure_with_its_cause() -> None:
    d = _c("decode-metrics-after-recompute.txt") - _c("decode-metrics-before.txt")
    v = kv_verdict(d, prompt_tokens=23)
    assert not v.ok and v.confirmed
    assert "recomputed the prompt (23 of 23 tokens" in v.message
    assert 'source="local_compute"} grew by 23' in v.cause
    assert "vllm:nixl_num_failed_transfers_total by 1" in v.cause


def test_a_failed_transfer_is_a_failure() -> None:
    d = EngineFacts(failed_transfers=1, prompt_tokens_by_source=local(1), known=True)
    v = kv_verdict(d, 23)
    assert not v.ok and "FAILED" in v.message and "nixl_num_failed_transfers_total" in v.cause


def test_recompute_without_failure_counter_is_still_caught() -> None:
    d = EngineFacts(prompt_tokens_by_source=local(23), known=True)
    v = kv_verdict(d, prompt_tokens=23)
    assert not v.ok and "recomputed" in v.message and 'source="local_compute"' in v.cause
    assert "kv_load_failure_policy=recompute" in v.cause


def test_the_last_token_computed_locally_is_normal() -> None:
    src = {"external_kv_transfer": 22.0, "local_compute": 1.0}
    v = kv_verdict(EngineFacts(kv_transfers=1, prompt_tokens_by_source=src, known=True), 23)
    assert v.ok and v.confirmed


def test_concurrent_client_requests_are_not_a_recompute() -> None:
    # `up` rolling a change while clients are served (bench/rolling.py, case c): 9 other
    # pulled requests finished in the proof's window, each computing its last token locally
    src = {"external_kv_transfer": 35.0, "local_compute": 9.0}
    busy = EngineFacts(kv_transfers=9, requests=9, prompt_tokens_by_source=src, known=True)
    assert kv_verdict(busy, 11).ok
    # measured on the testbed: 10 local of 38 external, 10 pulls, the requests' successes
    # not counted yet (they finish after the window)
    src = {"external_kv_transfer": 38.0, "local_compute": 10.0}
    lagging = EngineFacts(kv_transfers=10, requests=0, prompt_tokens_by_source=src, known=True)
    assert kv_verdict(lagging, 11).ok
    # ... but the test request's whole prompt recomputed among them still shows
    src = {"external_kv_transfer": 35.0, "local_compute": 9.0 + 11.0}
    bad = EngineFacts(kv_transfers=9, requests=10, prompt_tokens_by_source=src, known=True)
    assert not kv_verdict(bad, 11).ok


def test_no_transfer_at_all() -> None:
    v = kv_verdict(EngineFacts(known=True))
    assert not v.ok and "no KV transfer" in v.message


def test_unknown_metrics_cannot_confirm() -> None:
    d = server_facts("vllm:num_requests_running 0.0\n") - server_facts("")
    v = kv_verdict(d)
    assert v.ok and not v.confirmed


def test_sums_over_engines_and_label_sets() -> None:
    text = (
        'vllm:prompt_tokens_by_source_total{model_name="m",engine="0",source="local_compute"} 2.0\n'
        'vllm:prompt_tokens_by_source_total{model_name="m",engine="1",source="local_compute"} 3.0\n'
        'vllm:prompt_tokens_by_source_total{model_name="m",engine="1",source="external_kv_transfer"}'
        " 7.0\n"
    )
    assert total(engine_facts(text).values()).prompt_tokens_by_source == {
        "local_compute": 5.0,
        "external_kv_transfer": 7.0,
    }
    t = total([server_facts(text), EngineFacts(kv_transfers=1, known=False)])
    assert (t.local_compute_tokens, t.external_tokens, t.kv_transfers, t.known) == (5, 7, 1, True)
