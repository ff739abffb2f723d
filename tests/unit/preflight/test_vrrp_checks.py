"""Preflight's VRRP checks (preflight/checks/vrrp.py) walked over real captures of its command
(tests/unit/fixtures/vrrp/README.md: what each holds), and which hosts are asked."""

from __future__ import annotations

import pytest

from pdboot.inventory.schema import Requirements
from pdboot.preflight.checks import HostContext, VrrpAsk, by_key, parse_sections
from pdboot.preflight.checks.facts import HostFacts
from pdboot.preflight.checks.vrrp import commands, evaluate_facts, parse_output
from pdboot.preflight.checks.vrrp import parse as vrrp_parse
from pdboot.preflight.contexts import contexts
from pdboot.preflight.findings import tcp_ifaces
from tests.unit.builders import inventory
from tests.unit.paths import FIXTURES

VRRP = FIXTURES / "vrrp"
VIP = "10.99.0.100/24"


def verdicts(capture: str, ask: VrrpAsk) -> dict[str, tuple[str, str]]:
    facts = parse_output((VRRP / f"preflight-{capture}.txt").read_text())
    return {r.id: (r.status, r.message) for r in evaluate_facts(ask, facts)}


def test_the_parser_reads_addresses_links_adverts_and_neighbours() -> None:
    f = parse_output((VRRP / "preflight-backup.txt").read_text())
    assert ("eth0", "10.99.0.12/24") in f.addresses
    assert f.links == ("lo", "eth0")
    assert f.adverts == (("10.99.0.11", 51),) and f.listened
    assert [n[0] for n in f.neighbours] == ["10.99.0.100", "10.99.0.11"]
    assert f.neighbours[0][1] == f.neighbours[1][1]  # the peer holds the address


def test_the_holder_passes_every_check() -> None:
    got = verdicts("holder", VrrpAsk(VIP, None, 51, "10.99.0.11", "10.99.0.12"))
    assert got["network.vrrp_interface"] == ("pass", "eth0 carries 10.99.0.11/24")
    assert got["network.vrrp_subnet"][0] == "pass"
    assert (
        got["network.vrrp_address"][0] == "pass" and "this host" in got["network.vrrp_address"][1]
    )
    assert got["network.vrrp_router_id"][0] == "pass"


def test_the_backup_hears_its_peer_which_is_not_a_conflict() -> None:
    got = verdicts("backup", VrrpAsk(VIP, None, 51, "10.99.0.12", "10.99.0.11"))
    assert got["network.vrrp_address"] == (
        "pass",
        "10.99.0.100 is held by the other ingress host (10.99.0.11)",
    )
    assert got["network.vrrp_router_id"][0] == "pass"


def test_another_instance_with_the_same_id_and_a_taken_address_fail() -> None:
    # the same capture, asked for a deployment whose peer is 10.99.0.13: 10.99.0.11's
    # adverts with id 51 and its MAC on the address are someone else's
    got = verdicts("backup", VrrpAsk(VIP, None, 51, "10.99.0.12", "10.99.0.13"))
    status, message = got["network.vrrp_router_id"]
    assert status == "fail" and "adverts from 10.99.0.11" in message
    assert got["network.vrrp_address"][0] == "fail"
    other_id = verdicts("backup", VrrpAsk(VIP, None, 52, "10.99.0.12", "10.99.0.13"))
    assert other_id["network.vrrp_router_id"][0] == "pass"


def test_a_free_address_passes() -> None:
    got = verdicts("free", VrrpAsk(VIP, None, 51, "10.99.0.13", "10.99.0.11"))
    assert got["network.vrrp_address"] == ("pass", "10.99.0.100 is free: nothing answered for it")


@pytest.mark.parametrize(
    ("ask", "status", "words"),
    [
        (VrrpAsk(VIP, "eth1", 51, "10.99.0.13", "10.99.0.11"), "fail", "no interface eth1"),
        (VrrpAsk(VIP, "eth0", 51, "10.99.0.13", "10.99.0.11"), "pass", "eth0 is here"),
        (VrrpAsk(VIP, None, 51, "10.99.0.50", "10.99.0.11"), "fail", "no interface carries"),
    ],
)
def test_the_interface(ask: VrrpAsk, status: str, words: str) -> None:
    got = verdicts("third-host", ask)["network.vrrp_interface"]
    assert got[0] == status and words in got[1]


def test_a_virtual_ip_off_the_interfaces_subnet_fails() -> None:
    got = verdicts("third-host", VrrpAsk("10.98.0.100/24", None, 51, "10.99.0.13", "10.99.0.11"))
    assert got["network.vrrp_subnet"][0] == "fail"


def test_only_the_ingress_hosts_are_asked() -> None:
    hosts = {"p1": "192.0.2.10", "d1": "192.0.2.11", "r": "192.0.2.12", "s": "192.0.2.13"}
    pair = {
        "router.standby": "s",
        "router.virtual_ip": "192.0.2.100/24",
        "router.vrrp_router_id": 7,
    }
    ctxs = contexts(inventory(hosts=hosts, overrides=pair))
    assert {n for n, c in ctxs.items() if c.vrrp is not None} == {"r", "s"}
    assert ctxs["r"].vrrp == VrrpAsk("192.0.2.100/24", None, 7, "192.0.2.12", "192.0.2.13")
    assert all(c.vrrp is None for c in contexts(inventory(hosts=hosts)).values())
    # keepalived binds no port: the standby's ports are the proxy's and the router's
    assert sorted(p for p, _w in ctxs["s"].ports) == [8000, 8081, 8082, 29000, 29001]


def test_the_command_is_one_line_and_its_section_parses_back() -> None:
    ctx = HostContext("r", ("router",), Requirements(), vrrp=VrrpAsk(VIP, None, 51, "a", "b"))
    (cmd,) = commands(ctx)
    assert "\n" not in cmd.line  # the batch's markers hold the command line
    capture = (VRRP / "preflight-backup.txt").read_text()
    text = f"### $ {cmd.line}\n{capture}### exit=0\n"
    section = by_key([cmd], parse_sections(text))["vrrp"]
    assert section.rc == 0 and parse_output(section.output).adverts == (("10.99.0.11", 51),)


def test_the_interface_found_reaches_the_plan_on_a_host_without_engines() -> None:
    ctx = HostContext(
        "r", ("router",), Requirements(), vrrp=VrrpAsk(VIP, None, 51, "10.99.0.12", "10.99.0.11")
    )
    capture = (VRRP / "preflight-backup.txt").read_text()
    (cmd,) = commands(ctx)
    sections = by_key([cmd], parse_sections(f"### $ {cmd.line}\n{capture}### exit=0\n"))
    facts = vrrp_parse(ctx, sections)
    assert facts is not None and facts.carrier == "eth0"
    assert tcp_ifaces(HostFacts(vrrp=facts)) == ["eth0"]  # PlanFacts.tcp_ifaces, then the conf
