"""A host the SSH keepalive watchdog cut off (issue 32, item 10): reconnected and the step
retried when it answers again, bounded; its reason in the message when it does not; and a
state that could not be read is "unknown", never "not running"."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from pdboot import events as ev
from pdboot.transport.connection import HostLost
from pdboot.transport.hosts import RELINKS_PER_HOST, Hosts, Link
from tests.unit.deploy.test_rollout import OOM, deployed, inv
from tests.unit.orchestrator_fakes import run_up

WHY = "no answer for 13s (SSH keepalives unanswered: network link down, or the host hung or off)"


@dataclass
class Conn:
    """What Hosts.relink reads of ssh.SSHConnection: ``lost`` and ``reconnect``."""

    name: str
    answers: bool  # whether a reconnect finds the host
    lost: str | None = None
    reconnects: int = 0

    def reconnect(self) -> bool:
        self.reconnects += 1
        if self.answers:
            self.lost = None
        return self.answers

    def close(self) -> None:
        pass


@dataclass
class Engine:
    conn: Conn
    reopened: int = 0
    calls: list[str] = field(default_factory=list)

    def reopen(self) -> None:
        self.reopened += 1

    def close(self) -> None:
        pass

    def containers(self, _deployment: str) -> list[str]:
        self.calls.append("containers")
        if self.conn.lost is None and len(self.calls) > 1:
            return ["c1"]
        self.conn.lost = WHY  # the watchdog fired while the call waited
        raise HostLost(self.conn.name, WHY)


def hosts(answers: bool) -> tuple[Hosts, Conn, Engine]:
    conn = Conn("h4", answers)
    engine = Engine(conn)
    return Hosts(links={"h4": Link(conn, engine)}), conn, engine  # type: ignore[arg-type]


def listing(h: Hosts) -> tuple[dict[str, Any], dict[str, str]]:
    return h.each(lambda _n, link: link.engine.containers("demo"), 10.0)


def test_a_host_that_answers_again_is_reconnected_and_the_step_retried() -> None:
    h, conn, engine = hosts(answers=True)
    told: list[tuple[str, str]] = []
    h.on_relink = lambda host, why: told.append((host, why))
    values, errors = listing(h)
    assert values == {"h4": ["c1"]} and errors == {}
    assert conn.reconnects == 1 and engine.reopened == 1 and engine.calls == ["containers"] * 2
    assert told == [("h4", WHY)]  # the command's view is told, with the watchdog's reason


def test_a_host_that_stays_silent_fails_with_the_watchdogs_reason() -> None:
    h, conn, _ = hosts(answers=False)
    h.on_relink = lambda host, why: pytest.fail(f"{host} was not reconnected")
    values, errors = listing(h)
    assert values == {} and WHY in errors["h4"] and conn.reconnects == 1


def test_reconnects_are_bounded() -> None:
    h, conn, _ = hosts(answers=False)
    for _ in range(RELINKS_PER_HOST + 2):
        conn.lost = WHY
        h.relink("h4")
    assert conn.reconnects == RELINKS_PER_HOST


def test_a_roll_that_cannot_read_a_hosts_state_reports_its_engines_unknown_not_not_running() -> (
    None
):
    world = deployed()
    world.crash = {"prefill": OOM}
    world.inv = inv("v0.33.0-rebuild")
    world.unreadable_from = {"d1": world.clock.now() + 0.5}  # after up's first look
    code, rec = run_up(world)
    assert code == 1
    (stopped,) = rec.of(ev.RollStopped)
    rows = dict(stopped.engines)
    assert rows.pop("decode@d1") == "unknown (its state could not be read)"
    # the hosts that answered say what they run
    assert rows.pop("prefill@p1") == "not running", rows  # the step's engine crashed
    assert all(v.startswith("old configuration") for v in rows.values()), rows
    # nothing unread was taken out of the router
    assert "http://192.0.2.11:8201" in world.registered
