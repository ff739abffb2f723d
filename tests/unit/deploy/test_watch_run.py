"""watch's loop with a fake HTTP world (engines that answer, hang or corrupt), a fake router
and a fake clock: canaries, eviction through the router, re-admission, restarts with drain,
events and metrics for each step."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pdboot.deploy.router_api import Worker
from pdboot.deploy.watch.run import WatchDeps, Watcher
from pdboot.events import Event
from pdboot.plan.watch.events import WatchActionTaken, WatchRound, WatchServingChanged
from pdboot.plan.watch.metrics import WATCH_METRICS, WatchMetrics
from pdboot.plan.watch.policy import WatchConfig, WatchedEngine
from pdboot.transport.http import HttpAnswer
from pdboot.verify.exposition import parse_exposition

ENGINES = [
    WatchedEngine("p1", "prefill", "http://p1"),
    WatchedEngine("p2", "prefill", "http://p2"),
    WatchedEngine("d1", "decode", "http://d1"),
    WatchedEngine("d2", "decode", "http://d2"),
]


@dataclass
class FakeEngine:
    tier: str
    healthy: bool = True
    corrupt: bool = False
    hang: bool = False
    refuse_pulls: bool = False  # a prefill whose side channel died: pulls from it fail
    failed: float = 0.0
    pulled: float = 0.0
    restarts: int = 0
    busy_until: float = 0.0  # a request runs on it until then (the world's clock)


@dataclass
class World:
    engines: dict[str, FakeEngine] = field(
        default_factory=lambda: {e.key: FakeEngine(e.tier) for e in ENGINES}
    )
    now: float = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s

    def fetch(
        self,
        url: str,
        *,
        timeout: float = 2.0,
        body: Any = None,
        headers: Any = None,
        method: str | None = None,
    ) -> HttpAnswer:
        self.now += 0.01
        key, _, path = url.removeprefix("http://").partition("/")
        e = self.engines[key]
        if path == "health":
            return HttpAnswer(200 if e.healthy else 503, "")
        if path == "metrics":
            return HttpAnswer(
                200,
                (
                    f'vllm:nixl_num_failed_transfers_total{{engine="0"}} {e.failed}\n'
                    f'vllm:prompt_tokens_by_source_total{{source="external_kv_transfer"}} '
                    f"{e.pulled}\nvllm:num_requests_running {int(self.now < e.busy_until)}\n"
                ),
            )
        prompt = body["prompt"]
        params = body.get("kv_transfer_params")
        if e.tier == "prefill":
            return HttpAnswer(
                200,
                json.dumps(
                    {
                        "choices": [{"text": " x"}],
                        "kv_transfer_params": {"do_remote_prefill": True, "remote_engine_id": key},
                    }
                ),
            )
        if params:
            if e.hang:
                self.now += timeout
                return HttpAnswer(0, "", "timed out")
            if self.engines[params["remote_engine_id"]].refuse_pulls:
                e.failed += 1
                return HttpAnswer(500, '{"error": "Internal server error"}')
            e.pulled += 40
            if e.corrupt:
                return HttpAnswer(200, json.dumps({"choices": [{"text": " zz " * 16}]}))
        return HttpAnswer(200, json.dumps({"choices": [{"text": f" answer {prompt[:8]} " * 4}]}))


@dataclass
class FakeRouter:
    listed: dict[str, str] = field(default_factory=lambda: {e.url: e.tier for e in ENGINES})
    calls: list[tuple[str, str]] = field(default_factory=list)

    def workers(self) -> list[Worker]:
        return [Worker(u, t, True) for u, t in self.listed.items()]

    def add(self, url: str, worker_type: str) -> None:
        self.calls.append(("add", url))
        self.listed[url] = worker_type

    def remove(self, url: str) -> bool:
        self.calls.append(("remove", url))
        return self.listed.pop(url, None) is not None


@dataclass
class FakeRestarter:
    world: World
    clears: bool = True  # a restart clears hang / refused pulls (peer state)

    def restart(self, engine: WatchedEngine) -> None:
        e = self.world.engines[engine.key]
        e.restarts += 1
        if self.clears:
            e.hang = e.refuse_pulls = False


def watcher(world: World, restarter: bool = True) -> tuple[Watcher, FakeRouter, list[Event]]:
    events: list[Event] = []
    router = FakeRouter()
    deps = WatchDeps(
        world.fetch,
        router,
        events.append,
        WatchMetrics(),
        FakeRestarter(world) if restarter else None,
        clock=world.clock,
        wall=world.clock,
        sleep=world.sleep,
        drain_seconds=1,
        ready_seconds=5,
    )
    cfg = WatchConfig(
        interval_seconds=1,
        deadline_seconds=0.5,
        readmit_after=2,
        restart_after=2,
        restart_backoff_seconds=60,
    )
    return Watcher(ENGINES, "m", cfg, deps), router, events


def actions(events: list[Event]) -> list[tuple[str, str, bool]]:
    return [(e.action, e.engine, e.ok) for e in events if isinstance(e, WatchActionTaken)]


def test_all_good_rounds_change_nothing_and_export_per_pair_metrics() -> None:
    world = World()
    w, router, events = watcher(world)
    w.round()
    w.round()
    assert router.calls == [] and actions(events) == []
    rounds = [e for e in events if isinstance(e, WatchRound)]
    assert [len(r.pairs) for r in rounds] == [4, 4]
    assert all(p.result == "good" and p.pulled_tokens == 40 for p in rounds[0].pairs)
    text = w.deps.metrics.exposition()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in parse_exposition(text)}
    assert samples[("pdboot_watch_canary_ok", (("decode", "d1"), ("prefill", "p1")))] == 1
    assert (
        samples[
            ("pdboot_watch_canaries_total", (("decode", "d2"), ("prefill", "p2"), ("result", "ok")))
        ]
        == 2
    )
    assert samples[("pdboot_watch_rounds_total", ())] == 2
    assert {s.name for s in parse_exposition(text)} <= {m[0] for m in WATCH_METRICS}


def test_corrupt_decode_evicted_through_the_router_and_back_after_two_good_rounds() -> None:
    world = World()
    w, router, events = watcher(world)
    world.engines["d1"].corrupt = True
    w.round()
    assert router.calls == [("remove", "http://d1")]
    assert actions(events) == [("evict", "d1", True)]
    assert "http://d1" not in router.listed
    w.round()  # still corrupt: out, no restart (a restart does not fix wrong answers)
    assert world.engines["d1"].restarts == 0
    world.engines["d1"].corrupt = False
    w.round()
    w.round()
    assert router.calls[-1] == ("add", "http://d1") and router.listed["http://d1"] == "decode"
    assert actions(events)[-1] == ("readmit", "d1", True)
    m = w.deps.metrics
    assert m.value("pdboot_watch_evictions_total", "d1", "decode", "wrong_answer") == 1
    assert m.value("pdboot_watch_readmissions_total", "d1", "decode") == 1
    assert m.value("pdboot_watch_engine_in_rotation", "d1", "decode") == 1
    assert w.verdicts()[0]["ok"] is True


def test_a_hung_decode_is_evicted_then_restarted_and_readmitted() -> None:
    world = World()
    w, _router, events = watcher(world)
    world.engines["d2"].hang = True
    w.round()
    rnd = next(e for e in events if isinstance(e, WatchRound))
    assert {(p.decode, p.result) for p in rnd.pairs if p.result != "good"} == {("d2", "hang")}
    world.engines["d2"].busy_until = world.now + 100  # a hung request stays "running"
    w.round()  # second bad round: restart (clears the hang) after drain_seconds at most
    assert world.engines["d2"].restarts == 1
    w.round()
    w.round()
    assert [a for a in actions(events)] == [
        ("evict", "d2", True),
        ("restart", "d2", True),
        ("readmit", "d2", True),
    ]
    restart = next(e for e in events if isinstance(e, WatchActionTaken) and e.action == "restart")
    assert restart.detail.startswith("still busy after 1.0s (1 running"), restart.detail
    assert w.deps.metrics.value("pdboot_watch_restarts_total", "d2", "decode") == 1


def test_a_prefill_with_a_dead_side_channel_restarts_then_each_decode_one_at_a_time() -> None:
    world = World()
    w, _router, events = watcher(world)
    world.engines["p1"].refuse_pulls = True
    w.round()
    w.round()
    acts = actions(events)
    assert acts[0] == ("evict", "p1", True) and ("restart", "p1", True) in acts
    # each decode: out of the router, restarted, back in, never both out at once
    tail = acts[acts.index(("restart", "p1", True)) + 1 :]
    assert tail == [
        ("evict", "d1", True),
        ("restart", "d1", True),
        ("readmit", "d1", True),
        ("evict", "d2", True),
        ("restart", "d2", True),
        ("readmit", "d2", True),
    ]
    assert world.engines["d1"].restarts == world.engines["d2"].restarts == 1


def test_no_restarter_turns_a_restart_into_a_failed_action() -> None:
    world = World()
    w, _, events = watcher(world, restarter=False)
    world.engines["d1"].hang = True
    w.round()
    w.round()
    restart = [e for e in events if isinstance(e, WatchActionTaken) and e.action == "restart"]
    assert restart and not restart[0].ok and "no restarter" in restart[0].detail


def test_health_failing_evicts_and_a_router_that_relists_it_is_corrected() -> None:
    world = World()
    w, router, events = watcher(world)
    world.engines["p2"].healthy = False
    w.round()
    assert ("evict", "p2", True) in actions(events)
    router.listed["http://p2"] = "prefill"  # e.g. the router restarted and got it again
    w.round()
    assert "http://p2" not in router.listed


def test_a_foreign_worker_is_removed_counted_and_an_emptied_router_refilled_in_one_round() -> None:
    """Issue 28: the router's list made true each round (what the testbed's e2e test shows
    with the real router: tests/e2e/test_up_watch_service.py)."""
    world = World()
    w, router, _ = watcher(world)
    router.listed["http://evil:9"] = "decode"  # registered by hand on the router host
    w.round()
    assert ("remove", "http://evil:9") in router.calls and "http://evil:9" not in router.listed
    m = w.deps.metrics
    assert m.value("pdboot_watch_foreign_workers_removed_total", "http://evil:9", "decode") == 1
    # a router Docker restarted: it knows no worker; every healthy engine is back this round
    router.listed.clear()
    world.engines["d2"].healthy = False  # not registered while it fails /health
    w.round()
    assert set(router.listed) == {"http://p1", "http://p2", "http://d1"}
    assert m.value("pdboot_watch_workers_reregistered_total", "d1", "decode") == 1
    assert m.value("pdboot_watch_workers_reregistered_total", "d2", "decode") is None


def test_a_lost_only_prefill_switches_to_plain_decodes_and_back_to_pd_in_order() -> None:
    """Degraded mode: the router gets the decode as a plain worker before the prefill leaves,
    and the prefill before the plain entry leaves (plan/degraded.py); each switch is an event,
    the gauge and the counter."""
    one_one = [ENGINES[0], ENGINES[2]]
    world = World(engines={"p1": FakeEngine("prefill"), "d1": FakeEngine("decode")})
    w, router, events = watcher(world)
    w = Watcher(one_one, "m", w.cfg, w.deps)
    router.listed = {"http://p1": "prefill", "http://d1": "decode"}
    world.engines["p1"].healthy = False
    w.round()
    # the plain entry first; then the P/D entries go together
    assert router.calls[0] == ("add", "http://d1/.")
    assert sorted(router.calls[1:]) == [("remove", "http://d1"), ("remove", "http://p1")]
    assert router.listed == {"http://d1/.": "regular"}
    changed = [e for e in events if isinstance(e, WatchServingChanged)]
    assert [(e.before, e.mode, e.lost_tier) for e in changed] == [("pd", "decode_only", "prefill")]
    m = w.deps.metrics
    assert m.value("pdboot_watch_degraded") == 1
    assert w.serving_doc()["mode"] == "decode_only"
    w.round()  # still down: nothing changes
    assert len(router.calls) == 3
    world.engines["p1"].healthy = True
    w.round()
    w.round()  # readmit_after=2
    assert sorted(router.calls[3:5]) == [("add", "http://d1"), ("add", "http://p1")]
    assert router.calls[5:] == [("remove", "http://d1/.")]
    assert router.listed == {"http://p1": "prefill", "http://d1": "decode"}
    assert m.value("pdboot_watch_degraded") == 0
    assert m.value("pdboot_watch_serving_switches_total", "pd") == 1
    assert m.value("pdboot_watch_serving_switches_total", "decode_only") == 1
    assert actions(events) == [("evict", "p1", True), ("readmit", "p1", True)]
    # the decode's P/D entry came back with the switch: not a repair
    assert m.value("pdboot_watch_workers_reregistered_total", "d1", "decode") is None
    # the plain entry is pdboot's own: never removed as a foreign worker
    assert m.value("pdboot_watch_foreign_workers_removed_total", "http://d1/.", "regular") is None


def test_a_failing_pair_and_its_action_are_said_once_by_their_events(caplog: Any) -> None:
    """Issue 46: the view prints each event's line; a log record beside it said it twice."""
    import logging

    world = World()
    w, _, events = watcher(world)
    world.engines["d1"].corrupt = True
    with caplog.at_level(logging.INFO):
        w.round()
    assert actions(events) == [("evict", "d1", True)]
    assert any(p.fault for e in events if isinstance(e, WatchRound) for p in e.pairs)
    said = [r.getMessage() for r in caplog.records if r.name.startswith("pdboot.deploy.watch")]
    assert not any("d1" in m for m in said), said


def test_the_start_line_counts_in_words() -> None:
    from pdboot.deploy.watch.service import counted

    assert (counted(1, "pair"), counted(2, "pair"), counted(0, "engine")) == (
        "1 pair",
        "2 pairs",
        "0 engines",
    )
