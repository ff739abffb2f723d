"""watch's decisions from plain observations and a fake clock: who is blamed, eviction and the
last-of-tier alert, re-admission after N good rounds, restarts only for peer faults and at most
once per backoff window."""

from __future__ import annotations

from pdboot.plan.watch.policy import (
    Alert,
    Blame,
    Evict,
    PairCheck,
    Readmit,
    Restart,
    Round,
    WatchConfig,
    WatchedEngine,
    WatchState,
    blame,
    initial_state,
    step,
)

P1, P2 = WatchedEngine("p1", "prefill", "http://p1"), WatchedEngine("p2", "prefill", "http://p2")
D1, D2 = WatchedEngine("d1", "decode", "http://d1"), WatchedEngine("d2", "decode", "http://d2")
TWO_BY_TWO = [P1, P2, D1, D2]
CFG = WatchConfig(interval_seconds=1, readmit_after=3, restart_after=2, restart_backoff_seconds=100)


def good(p: str, d: str) -> PairCheck:
    return PairCheck(p, d, "good", pulled_tokens=40, seconds=0.1)


def wrong(p: str, d: str) -> PairCheck:
    return PairCheck(p, d, "wrong", "compare", "differs in the first 8 words", pulled_tokens=40)


def hang(p: str, d: str) -> PairCheck:
    return PairCheck(p, d, "hang", "decode", "timed out")


def rnd(
    now: float,
    bad: dict[tuple[str, str], PairCheck] | None = None,
    health: dict[str, bool] | None = None,
    engines: list[WatchedEngine] = TWO_BY_TWO,
) -> Round:
    pres = [e.key for e in engines if e.tier == "prefill"]
    decs = [e.key for e in engines if e.tier == "decode"]
    pairs = tuple((bad or {}).get((p, d), good(p, d)) for p in pres for d in decs)
    return Round(now, pairs, health or {e.key: True for e in engines})


def run(
    rounds: list[Round], engines: list[WatchedEngine] = TWO_BY_TWO, cfg: WatchConfig = CFG
) -> tuple[WatchState, list[list[object]]]:
    state = initial_state(engines)
    out: list[list[object]] = []
    for r in rounds:
        state, acts = step(cfg, engines, state, r)
        out.append(list(acts))
    return state, out


def flat(acts: list[list[object]]) -> list[object]:
    return [a for each in acts for a in each]


def test_a_decode_wrong_with_every_prefill_is_blamed_not_the_prefills() -> None:
    r = rnd(0, {("p1", "d1"): wrong("p1", "d1"), ("p2", "d1"): wrong("p2", "d1")})
    assert set(blame(TWO_BY_TWO, r)) == {"d1"}


def test_a_prefill_that_breaks_both_decodes_is_blamed_not_the_decodes() -> None:
    one_p = [P1, D1, D2]
    r = rnd(0, {("p1", "d1"): hang("p1", "d1"), ("p1", "d2"): hang("p1", "d2")}, engines=one_p)
    assert set(blame(one_p, r)) == {"p1"}


def test_health_failing_blames_that_engine_and_spares_its_peers() -> None:
    r = rnd(
        0,
        {
            ("p1", "d2"): PairCheck("p1", "d2", "error", "decode", "HTTP 503"),
            ("p2", "d2"): PairCheck("p2", "d2", "error", "decode", "HTTP 503"),
        },
        health={"p1": True, "p2": True, "d1": True, "d2": False},
    )
    assert blame(TWO_BY_TWO, r) == {"d2": Blame("health", "d2: /health failing")}


def test_good_pairs_with_failed_transfers_count_as_bad() -> None:
    p = PairCheck("p1", "d1", "good", pulled_tokens=0, failed_transfers=2)
    assert p.fault == "failed_transfers" and not p.ok
    assert PairCheck("p1", "d1", "good", pulled_tokens=0).fault == "no_kv_pulled"
    assert PairCheck("p1", "d1", "late", pulled_tokens=9).ok


def test_evicted_on_the_first_bad_round_then_readmitted_after_three_good() -> None:
    bad = {("p1", "d1"): wrong("p1", "d1"), ("p2", "d1"): wrong("p2", "d1")}
    state, acts = run([rnd(0, bad), rnd(1, bad), rnd(2), rnd(3), rnd(4), rnd(5)])
    assert acts[0] == [Evict("d1", "decode", "wrong_answer", wrong("p1", "d1").reason())]
    assert acts[1:4] == [[], [], []]  # still bad, then two good rounds: out of rotation
    assert acts[4] == [Readmit("d1", "decode", 3)]
    assert acts[5] == [] and state.engines["d1"].in_rotation


def test_a_bad_round_resets_the_good_streak() -> None:
    bad = {("p1", "d1"): wrong("p1", "d1"), ("p2", "d1"): wrong("p2", "d1")}
    _, acts = run([rnd(0, bad), rnd(1), rnd(2), rnd(3, bad), rnd(4), rnd(5), rnd(6)])
    assert [type(a).__name__ for a in flat(acts)] == ["Evict", "Readmit"]
    assert acts[6] == [Readmit("d1", "decode", 3)]


def test_one_pair_a_tie_blames_the_decode_on_the_second_round_and_alerts_once() -> None:
    one_one = [P1, D1]
    bad = {("p1", "d1"): wrong("p1", "d1")}
    state, acts = run([rnd(t, bad, engines=one_one) for t in range(3)], engines=one_one)
    assert acts[0] == []  # a tie: not certain after one round
    assert [(type(a), a.engine) for a in acts[1]] == [(Alert, "d1")]  # type: ignore[attr-defined]
    assert acts[2] == []  # once per bad spell
    assert all(s.in_rotation for s in state.engines.values())
    assert isinstance(acts[1][0], Alert) and "last decode engine" in acts[1][0].reason


def test_a_fault_seen_by_half_a_round_evicts_nobody_on_that_round() -> None:
    # the side channel of p1 died between its two canaries: p1 -> d2 failed, p1 -> d1 did not
    half = {("p1", "d2"): hang("p1", "d2")}
    whole = {("p1", "d1"): hang("p1", "d1"), ("p1", "d2"): hang("p1", "d2")}
    state, acts = run([rnd(0, half), rnd(1, whole), rnd(2, whole)])
    assert acts[0] == []
    assert [(type(a), a.engine) for a in acts[1]] == [(Evict, "p1")]  # type: ignore[attr-defined]
    assert state.engines["d2"].in_rotation


def test_every_pair_failing_keeps_one_engine_per_tier() -> None:
    bad = {(p, d): wrong(p, d) for p in ("p1", "p2") for d in ("d1", "d2")}
    state, acts = run([rnd(0, bad), rnd(1, bad)])
    assert [type(a) for a in acts[1]] == [Evict, Alert]
    assert [k for k, s in state.engines.items() if not s.in_rotation] == ["d1"]


def test_a_hung_decode_is_restarted_after_two_bad_rounds_once_per_backoff() -> None:
    bad = {("p1", "d1"): hang("p1", "d1"), ("p2", "d1"): hang("p2", "d1")}
    _, acts = run([rnd(t, bad) for t in (0, 1, 2, 3, 50, 101, 102)])
    restarts = [(i, a) for i, acts_i in enumerate(acts) for a in acts_i if isinstance(a, Restart)]
    assert [i for i, _ in restarts] == [1, 5]  # round 1 (2 bad), then not before t=101
    assert restarts[0][1].then_decodes == () and restarts[0][1].engine == "d1"


def test_wrong_answers_and_health_never_restart() -> None:
    bad = {("p1", "d1"): wrong("p1", "d1"), ("p2", "d1"): wrong("p2", "d1")}
    _, acts = run([rnd(t, bad) for t in range(5)])
    assert not any(isinstance(a, Restart) for a in flat(acts))
    down = {"p1": True, "p2": True, "d1": False, "d2": True}
    _, acts = run([rnd(t, health=down) for t in range(5)])
    assert not any(isinstance(a, Restart) for a in flat(acts))


def test_a_prefill_restart_names_the_decodes_to_restart_after_it() -> None:
    ft = {
        ("p1", d): PairCheck("p1", d, "error", "decode", "HTTP 500", failed_transfers=1)
        for d in ("d1", "d2")
    }
    _, acts = run([rnd(0, ft), rnd(1, ft)])
    assert acts[1] == [Restart("p1", "prefill", ft[("p1", "d1")].reason(), ("d1", "d2"))]


def test_last_good_is_kept_per_pair() -> None:
    bad = {("p1", "d1"): wrong("p1", "d1"), ("p2", "d1"): wrong("p2", "d1")}
    state, _ = run([rnd(5), rnd(6, bad)])
    assert state.last_good[("p1", "d1")] == 5 and state.last_good[("p1", "d2")] == 6


def lost(p: str, d: str) -> PairCheck:
    return PairCheck(p, d, "error", "prefill", "connection refused")


def test_the_last_prefill_lost_leaves_the_router_the_decode_serves_alone_and_it_comes_back() -> (
    None
):
    """Degraded mode (plan/degraded.py): the only prefill's /health fails; it is evicted like
    any engine (the decode keeps the tier's other half), and readmitted after good rounds."""
    one_one = [P1, D1]
    down = {"p1": False, "d1": True}
    bad = {("p1", "d1"): lost("p1", "d1")}
    rounds = [rnd(0, bad, down, one_one), rnd(1, bad, down, one_one)]
    rounds += [rnd(t, engines=one_one) for t in range(2, 5)]
    state, acts = run(rounds, engines=one_one)
    assert acts[0] == [Evict("p1", "prefill", "health", "p1: /health failing")]
    assert acts[1:4] == [[], [], []]  # no restart: a lost engine is not a peer fault
    assert acts[4] == [Readmit("p1", "prefill", 3)]
    assert state.engines["p1"].in_rotation and state.engines["d1"].in_rotation


def test_without_degraded_mode_the_last_prefill_stays_with_an_alert() -> None:
    one_one = [P1, D1]
    down = {"p1": False, "d1": True}
    cfg = WatchConfig(interval_seconds=1, readmit_after=3, degraded=False)
    state, acts = run([rnd(0, {}, down, one_one)], engines=one_one, cfg=cfg)
    assert [type(a) for a in acts[0]] == [Alert] and state.engines["p1"].in_rotation


def test_both_tiers_lost_the_second_stays_in_the_router_with_an_alert() -> None:
    """Never both tiers out: the endpoint would have nothing to serve from."""
    one_one = [P1, D1]
    down = {"p1": False, "d1": False}
    state, acts = run([rnd(0, {}, down, one_one)], engines=one_one)
    assert [(type(a), a.engine) for a in acts[0]] == [(Evict, "p1"), (Alert, "d1")]  # type: ignore[attr-defined]
    assert state.engines["d1"].in_rotation


def test_the_only_prefill_refusing_its_step_leaves_at_once_while_its_health_answers() -> None:
    """Real vLLM draining on SIGTERM: /health answers, the prefill step gets HTTP 500 (the
    body captured in CI, 2026-12-07). The prefill step involves no decode, so the prefill is
    blamed for certain: evicted on the first round, the decode serving alone (degraded)."""
    one_one = [P1, D1]
    draining = PairCheck(
        "p1",
        "d1",
        "error",
        "prefill",
        'HTTP 500 {"error":{"message":"cannot schedule new futures after shutdown"}}',
    )
    state, acts = run([rnd(0, {("p1", "d1"): draining}, engines=one_one)], engines=one_one)
    assert [(type(a), a.engine) for a in acts[0]] == [(Evict, "p1")]  # type: ignore[attr-defined]
    assert not state.engines["p1"].in_rotation and state.engines["d1"].in_rotation


def test_a_prefill_step_that_hangs_is_still_a_tie_in_one_pair() -> None:
    """A hang is weighed as before (a slow prefill under load is not evicted for certain)."""
    one_one = [P1, D1]
    slow = {("p1", "d1"): PairCheck("p1", "d1", "hang", "prefill", "timed out")}
    state, acts = run([rnd(t, slow, engines=one_one) for t in range(2)], engines=one_one)
    assert acts[0] == [] and [type(a) for a in acts[1]] == [Alert]
    assert all(s.in_rotation for s in state.engines.values())


def test_one_of_two_prefills_refusing_its_step_is_blamed_on_half_a_round() -> None:
    """Seen by one of its two canaries (it began draining between them): the refusal is the
    prefill's own, so it is blamed, and neither decode."""
    half = {("p1", "d2"): PairCheck("p1", "d2", "error", "prefill", "HTTP 500")}
    assert set(blame(TWO_BY_TWO, rnd(0, half))) == {"p1"}
    _, acts = run([rnd(0, half)])
    assert [(type(a), a.engine) for a in acts[0]] == [(Evict, "p1")]  # type: ignore[attr-defined]
