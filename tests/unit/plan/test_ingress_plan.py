"""The standby ingress's plan (plan/ingress.py): the standby's router and proxy, keepalived's
service and configuration on both ingress hosts, golden files, the real `docker compose
config` on every rendered file; and nothing of it without the keys.

Its golden files: tests/unit/golden/standby/ (golden_check.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pdboot.inventory.load import load_inventory
from pdboot.plan.build import build_plan
from pdboot.plan.change_plan import ChangeOptions, change_plan
from pdboot.plan.converge import Observed, orphans
from pdboot.plan.facts import PlanFacts
from pdboot.plan.ingress import KEEPALIVED_CAPS, PRIORITY_ACTIVE, PRIORITY_STANDBY
from pdboot.plan.model import (
    KEEPALIVED_CONF_FILE,
    LABEL_DEPLOYMENT,
    LABEL_HOST,
    LABEL_ROLE,
    ROUTER_SECRETS_FILE,
    SECRETS_FILE,
)
from pdboot.plan.proxy import proxy_conf_text
from pdboot.plan.render import render_all, render_summary
from tests.unit.builders import STANDBY_HOSTS, STANDBY_PAIR, inventory, running_as_planned
from tests.unit.golden_check import assert_golden
from tests.unit.paths import GOLDEN, INVENTORIES
from tests.unit.plan.test_render import compose_config

STANDBY = INVENTORIES / "standby.yaml"
HOSTS = STANDBY_HOSTS
PAIR = STANDBY_PAIR


def golden_files(path: Path) -> dict[str, str]:
    inv = load_inventory(path)
    plan = build_plan(inv, PlanFacts(tcp_ifaces={"gpu-a": ["ens1f0"]}))
    files = {f"{h}/compose.yaml": t for h, t in render_all(plan).items()}
    files["summary.txt"] = render_summary(plan, inv.weights, inv.model_revision)
    for host in (inv.router.host, inv.router.standby or inv.router.host):
        files[f"{host}/proxy-nginx.conf"] = proxy_conf_text(inv)  # render --out's
    for host, text in plan.keepalived_confs.items():
        files[f"{host}/{KEEPALIVED_CONF_FILE}"] = text
    return files


def test_golden() -> None:
    files = golden_files(STANDBY)
    folder = GOLDEN / "standby"
    assert_golden(folder, files)


def test_docker_compose_accepts_both_ingress_hosts(tmp_path: Path) -> None:
    plan = build_plan(load_inventory(STANDBY), PlanFacts(tcp_ifaces={"gpu-a": ["ens1f0"]}))
    for host, text in render_all(plan).items():
        folder = tmp_path / host
        folder.mkdir()
        (folder / "compose.yaml").write_text(text)
        (folder / SECRETS_FILE).write_text("")
        (folder / ROUTER_SECRETS_FILE).write_text("")  # each ingress host's router reads it
        cfg = compose_config(folder)
        got = cfg["services"]["keepalived"]
        assert got["network_mode"] == "host"
        assert sorted(got["cap_add"]) == sorted(KEEPALIVED_CAPS)
        assert got["volumes"][0]["read_only"] is True
        assert sorted(cfg["services"]) == sorted(s.name for s in plan.hosts[host].services)


def test_without_the_keys_the_plan_is_the_same() -> None:
    base = inventory(hosts=HOSTS)
    plan = build_plan(base)
    assert plan.standby == () and plan.keepalived == () and not plan.keepalived_confs
    assert plan.endpoint == "http://192.0.2.12:8000"
    assert "s" not in plan.hosts
    # the keys change only what they add: the router host's services keep their hashes
    with_standby = build_plan(inventory(hosts=HOSTS, overrides={"router.standby": "s"}))
    hashes = {s.key: s.config_hash for s in plan.services()}
    assert hashes == {s.key: s.config_hash for s in with_standby.services()}


def test_the_standby_runs_the_router_hosts_router_and_proxy() -> None:
    plan = build_plan(inventory(hosts=HOSTS, overrides=PAIR))
    router, proxy = plan.standby_router, plan.standby_proxy
    assert router is not None and proxy is not None
    assert (router.host, proxy.host) == ("s", "s")
    # the same workers, policy and ports; its metrics on the standby's own address (the
    # router host's cannot be bound there: the router would exit, os error 99)
    i = plan.router.command.index("--prometheus-host") + 1
    assert plan.router.command[i] == "192.0.2.12" and router.command[i] == "192.0.2.13"
    assert router.command[:i] + router.command[i + 1 :] == (
        plan.router.command[:i] + plan.router.command[i + 1 :]
    )
    assert router.metrics_address == "192.0.2.13"
    assert router.address == "127.0.0.1"  # loopback, like the router host's
    assert plan.proxy is not None and proxy.mounts == plan.proxy.mounts
    assert proxy.address == "192.0.2.13"
    assert dict(router.labels)[LABEL_HOST] == "s"
    assert [s.key for s in plan.hosts["s"].services] == [
        "router@s",
        "proxy@s",
        "keepalived@s",
    ]
    # the standby is not a stage: rolls, swaps and waits of the router host are unchanged
    assert all(s.host != "s" for s in plan.services())


def test_a_standby_without_a_virtual_ip_runs_no_keepalived() -> None:
    plan = build_plan(inventory(hosts=HOSTS, overrides={"router.standby": "s"}))
    assert [s.key for s in plan.standby] == ["router@s", "proxy@s"]
    assert plan.keepalived == () and plan.endpoint == "http://192.0.2.12:8000"


def test_keepalived_peers_priorities_and_the_proxy_check() -> None:
    inv = inventory(hosts=HOSTS, overrides={**PAIR, "router.vrrp_router_id": 9})
    plan = build_plan(inv)
    assert plan.endpoint == "http://192.0.2.100:8000"
    active, standby = plan.keepalived_confs["r"], plan.keepalived_confs["s"]
    assert "unicast_src_ip 192.0.2.12" in active and "192.0.2.13\n" in active
    assert "unicast_src_ip 192.0.2.13" in standby and "192.0.2.12\n" in standby
    assert f"priority {PRIORITY_ACTIVE}" in active and f"priority {PRIORITY_STANDBY}" in standby
    for conf in (active, standby):
        assert "virtual_router_id 9" in conf and "nopreempt" in conf
        assert "192.0.2.100/24 dev eth0" in conf
        assert "http://127.0.0.1:8000/health" in conf
    ka = {s.host: s for s in plan.keepalived}
    assert sorted(ka) == ["r", "s"]
    assert dict(ka["r"].labels)[LABEL_ROLE] == "keepalived"
    assert ka["r"].config_hash != ka["s"].config_hash  # the confs differ per host


def test_the_check_speaks_tls_when_the_proxy_does() -> None:
    tls = {"cert": "file:/c.pem", "key": "file:/k.pem"}
    inv = inventory(hosts=HOSTS, overrides={**PAIR, "router.tls": tls})
    conf = build_plan(inv).keepalived_confs["r"]
    assert "--no-check-certificate https://127.0.0.1:8000/health" in conf


def test_the_interface_from_the_inventory_then_preflight_else_unresolved() -> None:
    pair = {k: v for k, v in PAIR.items() if k != "router.vrrp_interface"}
    inv = inventory(hosts=HOSTS, overrides={**pair, "hosts.s.net_interface": "ens2"})
    plan = build_plan(inv, PlanFacts(tcp_ifaces={"r": ["ens1"]}))
    assert "dev ens1" in plan.keepalived_confs["r"] and "dev ens2" in plan.keepalived_confs["s"]
    assert plan.unresolved == ()
    dry = build_plan(inv)  # no facts: `up` refuses it (plan.unresolved), render shows it
    assert dry.unresolved_on == (
        (
            "r",
            "the interface for VRRP on r (router.vrrp_interface, hosts.r.net_interface, "
            "or the one preflight finds)",
        ),
    )


def test_the_standbys_containers_are_not_orphans() -> None:
    plan = build_plan(inventory(hosts=HOSTS, overrides=PAIR))
    observed = [
        Observed(
            host=s.host,
            id=s.key,
            name=s.container_name,
            labels={LABEL_DEPLOYMENT: "demo", LABEL_ROLE: s.role, LABEL_HOST: s.host},
            state="running",
        )
        for s in plan.ingress_services()
    ]
    assert orphans(plan, observed) == []
    one = build_plan(inventory(hosts=HOSTS))  # the keys removed: all of them go
    assert sorted(o.id for o in orphans(one, observed)) == sorted(o.id for o in observed)


@pytest.mark.parametrize("host", ["gpu-a", "gpu-b"])
def test_summary_names_the_virtual_ip_and_both_ingresses(host: str) -> None:
    inv = load_inventory(STANDBY)
    text = render_summary(build_plan(inv), inv.weights)
    assert "Endpoint: http://192.0.2.100:8000/v1" in text
    assert f"keepalived@{host}" in text
    assert "Standby ingress: router@gpu-b and proxy@gpu-b" in text


def test_the_change_plan_holds_the_ingress_steps() -> None:
    # `up --plan` shows them after the others' (deploy/planned_change.py), `up` applies them last
    plan = build_plan(inventory(hosts=HOSTS, overrides=PAIR))
    fresh = change_plan(plan, [], ChangeOptions(live=True))
    assert [(s.service.key, s.kind) for s in fresh.ingress] == [
        ("router@s", "create"),
        ("proxy@s", "create"),
        ("keepalived@r", "create"),
        ("keepalived@s", "create"),
    ]
    assert fresh.changes
    running = running_as_planned([*plan.services(), *plan.ingress_services()])
    again = change_plan(plan, running, ChangeOptions(live=True))
    assert {s.kind for s in again.ingress} == {"unchanged"}
    assert all(s.kind == "unchanged" for st in again.stages for s in st)
    without = change_plan(build_plan(inventory(hosts=HOSTS)), [], ChangeOptions(live=True))
    assert without.ingress == ()
