"""`pdboot watch INVENTORY` as an operator runs it: the real CLI in a subprocess, its plan's
engines (stand-ins, an emulation, on loopback, where the plan puts them) and the real vllm-router
(--enable-igw) from the inventory, a decode whose pulled KV lands corrupted: evicted through
the router, the JSON-lines events say so, exit 1 after Ctrl-C; its /verdicts and /metrics
while it runs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from pdboot.inventory.load import parse_inventory
from pdboot.plan.build import build_plan
from tests.testbed.standin.test_standin import DEADLINE, get, stop_bed
from tests.testbed.standin.watch_bed import Proc, Router, stable_port

INVENTORY = """
name: watchcli
model: org/m
served_model_name: m
hosts:
  box: {{address: 127.0.0.1}}
prefill: {{hosts: [box], port: {b}, side_channel_port: {b1}, gpus: [2]}}
decode: {{hosts: [box], port: {b2}, side_channel_port: {b3}, gpus: [[0], [1]], engines_per_host: 2}}
router: {{host: box, port: {b4}, metrics_port: {b6}}}
watch: {{interval_seconds: 1, deadline_seconds: 2, readmit_after: 2, port: {b5}}}
"""


def _output(cli: subprocess.Popen[str]) -> str:
    """What it printed, once it is stopped (a failed wait must not wait on it forever)."""
    if cli.poll() is None:
        cli.kill()
    return cli.communicate()[0]


def _rounds(events: Path) -> int:
    text = events.read_text() if events.exists() else ""
    return sum(1 for line in text.splitlines() if '"event": "watch_round"' in line)


def test_the_cli_evicts_a_corrupting_decode_through_the_router(tmp_path: Path) -> None:
    # engines of a tier are 10 ports apart (the port scheme); every port is set here, in one
    # 700-port block, so no default (the router's metrics port 29000) can collide with it
    base = stable_port() // 100 * 100
    text = INVENTORY.format(
        b=base,
        b1=base + 100,
        b2=base + 200,
        b3=base + 300,
        b4=base + 400,
        b5=base + 500,
        b6=base + 600,
    )
    plan = build_plan(parse_inventory(text))  # where `up` would have put each engine
    env = {"decode-1": {"STANDIN_CORRUPT_PULLED_KV": "1"}}
    wport = base + 500
    inv = tmp_path / "inventory.yaml"
    inv.write_text(text)
    events = tmp_path / "events.jsonl"
    procs: list[Proc] = []
    router: Router | None = None
    cli: subprocess.Popen[str] | None = None
    try:
        for s in plan.services():
            if s.is_engine:
                procs.append(
                    Proc(
                        tmp_path,
                        s.name,
                        s.role,
                        env.get(s.name, {}),
                        s.address,
                        s.port,
                        s.side_channel_port,
                    )
                )
        corrupt = next(p for p in procs if p.name == "decode-1")
        healthy = next(p for p in procs if p.name == "decode")
        router = Router(tmp_path, procs[0].url, procs[1].url, "127.0.0.1", plan.router.port)
        for p in procs:
            router.add(p.url, p.role)
        cli = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pdboot",
                "watch",
                str(inv),
                "--no-restart",
                "--events",
                str(events),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        verdicts = None
        end = time.monotonic() + DEADLINE
        while verdicts is None or not verdicts["pairs"]:  # its /verdicts while it runs
            assert cli.poll() is None and time.monotonic() < end, _output(cli)
            try:
                verdicts = json.loads(get(f"http://127.0.0.1:{wport}/verdicts")[1])
            except OSError:
                time.sleep(0.1)
        metrics = get(f"http://127.0.0.1:{wport}/metrics")[1]
        while _rounds(events) < 4:  # then Ctrl-C, as an operator stops it
            assert cli.poll() is None and time.monotonic() < end + 60, _output(cli)
            time.sleep(0.1)
        cli.send_signal(signal.SIGINT)
        out, _ = cli.communicate(timeout=120)
        router_list = router.listed()
    finally:
        if cli is not None and cli.poll() is None:
            cli.kill()
            cli.wait()
        stop_bed(router, procs)
    assert cli.returncode == 1, out
    assert "pdboot_watch_canary_ok{" in metrics
    docs = [json.loads(line) for line in events.read_text().splitlines()]
    acts = [d for d in docs if d["event"] == "watch_action"]
    assert [(a["action"], a["engine"], a["ok"], a["fault"]) for a in acts] == [
        ("evict", "decode-1@box", True, "wrong_answer")
    ], acts
    rounds = [d for d in docs if d["event"] == "watch_round"]
    assert len(rounds) >= 4
    bad = {(p["prefill"], p["decode"]) for r in rounds for p in r["pairs"] if p["fault"]}
    assert bad == {("prefill@box", "decode-1@box")}
    assert corrupt.url not in router_list and healthy.url in router_list
    assert "evict decode-1@box" in out
