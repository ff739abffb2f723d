"""The KV proof on /metrics text in real vLLM 0.33.0's exposition format and names
(tests/unit/fixtures/vllm/, names from the shared fixture metrics.json)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pdboot.verify.probes as probes
from pdboot.verify.probes import KVCounters, kv_verdict, metric_sums_by

FIX = Path(__file__).parent / "fixtures" / "vllm"
METRICS = Path("/work/shared/fixtures/vllm-0.33.0/metrics.json")
if not METRICS.exists():  # checkouts without the shared tree still run the rest
    METRICS = Path(__file__).parent / "fixtures" / "vllm" / "metrics.json"


def _c(name: str) -> KVCounters:
    return KVCounters.parse((FIX / name).read_text())


def test_pdboot_reads_only_names_real_vllm_exports() -> None:
    exposed = {n for m in json.loads(METRICS.read_text())["metrics"] for n in m["exposed_as"]}
    source = Path(probes.__file__).read_text()
    read = set(re.findall(r'"(vllm:[a-z_:]+)"', source))
    assert read and read <= exposed, read - exposed


def test_remote_prefill_is_evidence() -> None:
    d = _c("decode-metrics-after-pull.txt") - _c("decode-metrics-before.txt")
    assert (d.xfers, d.external_tokens, d.local_tokens) == (1, 23, 1)
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
    v = kv_verdict(KVCounters(failures=1, local_tokens=1, known=True), 23)
    assert not v.ok and "FAILED" in v.message and "nixl_num_failed_transfers_total" in v.cause


def test_recompute_without_failure_counter_is_still_caught() -> None:
    d = KVCounters(local_tokens=23, known=True)
    v = kv_verdict(d, prompt_tokens=23)
    assert not v.ok and "recomputed" in v.message and 'source="local_compute"' in v.cause
    assert "kv_load_failure_policy=recompute" in v.cause


def test_the_last_token_computed_locally_is_normal() -> None:
    v = kv_verdict(KVCounters(xfers=1, external_tokens=22, local_tokens=1, known=True), 23)
    assert v.ok and v.confirmed


def test_no_transfer_at_all() -> None:
    v = kv_verdict(KVCounters(known=True))
    assert not v.ok and "no KV transfer" in v.message


def test_unknown_metrics_cannot_confirm() -> None:
    d = KVCounters.parse("vllm:num_requests_running 0.0\n") - KVCounters.parse("")
    v = kv_verdict(d)
    assert v.ok and not v.confirmed


def test_sums_over_engines_and_label_sets() -> None:
    text = (
        'vllm:prompt_tokens_by_source_total{model_name="m",engine="0",source="local_compute"} 2.0\n'
        'vllm:prompt_tokens_by_source_total{model_name="m",engine="1",source="local_compute"} 3.0\n'
        'vllm:prompt_tokens_by_source_total{model_name="m",engine="1",source="external_kv_transfer"}'
        " 7.0\n"
    )
    assert metric_sums_by(text, "vllm:prompt_tokens_by_source_total", "source") == {
        "local_compute": 5.0,
        "external_kv_transfer": 7.0,
    }
    t = KVCounters.total([KVCounters.parse(text), KVCounters(xfers=1, known=False)])
    assert (t.local_tokens, t.external_tokens, t.xfers, t.known) == (5, 7, 1, True)
