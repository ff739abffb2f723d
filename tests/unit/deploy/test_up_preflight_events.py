"""`up`'s preflight reports each check as an event (issue 27, point 4): `up --events` carries
what `pdboot preflight --json` reports per check, and the terminal view renders the same
compact report from the events that it printed before from the result."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console

from pdboot import events as ev
from pdboot.deploy.preflight_gate import preflight_events, preflight_gate
from pdboot.deploy.up_options import UpOptions
from pdboot.inventory.schema import Inventory
from pdboot.preflight.checks import CheckResult
from pdboot.preflight.run import HostReport, PreflightResult
from pdboot.views import jsonl
from pdboot.views import preflight as report
from pdboot.views.terminal import TerminalView
from tests.unit.orchestrator_fakes import Recorder, World, inventory, up_in

CHECKS = [
    CheckResult("ssh.connect", "pass", "connected"),
    CheckResult("host.ulimits", "warn", "container memlock limited to 8388608 bytes", "set -1"),
    CheckResult("gpu.driver", "pass", "driver 580.95.05 (>= 580.65.06)"),
    CheckResult("model.config", "skip", "config.json not on the host yet"),
]
FAILING = [*CHECKS[:2], CheckResult("host.disk_docker", "fail", "3.0 GiB free", "free space")]


def result_for(inv: Inventory, failing: str = "") -> PreflightResult:
    """A report for every host of the inventory; ``failing``'s host fails a check."""
    return PreflightResult(
        {
            h: HostReport(h, True, list(FAILING if h == failing else CHECKS), seconds=0.5)
            for h in inv.hosts
        }
    )


def run_up(world: World, result: PreflightResult) -> tuple[int, Recorder, list[bool]]:
    rec = Recorder()
    asked: list[bool] = []

    def fake_run(inv: Inventory, accept_new_host_keys: bool = False) -> PreflightResult:
        asked.append(accept_new_host_keys)
        return result

    code = up_in(
        world,
        UpOptions(accept_new_host_keys=True),
        rec,
        preflight=preflight_gate(rec, run=fake_run),
    )
    return code, rec, asked


def test_up_emits_every_check_as_preflight_json_reports_it() -> None:
    world = World(inventory())
    result = result_for(world.inv)
    code, rec, asked = run_up(world, result)
    assert code == 0 and asked == [True]
    # the JSON lines of `up --events`, against the object of `pdboot preflight --json`
    lines = [json.loads(jsonl.to_json(e)) for e in rec.of(ev.PreflightCheck)]
    doc = json.loads(report.to_json(result))
    assert all(x["event"] == "preflight_check" for x in lines)
    for host, h in doc["hosts"].items():
        got = [
            {k: v for k, v in x.items() if k not in ("format_version", "event", "ts", "host")}
            for x in lines
            if x["host"] == host
        ]
        assert got == h["checks"], host
    assert len(lines) == sum(len(h["checks"]) for h in doc["hosts"].values()) > 0
    hosts = [(e.host, e.reachable, e.seconds) for e in rec.of(ev.PreflightHost)]
    assert hosts == [(h, True, 0.5) for h in world.inv.hosts]


def test_the_checks_come_between_the_preflight_stage_and_its_verdict() -> None:
    world = World(inventory())
    code, rec, _ = run_up(world, result_for(world.inv))
    assert code == 0
    kinds = [e.kind for e in rec.events]
    stage = rec.events.index(ev.StageStarted("preflight"))
    done = kinds.index("preflight")
    between = set(kinds[stage + 1 : done])
    assert between == {"preflight_host", "preflight_check"}
    assert kinds.count("preflight_check") == 4 * len(world.inv.hosts)
    assert rec.events[done] == ev.PreflightDone(ok=True)


def test_a_failed_check_is_an_event_and_nothing_starts() -> None:
    world = World(inventory())
    host = next(iter(world.inv.hosts))
    code, rec, _ = run_up(world, result_for(world.inv, failing=host))
    assert code == 1 and world.calls == []
    failed = [e for e in rec.of(ev.PreflightCheck) if e.status == "fail"]
    assert failed == [
        ev.PreflightCheck(host, "host.disk_docker", "fail", "3.0 GiB free", "free space")
    ]
    assert rec.of(ev.PreflightDone) == [ev.PreflightDone(ok=False)]


def _text(fill: Any) -> str:
    console = Console(record=True, width=100, color_system=None)
    fill(console)
    return console.export_text()


def test_the_terminal_view_renders_the_events_as_the_compact_report() -> None:
    inv = inventory()
    for failing in ("", next(iter(inv.hosts))):
        result = result_for(inv, failing)
        want = _text(lambda c, r=result: report.print_compact(r, c))

        def through_view(c: Console, r: PreflightResult = result) -> None:
            view = TerminalView(c)
            for e in preflight_events(r):
                view(e)
            view(ev.PreflightDone(ok=r.ok))

        got = _text(through_view)
        if result.ok:
            assert got == want
        else:  # then the view's own line, as before
            assert got == want + "preflight failed: nothing was pulled or started\n"
        assert "host.ulimits" in got and "fix: set -1" in got
