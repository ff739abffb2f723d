"""The order of a router swap's steps and its failure path (deploy/router_swap.py), driven
with a recording connection and HTTP function (the testbed test, tests/e2e/test_router_swap.py,
runs it against real Docker, vllm-router and nginx): the proxy moves only once the new router
lists every worker healthy; a new router that never serves is removed and the proxy is never
touched; a spare left behind is swapped back home or removed by where the proxy points."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from pdboot.deploy.router_swap import RouterSwapError, SwapContext, settle_spare, swap_router
from pdboot.deploy.waits import FakeClock
from pdboot.inventory.load import parse_inventory
from pdboot.plan.build import build_plan
from pdboot.plan.converge import Observed
from pdboot.transport.connection import CommandResult
from pdboot.transport.hosts import Hosts, Link
from pdboot.transport.http import HttpAnswer

INV = """name: demo
model: m
hosts: {a: {address: 192.0.2.10}, b: {address: 192.0.2.11}}
prefill: {hosts: [a], gpus: [0]}
decode: {hosts: [b], gpus: [0]}
router: {host: a}
"""
WORKERS = {"http://192.0.2.10:8200": "prefill", "http://192.0.2.11:8201": "decode"}


@dataclass
class Conn:
    """Records each command; `route` is what the proxy's route file holds."""

    route: str = ""
    log: list[str] = field(default_factory=list)
    name: str = "a"
    lost: str | None = None

    def run(self, cmd: Any, timeout: float | None = None, stdin: str | None = None) -> Any:
        argv = list(cmd)
        self.log.append(
            " ".join(argv[:4]) + (" " + argv[-1] if argv[:2] == ["docker", "compose"] else "")
        )
        if argv[:2] == ["docker", "exec"] and "read -r l" in argv[-1]:
            return CommandResult(0, self.route, "", 0.0)
        return CommandResult(0, "", "", 0.0)

    def put_text(self, path: str, text: str, mode: int = 0o644) -> None:
        self.log.append(f"put {path.rsplit('/', 1)[-1]}")

    def close(self) -> None:
        pass


class Routers:
    """The routers' HTTP as the swap sees it: `serving` ports answer /health; a registered
    worker is listed healthy."""

    def __init__(self, serving: set[int]) -> None:
        self.serving = serving
        self.workers: dict[int, dict[str, str]] = {}
        self.calls: list[str] = []

    def __call__(self, url: str, *, body: Any = None, method: Any = None, **_: Any) -> HttpAnswer:
        port = int(url.split(":")[2].split("/")[0])
        path = "/" + url.split("/", 3)[3]
        self.calls.append(f"{method or ('POST' if body else 'GET')} {port}{path}")
        if port not in self.serving:
            return HttpAnswer(0, "", "connection refused")
        if path == "/health":
            return HttpAnswer(200, "ok")
        listed = self.workers.setdefault(port, {})
        if body is not None:
            listed[body["url"]] = body["worker_type"]
            return HttpAnswer(200, "{}")
        items = [{"url": u, "worker_type": t, "is_healthy": True, "load": 0, "model_id": "m"}
                 for u, t in listed.items()]  # fmt: skip
        return HttpAnswer(200, json.dumps({"workers": items}))


def ctx(conn: Conn, routers: Routers) -> SwapContext:
    inv = parse_inventory(INV)
    plan = build_plan(inv)
    hosts = Hosts({"a": Link(conn, None)})  # type: ignore[arg-type]
    clock = FakeClock()
    return SwapContext(inv, plan, hosts, routers, lambda e: None, WORKERS, "m", clock=clock)


def test_the_proxy_moves_after_the_new_router_lists_every_worker() -> None:
    conn, routers = Conn(), Routers({8081, 8082})
    c = ctx(conn, routers)
    swap_router(c, c.plan.router, to="spare")
    assert conn.log[:2] == [
        "put router-swap.yaml",
        "docker compose --project-name pdboot-demo-swap router-swap",
    ]
    assert conn.log[2].startswith("docker exec pdboot-demo-proxy sh")  # the switch
    assert conn.log[3:] == ["docker stop --time 30"]  # the old (home) router, kept
    # registered on the new router before the switch, with the model named
    assert sorted(routers.workers[8082]) == sorted(WORKERS)
    assert "POST 8081/workers" not in routers.calls
    swap_router(c, c.plan.router, to="home")
    assert conn.log[4] == "docker compose --project-name pdboot-demo router"
    assert conn.log[-2:] == ["docker stop --time 30", "docker rm --force pdboot-demo-router-swap"]


def test_a_new_router_that_never_serves_is_removed_and_the_proxy_untouched() -> None:
    conn, routers = Conn(), Routers({8081})
    with pytest.raises(RouterSwapError, match=r"did not answer /health.*old router keeps serving"):
        swap_router(ctx(conn, routers), ctx(conn, routers).plan.router, to="spare")
    assert not [line for line in conn.log if line.startswith("docker exec")]
    assert conn.log[-2:] == ["docker stop --time 30", "docker rm --force pdboot-demo-router-swap"]


def _spare() -> Observed:
    labels = {"io.pdboot.deployment": "demo", "io.pdboot.role": "router",
              "io.pdboot.host": "a", "io.pdboot.router-slot": "spare"}  # fmt: skip
    return Observed("a", "id", "pdboot-demo-router-swap", labels, "running")


def test_a_spare_left_behind_goes_home_or_away_by_where_the_proxy_points() -> None:
    conn, routers = Conn(route="set $pdboot_upstream pdboot_router_swap;"), Routers({8081, 8082})
    assert settle_spare(ctx(conn, routers), [_spare()])
    assert "docker compose --project-name pdboot-demo router" in conn.log  # swapped home
    conn2 = Conn(route="set $pdboot_upstream pdboot_router;")
    assert settle_spare(ctx(conn2, Routers({8081, 8082})), [_spare()])
    assert not [line for line in conn2.log if "compose" in line]  # only removed
    assert conn2.log[-1] == "docker rm --force pdboot-demo-router-swap"
    assert not settle_spare(ctx(Conn(), Routers(set())), [])


def test_a_swap_opens_one_admin_channel_per_router_and_closes_them_with_the_run() -> None:
    conn, routers = Conn(), Routers({8081, 8082})
    c = ctx(conn, routers)
    spare = c.placed(c.plan.router, "spare")
    assert c.admin(spare) is c.admin(spare)
    swap_router(c, c.plan.router, to="spare")
    swap_router(c, c.plan.router, to="home")
    # the home router's and the spare's, each opened once for every step that reached it
    assert sorted(c.channels) == sorted([c.plan.router.url, spare.url])
    assert routers.calls.count("POST 8082/workers") == len(WORKERS)
    c.close()
    assert c.channels == {}
