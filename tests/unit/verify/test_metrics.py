"""pdmetrics on exposition text shaped as vLLM 0.33.0 exports it: names from the real metrics
dump (metrics.json), labels engine/model_name (alphabetical, as prometheus_client writes them),
histogram buckets with vLLM's own bounds, `_created` samples, HELP/TYPE comments."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from pdboot.verify import metrics as pm
from tests.shared_data import METRICS_JSON

MODEL = "Qwen/Qwen3-0.6B"
# vLLM 0.33.0 v1/metrics/loggers.py bucket bounds
BOUNDS_FROM_HALF = [0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, *BOUNDS_FROM_HALF]
TTFT_BUCKETS += [160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, *BOUNDS_FROM_HALF]


def _real_names() -> set[str]:
    data = json.loads(METRICS_JSON.read_text())
    return {n for m in data["metrics"] for n in m["exposed_as"]}


def _labels(engine: str, **extra: str) -> str:
    items = sorted({"engine": engine, "model_name": MODEL, **extra}.items())
    return ",".join(f'{k}="{v}"' for k, v in items)


def _hist(name: str, bounds: list[float], obs: list[float], engine: str) -> list[str]:
    lines = [f"# HELP {name} x", f"# TYPE {name} histogram"]
    for b in [*bounds, float("inf")]:
        le = "+Inf" if b == float("inf") else repr(float(b))
        n = sum(1 for o in obs if o <= b)
        lines.append(f"{name}_bucket{{{_labels(engine, le=le)}}} {float(n)}")
    lines.append(f"{name}_count{{{_labels(engine)}}} {float(len(obs))}")
    lines.append(f"{name}_sum{{{_labels(engine)}}} {float(sum(obs))}")
    lines.append(f"{name}_created{{{_labels(engine)}}} 1.7648e+09")
    return lines


def exposition(
    engine: str = "0",
    *,
    xfers: Sequence[tuple[float, float]] = (),
    failed: int = 0,
    expired: int = 0,
    success: int = 0,
    by_source: dict[str, int] | None = None,
    ttft: Sequence[float] = (),
    itl: Sequence[float] = (),
) -> str:
    """xfers: (bytes, seconds) per NIXL transfer."""
    lines: list[str] = []
    lines += _hist(
        "vllm:nixl_xfer_time_seconds", [0.001, 0.01, 0.1, 1.0, 10.0], [s for _, s in xfers], engine
    )
    lines += _hist("vllm:nixl_bytes_transferred", [1e6, 1e8, 1e10], [b for b, _ in xfers], engine)
    lines += [
        f"vllm:nixl_num_failed_transfers_total{{{_labels(engine)}}} {float(failed)}",
        f"vllm:nixl_num_kv_expired_reqs_total{{{_labels(engine)}}} {float(expired)}",
        f"vllm:request_success_total{{{_labels(engine, finished_reason='length')}}} "
        f"{float(success)}",
        f"vllm:request_success_total{{{_labels(engine, finished_reason='stop')}}} 0.0",
    ]
    for src, n in (by_source or {}).items():
        lines.append(
            f"vllm:prompt_tokens_by_source_total{{{_labels(engine, source=src)}}} {float(n)}"
        )
    lines += _hist("vllm:time_to_first_token_seconds", TTFT_BUCKETS, list(ttft), engine)
    lines += _hist("vllm:inter_token_latency_seconds", ITL_BUCKETS, list(itl), engine)
    return "\n".join(lines) + "\n"


def test_exposition_uses_only_real_vllm_names() -> None:
    real = _real_names()
    text = exposition(xfers=[(1e6, 0.01)], by_source={"local_compute": 1}, ttft=[0.1])
    used = {s.name for s in pm.parse_exposition(text) if not s.name.endswith("_created")}
    assert used <= real, used - real
    for name in (
        pm.FAILED_XFERS,
        pm.EXPIRED_LEASES,
        pm.REQUEST_SUCCESS,
        pm.PROMPT_BY_SOURCE,
        f"{pm.XFER_TIME}_sum",
        f"{pm.XFER_BYTES}_sum",
        f"{pm.TTFT}_bucket",
        f"{pm.ITL}_bucket",
    ):
        assert name in real


def test_engine_facts_counts() -> None:
    text = exposition(
        xfers=[(20e6, 0.02), (30e6, 0.03)],
        failed=1,
        expired=2,
        success=5,
        by_source={"external_kv_transfer": 900, "local_compute": 5},
    )
    f = pm.engine_facts(text)["0"]
    assert f.model_name == MODEL
    assert (f.kv_transfers, f.kv_bytes, f.kv_seconds) == (2, 50e6, pytest.approx(0.05))
    assert (f.failed_transfers, f.expired_leases, f.requests) == (1, 2, 5)
    assert f.external_tokens == 900 and f.local_compute_tokens == 5


def test_several_engines_kept_apart_and_merged() -> None:
    text = exposition("0", success=3) + exposition("1", success=4)
    facts = pm.engine_facts(text)
    assert sorted(facts) == ["0", "1"]
    assert facts["1"].requests == 4
    assert pm.merged(facts).requests == 7
    assert pm.merged(facts).ttft.count == 0


def test_label_values_with_escapes_and_timestamps() -> None:
    text = (
        'vllm:request_success_total{engine="0",finished_reason="length",'
        'model_name="a \\"b\\", c"} 3.0 1700000000000\n'
    )
    [s] = pm.parse_exposition(text)
    assert s.labels["model_name"] == 'a "b", c' and s.value == 3


def test_quantiles_interpolate_like_histogram_quantile() -> None:
    # 10 observations: 4 in (0.04,0.06], 4 in (0.06,0.08], 2 in (0.25,0.5]
    ttft = [0.05] * 4 + [0.07] * 4 + [0.3] * 2
    f = pm.engine_facts(exposition(ttft=ttft))["0"]
    p = f.percentiles("ttft")
    # rank 5 lies in the (0.06, 0.08] bucket holding ranks 5..8: 0.06 + 0.02 * (5-4)/4
    assert p["p50"] == pytest.approx(0.065)
    # rank 9 in (0.25, 0.5] holding ranks 9..10: 0.25 + 0.25 * (9-8)/2
    assert p["p90"] == pytest.approx(0.375)
    assert p["p99"] == pytest.approx(0.25 + 0.25 * (9.9 - 8) / 2)
    assert f.percentiles("itl") == {"p50": None, "p90": None, "p99": None}


def test_quantile_in_first_bucket_and_in_inf() -> None:
    f = pm.engine_facts(exposition(itl=[0.005, 0.005, 100.0]))["0"]
    assert f.itl.quantile(0.5) == pytest.approx(0.01 * 1.5 / 2)
    assert f.itl.quantile(0.99) == 80.0  # +Inf: the highest finite bound, as Prometheus


def test_quantile_of_an_inf_only_histogram_is_unknown() -> None:
    # the stand-in (and any exporter with no finite bounds) has a +Inf bucket only
    text = (
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0\n'
        'vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 4.0\n'
    )
    assert pm.engine_facts(text)["0"].percentiles("ttft")["p50"] is None


def test_delta_between_scrapes() -> None:
    before = pm.engine_facts(
        exposition(
            xfers=[(20e6, 0.02)], success=1, by_source={"external_kv_transfer": 100}, ttft=[0.05]
        )
    )["0"]
    after = pm.engine_facts(
        exposition(
            xfers=[(20e6, 0.02), (40e6, 0.5)],
            success=3,
            by_source={"external_kv_transfer": 300, "local_compute": 2},
            ttft=[0.05, 2.0, 2.0],
        )
    )["0"]
    d = after - before
    assert (d.kv_transfers, d.kv_bytes, d.requests) == (1, 40e6, 2)
    assert d.kv_seconds == pytest.approx(0.5)
    assert d.prompt_tokens_by_source == {"external_kv_transfer": 200, "local_compute": 2}
    assert d.ttft.count == 2 and d.ttft.quantile(0.5) == pytest.approx(1.0 + 1.5 * 0.5)


def test_recompute_flag() -> None:
    healthy = pm.engine_facts(
        exposition(success=4, by_source={"external_kv_transfer": 4000, "local_compute": 4})
    )["0"]
    assert pm.decode_recomputes("d0", healthy) is None
    bad = pm.engine_facts(
        exposition(success=4, by_source={"external_kv_transfer": 0, "local_compute": 4004})
    )["0"]
    flag = pm.decode_recomputes("d0", bad)
    assert flag is not None and flag.level == "fail" and "recomput" in flag.message


def test_idle_prefill_pool() -> None:
    idle = pm.engine_facts(exposition(success=0))["0"]
    busy = pm.engine_facts(exposition(success=9))["0"]
    flag = pm.idle_prefill_pool({"p0": idle, "p1": idle}, {"d0": busy})
    assert flag is not None and "p0, p1" in flag.message and "9 requests" in flag.message
    assert pm.idle_prefill_pool({"p0": busy}, {"d0": busy}) is None
    assert pm.idle_prefill_pool({"p0": idle}, {"d0": idle}) is None


def test_failing_transfers_and_expired_leases() -> None:
    f = pm.engine_facts(exposition(xfers=[(1e6, 0.1)], failed=3, expired=2))["0"]
    flag = pm.failing_transfers("d0", f)
    assert flag is not None and "3 failed" in flag.message and "(of 4)" in flag.message
    lease = pm.expired_leases("p0", f)
    assert lease is not None and lease.level == "warn"
    ok = pm.engine_facts(exposition(xfers=[(1e6, 0.1)]))["0"]
    assert pm.failing_transfers("d0", ok) is None and pm.expired_leases("p0", ok) is None


def _speed(nbytes: float, seconds: float) -> pm.PairSpeed:
    d = pm.engine_facts(exposition(xfers=[(nbytes, seconds)]))["0"]
    return pm.pair_speed("p0", "d0", d)


def test_speed_near_link_is_fine() -> None:
    s = _speed(200e6, 0.04)  # 40 Gbit/s on a 100 Gbit/s link
    assert s.gbps == pytest.approx(40.0)
    v = pm.speed_verdict(s, 100.0)
    assert v.flag is None and "(40%)" in v.line


def test_speed_far_below_link_looks_like_tcp() -> None:
    v = pm.speed_verdict(_speed(200e6, 0.8), 200.0)  # 2 Gbit/s on 200
    assert v.flag is not None and v.flag.code == "kv_tcp_fallback"
    for cause in ("UCX_TLS", "/dev/infiniband", "memlock", "UCX_NET_DEVICES", "GPUDirect"):
        assert cause in v.flag.message


def test_speed_too_few_bytes_or_no_link() -> None:
    assert "too little" in pm.speed_verdict(_speed(1e6, 1.0), 100.0).line
    v = pm.speed_verdict(_speed(100e6, 1.0), None)
    assert v.flag is None and "link_gbps" in v.line


def test_same_host_without_rdma_names_the_connector_cost() -> None:
    v = pm.speed_verdict(_speed(100e6, 1.0), None, same_host=True, rdma=False)
    assert v.flag is not None and "52607" in v.flag.message
    assert "NixlPushConnector" in v.flag.message
    push = pm.speed_verdict(
        _speed(100e6, 1.0), None, same_host=True, rdma=False, connector="NixlPushConnector"
    )
    assert push.flag is None


def _served(n: int) -> pm.EngineFacts:
    return pm.engine_facts(exposition(success=n))["0"]


def test_spread_line_and_pinned_flag() -> None:
    pinned = pm.spread("decode", {f"d{i}": _served(n) for i, n in enumerate((20, 0, 0, 0))})
    assert pinned.line() == "decode requests: d0 20, d1 0, d2 0, d3 0"
    flag = pinned.flag()
    assert flag is not None and "d0 took 20 of 20" in flag.message and "routing.md" in flag.message
    even = pm.spread("decode", {f"d{i}": _served(n) for i, n in enumerate((4, 4, 9, 3))})
    assert even.flag() is None
    few = pm.spread("prefill", {"p0": _served(3), "p1": _served(0)})
    assert few.flag() is None  # 3 requests over 2 engines say nothing yet
    assert pm.spread("prefill", {"p0": _served(30)}).flag() is None
