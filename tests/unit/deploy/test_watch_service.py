"""The inventory's watch: section, the watch service in the plan and its compose text, and
`up` / `down` / `status` with it (fake hosts, engine, HTTP and clock, as test_orchestrator)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import typer
from rich.console import Console

from pdboot import events as ev
from pdboot.cli.main import app
from pdboot.deploy.status import status
from pdboot.deploy.up import UpOptions
from pdboot.deploy.watch.service import WatchOptions
from pdboot.inventory.load import InventoryError, parse_inventory
from pdboot.plan.build import build_plan
from pdboot.plan.render import render_host
from pdboot.plan.watch.sidecar import WATCH_INVENTORY, WATCH_INVENTORY_IN_CONTAINER
from pdboot.transport.http import HttpAnswer
from pdboot.views.status import print_status, status_json
from tests.unit.orchestrator_fakes import Recorder, World, inventory, run_down, up_in
from tests.unit.plan.test_render import compose_config

WATCH = {"image": "registry.example/pdboot:0.1", "interval_seconds": 5, "port": 29111}


def with_watch(section: Mapping[str, Any] = WATCH, **overrides: Any) -> Any:
    """The fake world's inventory with this watch: section (and other ``overrides``)."""
    return inventory({"watch": section, **overrides})


def test_watch_section_defaults_and_refusals() -> None:
    inv = with_watch({})
    assert inv.watch is not None and inv.watch.interval_seconds == 30
    assert inv.watch.readmit_after == 3 and inv.watch.image is None
    assert inventory().watch is None
    with pytest.raises(InventoryError, match="intervall"):
        with_watch({"intervall_seconds": 5})
    with pytest.raises(InventoryError, match="image"):
        with_watch({"image": "a b; rm -rf /"})
    with pytest.raises(InventoryError, match="interval_seconds"):
        with_watch({"interval_seconds": 0})


def test_no_image_no_service() -> None:
    plan = build_plan(with_watch({"interval_seconds": 5}))
    assert plan.watch is None and len(plan.stages) == 4  # engines x2, router, proxy


def test_the_service_runs_beside_the_router_last_with_the_shipped_inventory() -> None:
    plan = build_plan(with_watch())
    w = plan.watch
    assert w is not None and plan.stages[-1] == (w,)
    assert (w.host, w.role, w.url) == ("r", "watch", "http://192.0.2.12:29111")
    assert w.entrypoint == ("pdboot",) and w.command[:2] == ("watch", WATCH_INVENTORY_IN_CONTAINER)
    assert "--no-restart" in w.command and w.command[2:4] == ("--listen", "192.0.2.12:29111")
    assert w.mounts[0].source == f"/var/lib/pdboot/demo/{WATCH_INVENTORY}" and w.mounts[0].read_only
    assert not w.is_engine and w.restart == plan.router.restart
    text = render_host(plan, "r")
    assert "pdboot" in text and "29111" in text and "watch:" in text
    # the engines' router registration and checks leave it out
    assert {s.key for s in plan.services() if s.is_engine} == {"prefill@p1", "decode@d1"}


def test_the_service_command_parses_in_the_real_cli_and_compose_accepts_it(
    tmp_path: Path,
) -> None:
    plan = build_plan(with_watch())
    w = plan.watch
    assert w is not None
    group = typer.main.get_command(app)
    ctx = group.make_context("pdboot", list(w.command))  # type: ignore[attr-defined]
    sub = group.get_command(ctx, w.command[0])  # type: ignore[attr-defined]
    params = sub.make_context("watch", list(w.command[1:])).params
    assert params["listen"] == "192.0.2.12:29111" and params["no_restart"] is True
    opts = WatchOptions.parse(params["listen"], restarts=False)
    assert (opts.listen, opts.port) == ("192.0.2.12", 29111)
    (tmp_path / "compose.yaml").write_text(render_host(plan, "r"))
    got = compose_config(tmp_path)["services"]["watch"]
    assert got["entrypoint"] == ["pdboot"] and got["command"] == list(w.command)
    assert got["network_mode"] == "host" and got["restart"] == w.restart
    (mount,) = got["volumes"]
    assert mount["target"] == WATCH_INVENTORY_IN_CONTAINER and mount["read_only"] is True


def _after_the_proof(events: list[ev.Event]) -> bool:
    """watch's canaries would count in the KV proof's window: it starts after the proof."""
    proof = next(i for i, e in enumerate(events) if isinstance(e, ev.KVVerdict))
    start = next(
        i
        for i, e in enumerate(events)
        if isinstance(e, ev.ServiceStarted) and e.service == "watch@r"
    )
    return proof < start


def test_up_starts_watch_after_the_router_and_down_removes_it_first() -> None:
    world = World(with_watch())
    rec = Recorder()
    code = up_in(world, UpOptions(skip_preflight=True), rec)
    assert code == 0, [e for e in rec.events if isinstance(e, ev.Failure)]
    started = [e.service for e in rec.of(ev.ServiceStarted)]
    assert started[-3:] == ["router@r", "proxy@r", "watch@r"]
    assert _after_the_proof(rec.events)
    w = build_plan(world.inv).watch
    assert w is not None and w.url not in world.registered  # the router's workers: engines only
    assert set(world.registered.values()) == {"prefill", "decode"}
    # a re-run with watch running: removed for up's checks, started again after them
    again = Recorder()
    code = up_in(world, UpOptions(skip_preflight=True), again)
    assert code == 0, [e for e in again.events if isinstance(e, ev.Failure)]
    assert [e.service for e in again.of(ev.ServiceStarted)] == ["watch@r"]
    assert _after_the_proof(again.events)
    assert len(world.of_role("watch")) == 1
    shipped = world.shipped["r"][WATCH_INVENTORY]
    assert parse_inventory(shipped) == world.inv  # the service loads what the operator wrote
    assert WATCH_INVENTORY not in world.shipped.get("p1", {})
    assert run_down(world, rec) == 0
    stopped = [e.role for e in rec.of(ev.Stopped)]
    assert stopped[0] == "watch" and not world.containers


def test_status_shows_the_last_verdict_per_pair() -> None:
    world = World(with_watch())
    rec = Recorder()
    up_in(world, UpOptions(skip_preflight=True, prove=False), rec)
    doc = {
        "rounds": 7,
        "out_of_rotation": ["decode@d1"],
        "pairs": [
            {
                "prefill": "prefill@p1",
                "decode": "decode@d1",
                "ok": False,
                "result": "wrong",
                "fault": "wrong_answer",
                "reason": "prefill@p1 -> decode@d1: wrong answer",
                "seconds": 0.2,
            }
        ],
    }

    def fetch(url: str, **kw: Any) -> HttpAnswer:
        if url == "http://192.0.2.12:29111/verdicts":
            return HttpAnswer(200, json.dumps(doc))
        return world.fetch(url, **kw)

    out = Recorder()
    status(world.inv, out, hosts_factory=world.hosts, fetch=fetch)
    (report,) = out.of(ev.StatusReport)
    assert report.watch.rounds == 7 and report.watch.out_of_rotation == ("decode@d1",)
    (pair,) = report.watch.pairs
    assert (pair.ok, pair.fault) == (False, "wrong_answer")
    assert "watch@r" in [r.service for r in report.services]
    assert json.loads(status_json(report))["watch"]["pairs"][0]["fault"] == "wrong_answer"
    console = Console(record=True, width=120)
    print_status(console, report)
    assert "FAIL prefill@p1 -> decode@d1" in console.export_text()


# ------------------------------------------------- issue 32.3: the service's HTTP server


def test_the_service_binds_where_asked_and_gets_only_the_api_key() -> None:
    keyed = {"secrets": {"api_key": "env:K", "hf_token": "env:T"}}
    plan = build_plan(with_watch(**keyed))
    assert plan.watch is not None
    assert "192.0.2.12:29111" in plan.watch.command  # default: the router host's address
    assert plan.watch.env_file == "watch-secrets.env"  # not secrets.env (the HF token)
    from pdboot.plan.watch.sidecar import watch_secrets_text

    assert watch_secrets_text("k1") == "VLLM_API_KEY=k1\n"
    bound = build_plan(with_watch({**WATCH, "bind": "127.0.0.1"}))
    assert bound.watch is not None and "127.0.0.1:29111" in bound.watch.command
    with pytest.raises(InventoryError):
        with_watch({**WATCH, "bind": "x; rm -rf /"})


def test_the_http_server_drops_stalled_clients_and_caps_connections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket
    import time

    from pdboot.deploy.watch import service as ws
    from pdboot.plan.watch.metrics import WatchMetrics

    monkeypatch.setattr(ws, "REQUEST_TIMEOUT", 0.5)
    monkeypatch.setattr(ws, "MAX_CONNECTIONS", 2)
    server = ws.serve(None, WatchMetrics(), "127.0.0.1", 0)  # type: ignore[arg-type]
    port = server.server_address[1]
    try:
        stalled = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        for s in stalled:
            s.sendall(b"GET /metr")  # half a request, never finished
        time.sleep(0.1)
        extra = socket.create_connection(("127.0.0.1", port))
        extra.settimeout(2)
        assert extra.recv(100) == b""  # over the cap: closed at once, no thread for it
        t0 = time.monotonic()
        stalled[0].settimeout(5)
        assert stalled[0].recv(100) == b""  # dropped after REQUEST_TIMEOUT
        assert time.monotonic() - t0 < 3
        time.sleep(0.3)
        ok = socket.create_connection(("127.0.0.1", port))
        ok.sendall(b"GET /health HTTP/1.0\r\n\r\n")
        ok.settimeout(5)
        assert ok.recv(100).startswith(b"HTTP/1.0 200")  # slots freed: served again
    finally:
        server.shutdown()
        server.server_close()
