"""Plans run by the one executor (deploy/executor.py) against plain fakes of pdboot's own
protocols (executor.Ops, the routers' worker APIs, the router swap's steps), recording every
call: the roll's order, its undo on a failed pair, cancellation between steps, a router swap
undone before the proxy moved, blue/green's order and its undo, the standby kept in step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from pdboot.deploy.bluegreen import BlueGreen
from pdboot.deploy.drain import DrainResult
from pdboot.deploy.executor import Action, Routers, Run, Seen, execute
from pdboot.deploy.frame import Cancelled, CancelToken
from pdboot.deploy.rollout import PairRefused, roll_steps
from pdboot.deploy.router_swap import PointProxy, RouterReady, StartRouter, StopRouter
from pdboot.deploy.steps import Say
from pdboot.events import Event, RollStopped
from pdboot.inventory.load import parse_inventory
from pdboot.plan.build import build_plan
from pdboot.plan.change_plan import ChangeOptions, change_plan
from pdboot.plan.converge import Observed, Step
from pdboot.plan.model import LABEL_CONFIG_HASH, Plan, Service

INV = """name: demo
model: m
hosts: {a: {address: 192.0.2.10}, b: {address: 192.0.2.11}, c: {address: 192.0.2.12},
        d: {address: 192.0.2.13}}
prefill: {hosts: [a, c], gpus: [0]}
decode: {hosts: [b, d], gpus: [0]}
router: {host: a}
"""


@dataclass
class Log:
    calls: list[str] = field(default_factory=list)


@dataclass
class FakeOps:
    log: Log
    pairs: bool = True
    running: list[Observed] = field(default_factory=list)
    unread: frozenset[str] = frozenset()  # hosts that do not answer
    lost: frozenset[str] = frozenset()

    def start(self, steps: list[Step]) -> None:
        self.log.calls.append("start " + " ".join(s.service.key for s in steps))

    def wait(self, services: list[Service], *, router: bool) -> None:
        what = "router" if router else " ".join(s.key for s in services)
        self.log.calls.append(f"wait {what}")

    def stop(self, gone: list[Observed]) -> None:
        if gone:
            self.log.calls.append("stop " + " ".join(o.key for o in gone))

    def remove(self, services: Sequence[Service]) -> None:
        self.log.calls.append("remove " + " ".join(s.key for s in services))

    def drain(self, url: str, pullers: Sequence[str]) -> DrainResult:
        self.log.calls.append(f"drain {url}")
        return DrainResult(url, True, 0.0, "idle")

    def observe(self, only: Sequence[str] | None = None) -> list[Observed]:
        return self.running

    def look(self) -> Seen:
        answered = [o for o in self.running if o.host not in self.unread]
        return Seen(answered, self.unread | self.lost, self.lost)

    def pairs_ok(self, joining: list[Service], number: int) -> bool:
        self.log.calls.append("pairs " + " ".join(s.key for s in joining))
        return self.pairs

    def restore(self, steps: Sequence[Step]) -> None:
        self.log.calls.append("restore " + " ".join(s.service.key for s in steps))


@dataclass
class FakeApi:
    """A router's worker API (router_api.RouterWorkerApi's part the steps use)."""

    name: str
    log: Log
    refuse: bool = False

    def add(self, url: str, worker_type: str) -> None:
        self.log.calls.append(f"{self.name} add {url}")

    def remove(self, url: str) -> bool:
        self.log.calls.append(f"{self.name} remove {url}")
        return True

    def workers(self) -> list[object]:
        return []


def plan() -> Plan:
    return build_plan(parse_inventory(INV))


def running(p: Plan, *, changed: bool = False) -> list[Observed]:
    """Every service running as planned; ``changed``: the engines with another config."""
    return [
        Observed(
            s.host,
            f"id-{s.key}",
            s.container_name,
            {
                **dict(s.labels),
                LABEL_CONFIG_HASH: "old" if changed and s.is_engine else s.config_hash,
            },
            "running",
        )
        for s in p.services()
    ]


def run_of(
    p: Plan, log: Log, ops: FakeOps, standby: bool = False, events: list[Event] | None = None
) -> Run:
    home = FakeApi("home", log)
    other = FakeApi("standby", log) if standby else None
    emit = events.append if events is not None else (lambda _e: None)
    return Run(p, emit, ops, Routers(home, other))  # type: ignore[arg-type]


def a_roll(p: Plan) -> list[Action]:
    """Every engine's configuration changed, the router unchanged: a roll."""
    change = change_plan(p, running(p, changed=True), ChangeOptions(live=True))
    assert change.rolls and change.roll.steps
    return roll_steps(p, change.roll)


def test_a_roll_takes_out_drains_starts_probes_then_registers_each_engine_in_turn() -> None:
    p, log = plan(), Log()
    execute(run_of(p, log, FakeOps(log)), CancelToken(), a_roll(p))
    first = log.calls[: log.calls.index("home add http://192.0.2.10:8200") + 1]
    assert first == [
        "home remove http://192.0.2.10:8200",
        "drain http://192.0.2.10:8200",
        "start prefill@a",
        "wait prefill@a",
        "pairs prefill@a",
        "home add http://192.0.2.10:8200",
    ]
    starts = [c for c in log.calls if c.startswith("start")]
    assert starts == ["start prefill@a", "start prefill@c", "start decode@b", "start decode@d"]
    assert log.calls[-1] == "wait router"


def test_a_failed_pair_brings_the_old_engine_back_and_stops_the_roll() -> None:
    p, log = plan(), Log()
    ops = FakeOps(log, pairs=False, running=running(p))
    with pytest.raises(PairRefused):
        execute(run_of(p, log, ops), CancelToken(), a_roll(p))
    at = log.calls.index("pairs prefill@a")
    assert log.calls[at + 1] == "restore prefill@a"
    # the report keeps what runs registered; nothing of a later step ran
    assert "start prefill@c" not in log.calls
    after = log.calls[at + 2 :]
    assert "home add http://192.0.2.12:8200" in after  # the other prefill serves on
    assert "home add http://192.0.2.10:8200" in after  # the one brought back, too


def test_a_stopped_rolls_report_names_engines_on_a_lost_host_and_serves_on_with_the_rest() -> None:
    p, log, events = plan(), Log(), []
    # host c (prefill@c) was lost, host d (decode@d) did not answer for another reason
    ops = FakeOps(log, pairs=False, running=running(p), lost=frozenset("c"), unread=frozenset("d"))
    with pytest.raises(PairRefused):
        execute(run_of(p, log, ops, events=events), CancelToken(), a_roll(p))
    (report,) = [e for e in events if isinstance(e, RollStopped)]
    rows = dict(report.engines)
    assert rows["prefill@c"] == "out of reach (its host was lost)"
    assert rows["decode@d"] == "unknown (its state could not be read)"
    assert rows["decode@b"].startswith("new configuration")
    after = log.calls[log.calls.index("restore prefill@a") + 1 :]
    assert "home add http://192.0.2.11:8201" in after  # decode@b, read, serves on
    assert "home add http://192.0.2.12:8200" not in after  # nothing read of prefill@c
    # unread is not "not running": neither is taken out of the router
    assert not [c for c in after if c.startswith("home remove")]


def test_the_executor_checks_the_token_between_steps_and_undoes_nothing_on_a_lost_lock() -> None:
    p, log = plan(), Log()
    token = CancelToken()
    steps = a_roll(p)
    ops = FakeOps(log)
    real_start = ops.start

    def start_then_lose(s: list[Step]) -> None:
        real_start(s)
        token.cancel("the lock was lost")

    ops.start = start_then_lose  # type: ignore[method-assign]
    with pytest.raises(Cancelled):
        execute(run_of(p, log, ops), token, steps)
    assert log.calls[-1] == "start prefill@a"  # no wait, no restore, no report


@dataclass
class SwapStub:
    """The swap's own steps recorded instead of run (router_swap.py's, by type)."""

    log: Log
    fail_ready: bool = False

    def run(self, step: Action) -> Action | None:
        self.log.calls.append(step.describe())
        if isinstance(step, RouterReady) and self.fail_ready:
            raise RuntimeError("the new router never served")
        if isinstance(step, StartRouter):
            return StopRouter(step.router, step.to, said=False)
        return None


@dataclass(frozen=True)
class Recorded:
    """A step whose run is the stub's: the executor's order and undo without Docker."""

    inner: Action
    stub: SwapStub
    commits: bool = False

    def describe(self) -> str:
        return self.inner.describe()

    def run(self, run: Run) -> Action | None:
        inverse = self.stub.run(self.inner)
        return Recorded(inverse, self.stub) if inverse is not None else None


def stubbed(steps: list[Action], stub: SwapStub) -> list[Action]:
    kinds = (StartRouter, RouterReady, PointProxy, StopRouter)
    return [
        Recorded(s, stub, s.commits)
        if isinstance(s, kinds) or type(s).__name__ in ("DrainRouter", "CheckRouter")
        else s
        for s in steps
    ]


def test_a_swap_whose_new_router_never_serves_is_undone_before_the_proxy_moves() -> None:
    from pdboot.deploy.router_swap import move_steps

    p, log = plan(), Log()
    stub = SwapStub(log, fail_ready=True)
    with pytest.raises(RuntimeError):
        execute(run_of(p, log, FakeOps(log)), CancelToken(), stubbed(move_steps(p.router), stub))
    assert log.calls == [
        "start the router in the spare place",
        "wait for the router in the spare place",
        "stop the router in the spare place",
    ]


def test_a_swap_moves_the_proxy_then_drains_the_old_router_both_ways() -> None:
    from pdboot.deploy.router_swap import move_steps

    p, log = plan(), Log()
    execute(
        run_of(p, log, FakeOps(log)),
        CancelToken(),
        stubbed(move_steps(p.router), SwapStub(log)),
    )
    assert log.calls == [
        "start the router in the spare place",
        "wait for the router in the spare place",
        "point the proxy at the spare place",
        "drain and stop the router in the home place",
        "start the router in the home place",
        "wait for the router in the home place",
        "point the proxy at the home place",
        "drain and stop the router in the spare place",
    ]


def blue_green_steps(p: Plan, log: Log) -> list[Action]:
    change = change_plan(p, running(p, changed=True), ChangeOptions(live=True))
    steps = [s for st in change.stages for s in st]
    bg = BlueGreen(p, lambda *a, **k: None, {}, lambda _e: None)  # type: ignore[arg-type,return-value]
    return bg.steps(steps)


def test_blue_green_failing_before_the_switch_is_undone_newest_first() -> None:
    p, log = plan(), Log()
    steps = stubbed(blue_green_steps(p, log), SwapStub(log, fail_ready=True))
    # green's pairs pass here (the probe is the verify layer's): drop them from the plan
    steps = [s for s in steps if type(s).__name__ != "GreenPairs"]
    with pytest.raises(RuntimeError):
        execute(run_of(p, log, FakeOps(log), standby=True), CancelToken(), steps)
    c = log.calls
    fail = c.index("wait for the router in the spare place")
    assert c[fail + 1 :] == [
        "stop the router in the spare place",
        "remove decode@d prefill@c",  # green's first engines
        "restore prefill@c decode@d",  # the drained blue half, from the kept compose file
        "home add http://192.0.2.13:8201",  # registered again, newest first
        "standby add http://192.0.2.13:8201",
        "home add http://192.0.2.12:8200",
        "standby add http://192.0.2.12:8200",
    ]
    # phase 1 took the blue half off both routers before draining it
    assert c[:3] == [
        "standby remove http://192.0.2.12:8200",
        "home remove http://192.0.2.12:8200",
        "drain http://192.0.2.12:8200",
    ]


def test_blue_green_in_order_with_the_standby_following_green() -> None:
    p, log = plan(), Log()
    steps = [
        s
        for s in stubbed(blue_green_steps(p, log), SwapStub(log))
        if type(s).__name__ != "GreenPairs"
        and not (hasattr(s, "where") and getattr(s, "where", "") == "spare")
    ]
    execute(run_of(p, log, FakeOps(log), standby=True), CancelToken(), steps)
    c = log.calls
    assert c.index("point the proxy at the spare place") < c.index("remove decode@b prefill@a")
    # blue's remaining engines leave the standby before they stop, green's first join it
    assert c.index("standby remove http://192.0.2.10:8200") < c.index("remove decode@b prefill@a")
    assert c.index("standby add http://192.0.2.12:8200") > c.index("remove decode@b prefill@a")
    assert c[-1] == "drain and stop the router in the spare place"


def test_a_say_step_records_its_undo() -> None:
    p, log = plan(), Log()
    boom = Say("x", undo=Say("undone"))

    @dataclass(frozen=True)
    class Fail:
        commits = False

        def describe(self) -> str:
            return "fail"

        def run(self, run: Run) -> Action | None:
            raise ValueError("no")

    said: list[str] = []
    r = Run(p, lambda e: said.append(getattr(e, "message", "")), FakeOps(log))
    with pytest.raises(ValueError):
        execute(r, CancelToken(), [boom, Fail()])
    assert said == ["x", "undone"]
