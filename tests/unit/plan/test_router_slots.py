"""The router's two places (plan/router_slots.py) and what knows them: the proxy's conf names
both upstreams with home as the default, the spare's command and labels, the spare's
container read back as its own service, the swap ports claimed with the others and checked
by preflight."""

from __future__ import annotations

import pytest

from pdboot.inventory.load import InventoryError, parse_inventory
from pdboot.plan.build import build_plan
from pdboot.plan.converge import Observed, decode_restarts, orphans, plan_down, plan_up
from pdboot.plan.proxy import ROUTE_GLOB, UPSTREAM_SPARE, proxy_conf_text, route_text
from pdboot.plan.render import render_services
from pdboot.plan.rolling import ROUTER_SWAP_HOW, RollPlan, can_swap, plan_roll
from pdboot.plan.router_slots import SPARE_NAME, spare_project, spare_router, with_flag
from pdboot.preflight.contexts import contexts
from tests.unit.builders import running_as_planned

INV = """name: demo
model: m
hosts: {a: {address: 192.0.2.10}, b: {address: 192.0.2.11}}
prefill: {hosts: [a], gpus: [0]}
decode: {hosts: [b], gpus: [0]}
router: {host: a%s}
"""


def test_the_proxy_names_both_routers_and_forwards_home_by_default() -> None:
    conf = proxy_conf_text(parse_inventory(INV % ""))
    assert "upstream pdboot_router {\n        server 127.0.0.1:8081;" in conf
    assert "upstream pdboot_router_swap {\n        server 127.0.0.1:8082;" in conf
    assert "set $pdboot_upstream pdboot_router;" in conf
    # the route file comes after the default, so its `set` wins
    assert conf.index("set $pdboot_upstream") < conf.index(f"include {ROUTE_GLOB};")
    assert conf.count("proxy_pass http://$pdboot_upstream/") == 4  # each its fixed path
    assert route_text(UPSTREAM_SPARE) == "set $pdboot_upstream pdboot_router_swap;\n"


def test_the_spare_router_differs_in_its_ports_name_and_slot_only() -> None:
    inv = parse_inventory(INV % ", swap_port: 9100, swap_metrics_port: 9101")
    router = build_plan(inv).router
    spare = spare_router(inv, router)
    assert spare.name == SPARE_NAME and spare.container_name == "pdboot-demo-router-swap"
    assert spare.port == 9100 and spare.metrics_port == 9101
    assert spare.url == "http://127.0.0.1:9100"
    cmd = list(spare.command)
    assert cmd[cmd.index("--port") + 1] == "9100"
    assert cmd[cmd.index("--prometheus-port") + 1] == "9101"
    assert with_flag(router.command, "--port", "9100") != router.command
    same = [a for a in cmd if a not in ("9100", "9101")]
    assert same == [a for a in router.command if a not in ("8081", "29000")]
    assert dict(spare.labels)["io.pdboot.router-slot"] == "spare"
    assert spare.image == router.image and spare.env_file == router.env_file
    text = render_services(spare_project(spare), [spare])
    assert "name: pdboot-demo-swap" in text and "container_name: pdboot-demo-router-swap" in text


def _observed(labels: dict[str, str]) -> Observed:
    base = {"io.pdboot.deployment": "demo", "io.pdboot.role": "router", "io.pdboot.host": "a"}
    return Observed("a", "id", "n", {**base, **labels}, "running")


def test_a_spare_router_left_behind_is_its_own_service_and_down_removes_it() -> None:
    plan = build_plan(parse_inventory(INV % ""))
    home, spare = _observed({}), _observed({"io.pdboot.router-slot": "spare"})
    assert home.service_name == "router" and spare.service_name == "router-swap"
    assert orphans(plan, [home, spare]) == [spare]
    assert [o for _, batch in plan_down("demo", [home, spare]) for o in batch] == [home, spare]


def test_the_swap_ports_are_claimed_and_checked() -> None:
    ports = dict((p, w) for p, w in contexts(parse_inventory(INV % "")).get("a").ports)  # type: ignore[union-attr]
    assert ports[8082] == "swap router HTTP (loopback)"
    assert ports[29001] == "swap router metrics"
    with pytest.raises(
        InventoryError, match=r"swap_port: port 8082 on host .a. is already used by"
    ):
        parse_inventory(INV % ", metrics_port: 8082")


# --------------------------------------------------------------------------- up's plan

ROLL_INV = """name: demo
model: m
hosts: {a: {address: 192.0.2.10}, b: {address: 192.0.2.11}, c: {address: 192.0.2.12}}
prefill: {hosts: [a], gpus: [0]}
decode: {hosts: [b, c], gpus: [0]}
router: {host: a%s}
"""


def _roll(extra: str, swap: bool) -> RollPlan:
    wanted = build_plan(parse_inventory(ROLL_INV % extra))
    now = running_as_planned(build_plan(parse_inventory(ROLL_INV % "")).services())
    first = plan_up(wanted, now, live=True)
    gone = orphans(wanted, now)
    return plan_roll(wanted, first, decode_restarts(first), gone, rolling=True, swap=swap)


def test_a_router_policy_change_swaps_the_router_with_the_endpoint_up() -> None:
    r = _roll(", decode_policy: round_robin", swap=True)
    (step,) = r.steps
    assert r.router_swap and step.action == "router" and step.how == ROUTER_SWAP_HOW
    assert step.endpoint_up and not step.outage
    assert step.reason.startswith("configuration changed")
    # without the swap (plan_roll's swap off) the same change recreates it, the endpoint down
    old = _roll(", decode_policy: round_robin", swap=False)
    assert not old.router_swap and not old.steps[0].endpoint_up and old.steps[0].outage


def test_no_swap_when_the_proxy_changes_too_or_no_router_runs() -> None:
    # a new internal port changes the proxy's conf: the running proxy cannot move to it
    r = _roll(", internal_port: 8090", swap=True)
    assert not r.router_swap and not r.steps[0].endpoint_up
    wanted = build_plan(parse_inventory(ROLL_INV % ", decode_policy: round_robin"))
    before = build_plan(parse_inventory(ROLL_INV % ""))
    now = [o for o in running_as_planned(before.services()) if o.role != "router"]
    steps = [s for st in plan_up(wanted, now, live=True) for s in st]
    assert not can_swap(steps)
