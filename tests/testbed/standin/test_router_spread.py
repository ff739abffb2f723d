"""How the real vllm-router 0.1.17 spreads sequential requests over 4 prefill + 4 decode
stand-in engines (loopback), counted from each engine's vllm:request_success_total with
pdboot.verify.metrics: the facts docs/routing.md rests on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pdboot.verify import metrics as pdmetrics
from tests.testbed.standin.router_proc import RouterProc
from tests.testbed.standin.test_standin import (
    engines,
    get,
    kv_config,
    post,
)

__all__ = ["engines"]
TOPICS = [
    "rivers",
    "volcanoes",
    "bridges",
    "owls",
    "tea",
    "glaciers",
    "chess",
    "violins",
    "comets",
    "bees",
    "deserts",
    "lighthouses",
    "coral",
    "maps",
    "bread",
    "kites",
    "caves",
    "clocks",
    "salt",
    "wolves",
]


def _served(url: str) -> float:
    return pdmetrics.merged(pdmetrics.engine_facts(get(url + "/metrics")[1])).requests


@pytest.fixture
def pool(engines: Any) -> tuple[list[Any], list[Any]]:
    pre = [
        engines(
            ["org/m", "--served-model-name", "m", "--kv-transfer-config", kv_config("kv_producer")],
            name="prefill",
        )
        for _ in range(4)
    ]
    dec = [
        engines(
            ["org/m", "--served-model-name", "m", "--kv-transfer-config", kv_config("kv_consumer")],
            name="decode",
        )
        for _ in range(4)
    ]
    return pre, dec


def _route(
    pool: tuple[list[Any], list[Any]], tmp: Path, prefill_policy: str, decode_policy: str
) -> tuple[pdmetrics.Spread, pdmetrics.Spread]:
    pre, dec = pool
    before = {e.url: _served(e.url) for e in pre + dec}
    args = [
        "--vllm-pd-disaggregation",
        *[a for e in pre for a in ("--prefill", e.url)],
        *[a for e in dec for a in ("--decode", e.url)],
        "--prefill-policy",
        prefill_policy,
        "--decode-policy",
        decode_policy,
    ]
    router = RouterProc(args, tmp / f"router-{prefill_policy}-{decode_policy}.log")
    try:
        url = router.url
        for i, topic in enumerate(TOPICS):
            body = {
                "model": "m",
                "max_tokens": 4,
                "prompt": f"Write two sentences about {topic} (request {i}).",
            }
            assert post(url + "/v1/completions", body)[0] == 200
    finally:
        router.stop()

    def tier(name: str, es: list[Any]) -> pdmetrics.Spread:
        return pdmetrics.Spread(
            name, {f"{name[0]}{i}": _served(e.url) - before[e.url] for i, e in enumerate(es)}
        )

    return tier("prefill", pre), tier("decode", dec)


def test_cache_aware_pins_sequential_requests_to_the_first_engine(
    pool: Any, tmp_path: Path
) -> None:
    p, d = _route(pool, tmp_path, "cache_aware", "cache_aware")
    assert list(p.requests.values()) == [20, 0, 0, 0]
    assert list(d.requests.values()) == [20, 0, 0, 0]
    assert p.flag() is not None and d.flag() is not None


def test_round_robin_and_power_of_two_spread(pool: Any, tmp_path: Path) -> None:
    p, d = _route(pool, tmp_path, "round_robin", "round_robin")
    assert list(p.requests.values()) == list(d.requests.values()) == [5, 5, 5, 5]
    p, d = _route(pool, tmp_path, "cache_aware", "power_of_two")
    assert list(p.requests.values()) == [20, 0, 0, 0]
    # random pairs: 18+ of 20 on one engine has a probability far below 1e-9
    assert d.flag() is None and sum(d.requests.values()) == 20, d.line()
