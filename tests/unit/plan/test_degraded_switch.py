"""Degraded mode's router list (plan/degraded.py): which entries serve the engines in rotation,
and the order of the calls that switch between lists, walked against vllm-router 0.1.17's
routing rule as measured (tests/testbed/standin/test_degraded_router.py runs the real one)."""

from __future__ import annotations

import itertools

import pytest

from pdboot.inventory.schema import TierName
from pdboot.plan.degraded import (
    PLAIN,
    RouteChange,
    lost_tier,
    plain_url,
    routed_workers,
    serving_mode,
    switch_steps,
)

P1, P2, D1, D2 = "http://p1:8200", "http://p2:8200", "http://d1:8201", "http://d2:8201"
TIERS: dict[str, TierName] = {P1: "prefill", P2: "prefill", D1: "decode", D2: "decode"}


def routes(listed: dict[str, str]) -> bool:
    """vllm-router 0.1.17 --enable-igw, one model, as measured: with any prefill or decode
    entry it routes P/D and needs both; without one it routes to its regular entries."""
    kinds = set(listed.values())
    if kinds & {"prefill", "decode"}:
        return {"prefill", "decode"} <= kinds
    return PLAIN in kinds


def rotation(*urls: str) -> dict[str, TierName]:
    return {u: TIERS[u] for u in urls}


def test_modes_and_the_tier_each_loses() -> None:
    assert serving_mode(rotation(P1, D1)) == "pd"
    assert serving_mode(rotation(D1, D2)) == "decode_only"
    assert serving_mode(rotation(P2)) == "prefill_only"
    assert serving_mode({}) == "down"
    assert [lost_tier(m) for m in ("pd", "decode_only", "prefill_only")] == [
        None,
        "prefill",
        "decode",
    ]


def test_pd_lists_every_engine_as_its_tier_and_nothing_plain() -> None:
    assert routed_workers(rotation(P1, D1, D2)) == {P1: "prefill", D1: "decode", D2: "decode"}


def test_degraded_lists_the_serving_tier_as_plain_workers_only() -> None:
    """A P/D entry beside them would turn P/D routing on and answer 503."""
    assert routed_workers(rotation(D1, D2)) == {D1 + "/.": PLAIN, D2 + "/.": PLAIN}
    assert routed_workers(rotation(P1, P2)) == {P1 + "/.": PLAIN, P2 + "/.": PLAIN}
    assert plain_url(P1 + "/.") == P1 + "/."


STATES = [(P1, D1), (D1,), (P1,), (P1, P2, D1, D2), (D1, D2), (P2, D2), (P1, P2)]


@pytest.mark.parametrize(("before", "after"), list(itertools.permutations(STATES, 2)))
def test_every_list_between_the_steps_of_a_switch_routes(
    before: tuple[str, ...], after: tuple[str, ...]
) -> None:
    """Between two steps the router routes every request; only inside the one step that sends
    P/D entries together can it answer 503 (the module docstring)."""
    listed = routed_workers(rotation(*before))
    assert routes(listed)
    steps = switch_steps(listed, routed_workers(rotation(*after)))
    assert sum(1 for s in steps if any(c.worker_type != PLAIN for c in s)) <= 1
    for s in steps:
        for c in s:
            if c.action == "add":
                listed[c.url] = c.worker_type
            else:
                del listed[c.url]
        assert routes(listed), (s, listed)
    assert listed == routed_workers(rotation(*after))


def test_a_lost_prefill_plain_decodes_first_then_the_pd_entries_go_and_back_the_reverse() -> None:
    pd, degraded = routed_workers(rotation(P1, D1)), routed_workers(rotation(D1))
    assert switch_steps(pd, degraded) == [
        (RouteChange("add", D1 + "/.", PLAIN),),
        (RouteChange("remove", D1, "decode"), RouteChange("remove", P1, "prefill")),
    ]
    assert switch_steps(degraded, pd) == [
        (RouteChange("add", D1, "decode"), RouteChange("add", P1, "prefill")),
        (RouteChange("remove", D1 + "/.", PLAIN),),
    ]


def test_one_decode_more_or_less_in_pd_is_one_call() -> None:
    assert switch_steps(routed_workers(rotation(P1, D1, D2)), routed_workers(rotation(P1, D1))) == [
        (RouteChange("remove", D2, "decode"),)
    ]


def test_an_entry_of_the_wrong_type_is_removed_before_it_is_added_again() -> None:
    assert switch_steps({D1: "prefill", P1: "prefill"}, {P1: "prefill", D1: "decode"}) == [
        (RouteChange("remove", D1, "prefill"),),
        (RouteChange("add", D1, "decode"),),
    ]
