"""The cross-host clock check: each host's offset is a window bounded by when the batch was
sent and came back (NTP's bound), so slow round trips widen it and never fail a host."""

from __future__ import annotations

import random

from pdboot.inventory.schema import Requirements
from pdboot.preflight.checks import (
    MISSING,
    Command,
    HostContext,
    batch_script,
    network,
    parse_sections,
)
from pdboot.preflight.checks.network import NetworkFacts, clock_window, evaluate_clocks
from pdboot.transport.connection import LocalConnection


def facts(start: float, end: float | None) -> NetworkFacts:
    return NetworkFacts((), start, MISSING, end)


def window(
    offset: float, there: float, run: float, back: float, t: float = 1000.0
) -> network.Window:
    """The window of a host ``offset`` s ahead of us whose batch took ``there`` s to start,
    ran ``run`` s and whose output took ``back`` s to come back."""
    f = facts(t + there + offset, t + there + run + offset)
    w = clock_window(f, t, t + there + run + back)
    assert w is not None and w[0] <= offset <= w[1]  # the bound holds
    return w


def test_in_sync_hosts_never_fail_however_slow_and_lopsided_the_round_trips() -> None:
    rng = random.Random(35)
    for _ in range(2000):
        n = rng.randint(2, 9)
        common = rng.uniform(-100, 100)  # our own clock does not matter
        ws = {
            f"h{i}": window(
                common + rng.uniform(-0.5, 0.5),
                rng.choice([0.01, 0.2, rng.uniform(0, 30)]),
                rng.uniform(0, 20),
                rng.choice([0.01, rng.uniform(0, 30)]),
            )
            for i in range(n)
        }
        verdicts = evaluate_clocks(ws, 5.0)
        assert all(v.status != "fail" for v in verdicts.values()), (ws, verdicts)


def test_a_skewed_clock_fails_and_the_others_pass() -> None:
    ws = {"a": window(0.1, 0.05, 1.0, 0.02), "b": window(0.2, 0.3, 2.0, 0.01)}
    ws["c"] = window(9.0, 0.1, 1.5, 0.05)
    r = evaluate_clocks(ws, 5.0)
    assert (r["a"].status, r["b"].status, r["c"].status) == ("pass", "pass", "fail")
    assert "at least 8." in r["c"].message and "ahead of" in r["c"].message
    behind = evaluate_clocks({**ws, "c": window(-9.0, 0.1, 1.5, 0.05)}, 5.0)["c"]
    assert behind.status == "fail" and "behind" in behind.message
    assert r["a"].message.startswith("clock within 0.")


def test_a_round_trip_too_slow_to_tell_warns_instead_of_failing() -> None:
    ws = {"a": window(0.0, 0.05, 1.0, 0.02), "b": window(0.0, 0.05, 1.0, 0.02)}
    # 8 s off at a guess, but the batch took 6 s to start and 4 s to come back
    ws["c"] = window(7.0, 6.0, 1.0, 4.0)
    r = evaluate_clocks(ws, 5.0)["c"]
    assert r.status == "warn" and "round trips were slow" in r.message
    ws["c"] = window(0.0, 6.0, 1.0, 4.0)  # best guess within the limit: passes, saying so
    r = evaluate_clocks(ws, 5.0)["c"]
    assert r.status == "pass" and "somewhere between" in r.message
    # a quick answer proves the skew however slow the start: 6.95 s at least
    ws["c"] = window(7.0, 8.0, 1.0, 0.05)
    assert evaluate_clocks(ws, 5.0)["c"].status == "fail"


def test_a_capture_without_the_end_reading_bounds_with_the_start_one() -> None:
    assert clock_window(facts(105.0, None), 100.0, 108.0) == (-3.0, 5.0)
    # an end reading before the start one (a clock stepped back mid-batch) is not believed
    assert clock_window(facts(105.0, 90.0), 100.0, 108.0) == (-3.0, 5.0)
    assert clock_window(facts(105.0, 106.0), 100.0, 108.0) == (-2.0, 5.0)
    assert clock_window(NetworkFacts((), None), 100.0, 108.0) is None
    assert evaluate_clocks({}, 5.0) == {}


def test_the_clock_readings_run_alone_before_and_after_the_others() -> None:
    stamp = "date +%s%N"
    # One sleep long against a loaded machine's scheduling jitter (166 ms seen with 0.2 s
    # sleeps under the full suite), and every bound half of it: run one after the other, the
    # two sleepers would end a whole sleep apart.
    half = 500_000_000
    cmds = [
        Command("s1", f"sleep 1; {stamp}", "host"),
        Command("first", f"{stamp}", "host", at="start"),
        Command("last", f"{stamp} # end", "host", at="end"),
        Command("s2", f"sleep 1; {stamp}  # two", "host"),
    ]
    out = parse_sections(LocalConnection("t").run(batch_script(cmds)).stdout)
    t = {c.key: int(out[c.line].output) for c in cmds}
    assert all(out[c.line].rc == 0 for c in cmds)
    assert t["first"] < t["s1"] - half and t["first"] < t["s2"] - half
    assert t["last"] >= max(t["s1"], t["s2"])
    # the together ones still ran at once: the batch cost one sleep, not two
    assert abs(t["s1"] - t["s2"]) < half


def test_the_network_area_reads_the_clock_first_and_last() -> None:
    host = HostContext("h", ("decode",), Requirements())
    ctx_cmds = {c.key: c for c in network.commands(host)}
    assert ctx_cmds["clock"].at == "start" and ctx_cmds["clock_end"].at == "end"
    assert ctx_cmds["clock"].line != ctx_cmds["clock_end"].line  # sections are keyed by line
