"""`pdboot up --events FILE` on the real testbed: the JSON lines read back tell the whole
deployment (stage order, parallel engine tiers, readiness, the KV proof, the exit code)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli import Cli, output
from tests.e2e.test_up_status_down import down_clean, token_cli, write_inventory

pytestmark = [pytest.mark.testbed, pytest.mark.slow]


@pytest.fixture(scope="module")
def cli(cli: Cli) -> Cli:
    return token_cli(cli)


def test_up_events_file_tells_the_deployment(cli: Cli, testbed_clean: Any, tmp_path: Path) -> None:
    tb = testbed_clean
    inv = write_inventory(
        tb,
        tmp_path / "inv.yaml",
        name="e2eevents",
        prefill_env={"STANDIN_LOAD_SECONDS": "2"},
        decode_env={"STANDIN_LOAD_SECONDS": "2"},
    )
    events_file = tmp_path / "events.jsonl"
    res = cli("up", str(inv), "--events", str(events_file))
    assert res.returncode == 0, output(res)
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    assert all("event" in e and "ts" in e for e in events)
    kinds = [e["event"] for e in events]

    def first(kind: str, **match: Any) -> int:
        return next(
            i
            for i, e in enumerate(events)
            if e["event"] == kind and all(e.get(k) == v for k, v in match.items())
        )

    stages = [e["stage"] for e in events if e["event"] == "stage"]
    # engines, router, then the proxy in front of it
    assert stages == ["pull", "ship", "converge", *["start", "wait"] * 3, "prove"]
    engines = ("decode@decode", "prefill@prefill")
    router_started = first("service_started", service="router@ingress")
    router_ready = first("ready", service="router@ingress")
    for svc in engines:
        # both engine tiers start before the router, and are ready before it is
        assert first("service_started", service=svc) < router_started
        assert first("ready", service=svc) < router_started < router_ready
    assert {e["service"] for e in events if e["event"] == "ready"} == {
        *engines,
        "router@ingress",
        "proxy@ingress",
    }
    assert router_ready < first("ready", service="proxy@ingress")
    ticks = [e for e in events if e["event"] == "waiting"]
    assert ticks and all("service" in s and "log_line" in s for s in ticks[0]["services"])
    (kv,) = [e for e in events if e["event"] == "kv_verdict"]
    assert kv["ok"] is True and kv["confirmed"] is True and "pulled the KV cache" in kv["message"]
    (gate,) = [e for e in events if e["event"] == "gate"]
    assert gate["level"] == "ok" and gate["pd_output"] == gate["direct_output"] != ""
    (speed,) = [e for e in events if e["event"] == "kv_speed"]
    assert [(p["prefill"], p["decode"]) for p in speed["pairs"]] == [engines[::-1]]
    assert kinds.index("kv_verdict") < kinds.index("gate") < kinds.index("kv_speed")
    assert kinds[-1] == "done" and events[-1]["exit_code"] == 0 and events[-1]["command"] == "up"
    # both tiers start in one stage and are waited for together (no timing assertion here:
    # bench/up.py measures time to ready against the slowest tier's load)
    (engine_tiers,) = [e for e in events if e["event"] == "tier_ready" and "decode" in e["tiers"]]
    assert engine_tiers["tiers"] == ["decode", "prefill"]
    first_start = next(e for e in events if e["event"] == "stage" and e["stage"] == "start")
    assert set(engines) <= set(first_start["services"]), first_start
    assert all({s["service"] for s in t["services"]} >= set(engines) for t in ticks[:1])

    # `-`: the events go to stdout alone (the display goes to stderr)
    again = cli("up", str(inv), "--events", "-")
    assert again.returncode == 0, output(again)
    lines = [json.loads(line) for line in again.stdout.splitlines()]
    assert lines[-1]["event"] == "done" and lines[-1]["exit_code"] == 0
    assert {e["action"] for e in lines if e["event"] == "service_action"} == {"unchanged"}
    assert "endpoint:" in again.stderr

    down_events = tmp_path / "down.jsonl"
    res = cli("down", str(inv), "--events", str(down_events))
    assert res.returncode == 0, output(res)
    got = [json.loads(line) for line in down_events.read_text().splitlines()]
    assert [e["role"] for e in got if e["event"] == "stopped"] == [
        "proxy",
        "router",
        "prefill",
        "decode",
    ]
    assert got[-1]["event"] == "done" and got[-1]["exit_code"] == 0
    down_clean(cli, tb, inv, "e2eevents")
