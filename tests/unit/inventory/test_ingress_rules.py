"""The standby ingress keys (router.standby, router.virtual_ip and keepalived's settings): what
loads, and each refusal with its ``file:line: key: message``."""

from __future__ import annotations

import re
from typing import Any

import pytest

from pdboot.inventory.ingress_rules import ingress_hosts, vrrp_router_id
from pdboot.inventory.ingress_schema import DEFAULT_KEEPALIVED_IMAGE, default_router_id
from pdboot.inventory.load import InventoryError
from pdboot.inventory.rules import deployment_hosts
from tests.unit.builders import inventory

HOSTS = {"p1": "192.0.2.10", "d1": "192.0.2.11", "r": "192.0.2.12", "s": "192.0.2.13"}
PAIR = {"router.standby": "s", "router.virtual_ip": "192.0.2.100/24"}
LOCATED = re.compile(r"^inventory\.yaml:\d+: router\.")


def refused(overrides: dict[str, Any], hosts: dict[str, str] = HOSTS) -> list[str]:
    with pytest.raises(InventoryError) as exc:
        inventory(hosts=hosts, overrides=overrides)
    lines = [str(i) for i in exc.value.issues]
    for line in lines:
        assert re.match(r"^inventory\.yaml:\d+: ", line), line
    return lines


def test_without_the_keys_one_ingress_and_the_same_hosts() -> None:
    inv = inventory(hosts=HOSTS)
    assert inv.router.standby is None and inv.router.virtual_ip is None
    assert ingress_hosts(inv) == ["r"]
    assert "s" not in deployment_hosts(inv)  # a host no tier names stays out


def test_a_standby_with_a_virtual_ip_loads() -> None:
    inv = inventory(hosts=HOSTS, overrides=PAIR)
    assert ingress_hosts(inv) == ["r", "s"]
    assert deployment_hosts(inv)[-1] == "s"
    assert inv.router.keepalived_image == DEFAULT_KEEPALIVED_IMAGE
    assert vrrp_router_id(inv) == default_router_id("demo")


def test_a_standby_alone_loads_for_an_outside_balancer() -> None:
    inv = inventory(hosts=HOSTS, overrides={"router.standby": "s"})
    assert ingress_hosts(inv) == ["r", "s"]


def test_the_router_id_is_the_inventorys_else_stable_per_name() -> None:
    inv = inventory(hosts=HOSTS, overrides={**PAIR, "router.vrrp_router_id": 7})
    assert vrrp_router_id(inv) == 7
    assert default_router_id("demo") == default_router_id("demo")
    ids = {default_router_id(f"deployment-{i}") for i in range(64)}
    assert all(1 <= i <= 255 for i in ids) and len(ids) > 50  # spread, not one constant


def test_the_virtual_ip_is_normalised() -> None:
    inv = inventory(hosts=HOSTS, overrides={**PAIR, "router.virtual_ip": " 192.0.2.100/24 "})
    assert inv.router.virtual_ip == "192.0.2.100/24"


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"router.standby": "x"}, "router.standby: host 'x' is not defined under hosts"),
        ({"router.standby": "r"}, "must be another host than router.host"),
        ({"router.virtual_ip": "192.0.2.100/24"}, "set router.standby too"),
        ({**PAIR, "router.virtual_ip": "192.0.2.100"}, "has no prefix length"),
        ({**PAIR, "router.virtual_ip": "192.0.2.300/24"}, "is not an IPv4 ADDRESS/PREFIX"),
        ({**PAIR, "router.virtual_ip": "2001:db8::1/64"}, "is IPv6"),
        ({**PAIR, "router.virtual_ip": "127.0.0.5/8"}, "cannot be a shared endpoint"),
        ({**PAIR, "router.virtual_ip": "192.0.2.255/24"}, "network or broadcast address"),
        ({**PAIR, "router.virtual_ip": "192.0.2.13/24"}, "is the address of host 's'"),
        ({**PAIR, "router.virtual_ip": "198.51.100.7/24"}, "is not on the subnet of"),
        ({**PAIR, "router.vrrp_router_id": 256}, "router.vrrp_router_id"),
        ({**PAIR, "router.vrrp_router_id": 0}, "router.vrrp_router_id"),
        ({**PAIR, "router.vrrp_interface": "eth0;reboot"}, "not a valid interface name"),
        ({**PAIR, "router.keepalived_image": "img name"}, "router.keepalived_image"),
        ({"router.vrrp_router_id": 9}, "set router.virtual_ip too"),
        ({"router.standby": "s", "router.vrrp_interface": "eth0"}, "set router.virtual_ip too"),
    ],
)
def test_refused_with_file_line_and_key(overrides: dict[str, Any], words: str) -> None:
    lines = refused(overrides)
    assert any(words in line and LOCATED.match(line) for line in lines), lines


def test_a_host_name_cannot_be_a_unicast_peer() -> None:
    hosts = {**HOSTS, "s": "ingress-b.example"}
    lines = refused(PAIR, hosts)
    assert any("hosts.s.address" in line and "IPv4 address" in line for line in lines), lines


def test_the_standby_claims_the_routers_ports_on_its_host() -> None:
    # the standby runs a proxy on router.port: an engine there on the same port is refused
    lines = refused({**PAIR, "router.standby": "p1", "prefill.port": 8000})
    assert any("router.port" in line and "prefill" in line for line in lines), lines
    inventory(hosts=HOSTS, overrides={**PAIR, "router.standby": "p1"})  # default ports differ
