"""Issue 28, point 6: the router swapped with no outage, on the testbed (real sshd, dockerd,
Compose, vllm-router 0.1.17, nginx; stand-in engines). Then `up` with a router policy change
under a client loop: `up --plan` says the router is swapped, no request fails, the proxy is
the same container.

The primitive (deploy/router_swap.py) under a client loop: a new router beside the old on
the spare loopback port, every worker registered, the proxy moved by a graceful reload, the
old router drained and stopped; then back home. No request fails, the proxy container is the
same, the home router is a new container, no spare is left, and both names are known to
`down`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pdboot.deploy.router_api import plan_workers
from pdboot.deploy.router_swap import SwapContext, move_router, swap_router
from pdboot.events import Event
from pdboot.inventory.load import load_inventory
from pdboot.plan.build import build_plan
from pdboot.transport.hosts import open_hosts
from pdboot.transport.http import http
from tests.cli import Cli
from tests.testbed.rolling_load import ClientLoop, change_under_load, inventory
from tests.testbed.router_admin import router_json

pytestmark = [pytest.mark.testbed, pytest.mark.slow]


def containers(tb: Any) -> dict[str, str]:
    """name -> id of the deployment's containers on the router host (running or not)."""
    res = tb.hosts["p1"].docker(
        "ps", "-a", "--no-trunc", "--filter", "label=io.pdboot.deployment=roll",
        "--format", "{{.Names}} {{.ID}} {{.State}}",
    )  # fmt: skip
    out = {}
    for line in res.stdout.splitlines():
        name, cid, state = line.split()
        out[name] = f"{cid} {state}"
    return out


def test_the_swap_primitive_moves_the_router_under_load(
    cli: Cli, make_testbed: Any, tmp_path: Path
) -> None:
    tb = make_testbed(["p1", "d1", "d2"])
    path = tb.dir / "inv.yaml"
    inventory(tb, path, prefill=["p1"], decode=["d1", "d2"])
    res = cli("up", str(path), "--skip-preflight", "--no-speed")
    assert res.returncode == 0, res.stdout + res.stderr
    before = containers(tb)
    assert set(before) >= {"pdboot-roll-router", "pdboot-roll-proxy"}, before

    inv = load_inventory(path)
    plan = build_plan(inv)
    hosts = open_hosts(inv, [plan.router.host])
    notes: list[Event] = []
    ctx = SwapContext(
        inv, plan, hosts, http, notes.append, plan_workers(plan), plan.served_model_name
    )
    endpoint = f"http://{tb.hosts['p1'].address}:8000"
    try:
        with ClientLoop(endpoint, "Qwen/Qwen3-0.6B") as loop:
            ctx.clock.sleep(1.0)
            swap_router(ctx, plan.router, to="spare")
            # between the two moves: the spare serves every engine, the home router stopped
            mid = containers(tb)
            assert mid["pdboot-roll-router-swap"].endswith("running"), mid
            assert mid["pdboot-roll-router"].endswith("exited"), mid
            spare = router_json(tb.hosts["p1"], port=inv.router.swap_port)["workers"]
            assert len(spare) == 3 and all(w["model_id"] == "Qwen/Qwen3-0.6B" for w in spare)
            ctx.clock.sleep(1.0)
            swap_router(ctx, plan.router, to="home")
            ctx.clock.sleep(1.0)
        c = loop.counts
        assert c.failed == 0 and c.served >= 20, (c.errors, notes)
    finally:
        hosts.close()
    after = containers(tb)
    assert "pdboot-roll-router-swap" not in after, after
    assert after["pdboot-roll-router"] != before["pdboot-roll-router"], after  # a new one
    assert after["pdboot-roll-proxy"] == before["pdboot-roll-proxy"], after  # reloaded only
    assert len(router_json(tb.hosts["p1"])["workers"]) == 3
    # the proxy's route file names home
    route = tb.hosts["p1"].docker(
        "exec", "pdboot-roll-proxy", "sh", "-c", "read -r l < /tmp/pdboot-route.conf; echo $l"
    )
    assert route.stdout.strip() == "set $pdboot_upstream pdboot_router;", route

    # `up` with a router policy change swaps it: --plan says so, the loop loses nothing
    inventory(tb, path, prefill=["p1"], decode=["d1", "d2"], decode_policy="round_robin")
    shown = cli("up", str(path), "--plan", "--detailed-exitcode")
    text = shown.stdout + shown.stderr
    assert shown.returncode == 2, text
    assert "swapped with no outage" in text and "swap: the new router starts beside" in text, text
    assert "ENDPOINT DOWN" not in text and "endpoint up" in text, text
    proxy = containers(tb)["pdboot-roll-proxy"]
    case = change_under_load(tb, "policy", "rolling", path, ["--skip-preflight"])
    assert case.rc == 0, case.output
    assert case.failed == 0 and case.served >= 20, (case.errors, case.output)
    assert "router swap: the proxy forwards to pdboot-roll-router-swap" in case.output
    assert "decode pulled the KV cache from a prefill engine" in case.output, case.output
    now = containers(tb)
    assert now["pdboot-roll-proxy"] == proxy and "pdboot-roll-router-swap" not in now, now
    cmd = tb.hosts["p1"].docker("inspect", "--format", "{{json .Config.Cmd}}", "pdboot-roll-router")
    assert '"--policy","round_robin"' in cmd.stdout, cmd.stdout
    assert cli("up", str(path), "--plan", "--detailed-exitcode").returncode == 0
    inv = load_inventory(path)
    plan = build_plan(inv)

    # move_router does both moves; a swap interrupted with the proxy on the spare (home
    # stopped) is swapped back home by the next `up` with no failed request
    hosts = open_hosts(inv, [plan.router.host])
    try:
        ctx = SwapContext(
            inv, plan, hosts, http, notes.append, plan_workers(plan), "Qwen/Qwen3-0.6B"
        )
        move_router(ctx)
        swap_router(ctx, plan.router, to="spare")
    finally:
        hosts.close()
    assert "pdboot-roll-router-swap" in containers(tb)
    st = cli("status", str(path))
    assert "router-swap" in st.stdout + st.stderr, st.stdout + st.stderr
    case = change_under_load(tb, "settle", "rolling", path, ["--skip-preflight"])
    assert case.rc == 0, case.output
    assert case.failed == 0 and case.served >= 20, (case.errors, case.output)
    assert "an interrupted swap left the proxy on the spare router" in case.output, case.output
    now = containers(tb)
    assert "pdboot-roll-router-swap" not in now and now["pdboot-roll-router"].endswith("running")

    # down removes both routers' containers
    hosts = open_hosts(inv, [plan.router.host])
    try:
        swap_router(
            SwapContext(
                inv, plan, hosts, http, notes.append, plan_workers(plan), "Qwen/Qwen3-0.6B"
            ),
            plan.router,
            to="spare",
        )
    finally:
        hosts.close()
    assert {"pdboot-roll-router-swap", "pdboot-roll-router"} <= set(containers(tb))
    down = cli("down", str(path))
    assert down.returncode == 0, down.stdout + down.stderr
    assert containers(tb) == {}
