"""Router defaults per tier (docs/routing.md): decode power_of_two (round_robin for a single
decode: the real vllm-router 0.1.17 refuses power_of_two with one worker), prefill
cache_aware with thresholds that let load win early; the thresholds go only to a router
that uses them. With live workers (the default) vllm-router 0.1.17 runs in IGW mode, which
routes both tiers with one --policy (tried: the per-tier flags are ignored there), the
decode tier's; the per-tier flags are for the static lists (router.live_workers: false)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from pdboot.inventory.load import InventoryError
from pdboot.plan.build import build_plan
from tests.unit.orchestrator_fakes import inventory

TWO_DECODES = {"decode.hosts": ["d1", "r"]}


def _router_cmd(router: Mapping[str, Any], tiers: Mapping[str, Any] = TWO_DECODES) -> list[str]:
    """The router's command line, its section ``router`` (on host r) and the tiers ``tiers``."""
    inv = inventory({**tiers, "router": {"host": "r", **router}})
    return list(next(s for s in build_plan(inv).services() if s.role == "router").command)


def _flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_defaults_spread_decode_and_tune_prefill_affinity() -> None:
    cmd = _router_cmd({"live_workers": False})
    assert "--enable-igw" not in cmd and "--policy" not in cmd
    assert _flag(cmd, "--prefill-policy") == "cache_aware"
    assert _flag(cmd, "--decode-policy") == "power_of_two"
    assert _flag(cmd, "--cache-threshold") == "0.5"
    assert _flag(cmd, "--balance-abs-threshold") == "4"


def test_live_workers_route_both_tiers_with_the_decode_policy() -> None:
    cmd = _router_cmd({})
    assert "--enable-igw" in cmd and _flag(cmd, "--policy") == "power_of_two"
    assert "--prefill-policy" not in cmd and "--decode-policy" not in cmd
    assert "--cache-threshold" not in cmd  # no tier routes with cache_aware
    cmd = _router_cmd({"decode_policy": "cache_aware"})
    assert _flag(cmd, "--policy") == "cache_aware" and _flag(cmd, "--cache-threshold") == "0.5"


def test_one_decode_engine_gets_round_robin() -> None:
    assert _flag(_router_cmd({"live_workers": False}, {}), "--decode-policy") == ("round_robin")
    assert _flag(_router_cmd({}, {}), "--policy") == "round_robin"


def test_power_of_two_with_one_engine_is_refused() -> None:
    with pytest.raises(InventoryError, match="refuses power_of_two with fewer than 2 decode"):
        inventory({"router.decode_policy": "power_of_two"})


def test_thresholds_follow_the_inventory_and_vanish_without_cache_aware() -> None:
    cmd = _router_cmd({"cache_threshold": 0.8, "balance_abs_threshold": 16, "live_workers": False})
    assert (_flag(cmd, "--cache-threshold"), _flag(cmd, "--balance-abs-threshold")) == ("0.8", "16")
    cmd = _router_cmd({"prefill_policy": "random", "live_workers": False})
    assert "--cache-threshold" not in cmd and "--balance-abs-threshold" not in cmd
    cmd = _router_cmd({"decode_policy": "cache_aware", "live_workers": False})
    assert _flag(cmd, "--decode-policy") == "cache_aware"
