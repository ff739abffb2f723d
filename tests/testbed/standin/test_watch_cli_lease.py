"""`pdboot watch` under the deployment lock, as an operator runs it: the real CLI with restarts
on (the foreground command, which takes the lock), stand-in engines and the real vllm-router on
this machine (the inventory's host is ``local``), and the lock held as `up` holds it
(transport/lock.py, the same scripts). A decode stops: while the lock is held, watch reports it
and leaves it in the router; once released, watch evicts it in its next rounds."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from pdboot.inventory.load import parse_inventory
from pdboot.plan.build import build_plan
from pdboot.transport import lock
from pdboot.transport.connection import LocalConnection
from tests.testbed.standin.test_standin import DEADLINE, stop_bed
from tests.testbed.standin.watch_bed import Proc, Router, stable_port

INVENTORY = """
name: watchlease{b}
model: org/m
served_model_name: m
hosts:
  box: {{address: local}}
prefill: {{hosts: [box], port: {b}, side_channel_port: {b1}, gpus: [2]}}
decode: {{hosts: [box], port: {b2}, side_channel_port: {b3}, gpus: [[0], [1]], engines_per_host: 2}}
router: {{host: box, port: {b4}, internal_port: {b6}, metrics_port: {b7}}}
watch: {{interval_seconds: 0.5, deadline_seconds: 2, readmit_after: 2, port: {b5}}}
"""


def _docs(events: Path) -> list[dict[str, object]]:
    text = events.read_text() if events.exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _wait(cli: subprocess.Popen[str], events: Path, ok: object, what: str) -> None:
    end = time.monotonic() + DEADLINE
    while not ok(_docs(events)):  # type: ignore[operator]
        if cli.poll() is not None or time.monotonic() > end:
            cli.kill()
            raise AssertionError(f"no {what}: {cli.communicate()[0]}")
        time.sleep(0.1)


def test_watch_does_not_act_while_the_deployment_is_held_and_does_once_released(
    tmp_path: Path,
) -> None:
    base = stable_port() // 100 * 100
    ports = {f"b{i}": base + 100 * i for i in range(1, 8)}
    text = INVENTORY.format(b=base, **ports)
    inv_doc = parse_inventory(text)
    plan = build_plan(inv_doc)
    lock_path = lock.lock_dir(inv_doc.remote_dir, inv_doc.name)
    inv = tmp_path / "inventory.yaml"
    inv.write_text(text)
    events = tmp_path / "events.jsonl"
    procs: list[Proc] = []
    router: Router | None = None
    cli: subprocess.Popen[str] | None = None
    up: lock.HeldLock | None = None
    try:
        for s in plan.services():
            if s.is_engine:
                procs.append(
                    Proc(tmp_path, s.name, s.role, {}, s.address, s.port, s.side_channel_port)
                )
        stopped = next(p for p in procs if p.name == "decode-1")
        router = Router(tmp_path, procs[0].url, procs[1].url, "127.0.0.1", plan.router.port)
        for p in procs:
            router.add(p.url, p.role)
        # an `up` holds the deployment before watch starts
        up = lock.acquire(LocalConnection("box"), lock_path, "up", wait=False, say=print)
        cli = subprocess.Popen(
            [sys.executable, "-m", "pdboot", "watch", str(inv), "--events", str(events)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        stopped.stop()
        _wait(
            cli,
            events,
            lambda d: sum(1 for e in d if e["event"] == "watch_held" and e["unhealthy"]) >= 3,
            "three held rounds that saw the stopped decode",
        )
        held_list = router.listed()
        acts_while_held = [e for e in _docs(events) if e["event"] == "watch_action"]
        up.release()
        up = None
        _wait(
            cli,
            events,
            lambda d: any(e["event"] == "watch_action" and e["action"] == "evict" for e in d),
            "eviction once the lock was released",
        )
        cli.send_signal(signal.SIGINT)
        out, _ = cli.communicate(timeout=120)
        after_list = router.listed()
    finally:
        if up is not None:
            up.release()
        if cli is not None and cli.poll() is None:
            cli.kill()
            cli.wait()
        stop_bed(router, procs)
        shutil.rmtree(lock_path, ignore_errors=True)  # a watch killed mid-round left it
    assert acts_while_held == [] and stopped.url in held_list
    docs = _docs(events)
    held = [e for e in docs if e["event"] == "watch_held"]
    assert held[0]["held"] and "`pdboot up`" in str(held[0]["holder"])
    assert any(not e["held"] for e in held)  # it said when it acted again
    acts = [(e["action"], e["engine"]) for e in docs if e["event"] == "watch_action"]
    assert ("evict", "decode-1@box") in acts, acts
    assert stopped.url not in after_list
    assert "not acting" in out
