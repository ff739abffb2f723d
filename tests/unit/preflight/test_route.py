"""network.ucx_iface on real `ip -o route get` text (fixtures/route/README.md), and the
interface reaching UCX_NET_DEVICES through the plan."""

from __future__ import annotations

from pdboot.inventory.load import load_inventory
from pdboot.inventory.schema import Requirements
from pdboot.plan.build import build_plan
from pdboot.plan.facts import PlanFacts
from pdboot.preflight import findings
from pdboot.preflight.checks import HostContext, Section, route
from pdboot.preflight.checks.facts import HostFacts
from pdboot.preflight.checks.rdma import Port, RdmaFacts
from pdboot.preflight.checks.route import RouteFacts
from tests.unit.paths import FIXTURES, INVENTORIES

FIX = FIXTURES / "route"
INV = INVENTORIES / "1p1d.yaml"


def text(name: str) -> str:
    return (FIX / name).read_text()


def facts(out: str) -> RouteFacts:
    return RouteFacts(tuple(route.parse_text(out)))


def test_the_peer_over_eth0_passes_and_names_the_interface() -> None:
    f = facts(text("testbed-ok.txt"))
    assert [(r.peer, r.dev, r.local) for r in f.routes] == [
        ("10.77.2.11", "eth0", False),
        ("10.77.2.10", "lo", True),
    ]
    r = route.verdict(f, None)
    assert r is not None and r.status == "pass"
    assert r.message.startswith("UCX_NET_DEVICES=eth0 ")
    assert f.ifaces() == ["eth0"]


def test_a_peer_reached_through_docker0_fails_with_a_fix() -> None:
    f = facts(text("testbed-docker0.txt"))
    r = route.verdict(f, None)
    assert r is not None and r.status == "fail"
    assert "10.77.3.11 is reached through docker0" in r.message
    assert "kv_transfer.ucx.net_devices" in r.fix
    assert f.ifaces() == []


def test_no_route_fails_and_a_colocated_peer_is_not_judged() -> None:
    unreachable = "peer=10.9.9.9\nRTNETLINK answers: Network is unreachable\n"
    r = route.verdict(facts(unreachable), None)
    assert r is not None and r.status == "fail" and "not at all" in r.message
    local = "peer=10.77.2.10\nlocal 10.77.2.10 dev lo src 10.77.2.10 uid 0 \\    cache <local> \n"
    assert route.verdict(facts(local), None) is None


def test_explicit_net_devices_win() -> None:
    r = route.verdict(facts(text("testbed-ok.txt")), "ens1f0")
    assert r is not None and r.status == "pass" and "ens1f0 is used as set" in r.message


def test_judged_only_where_kv_goes_over_tcp() -> None:
    ctx = HostContext("a", ("decode",), Requirements(), peers=("10.77.2.11",))
    assert route.commands(ctx)[0].line.count("ip -o route get") == 1
    found = route.parse(ctx, {"route": Section(text("testbed-ok.txt"), 0)})
    assert found is not None and route.parse(ctx, {}) is None
    none = RdmaFacts([], [], [])
    usable = RdmaFacts(["uverbs0"], [Port("mlx5_0", 1, "ACTIVE", "InfiniBand")], [])
    ids = [c.id for c in route.evaluate(ctx, HostFacts(rdma=none, route=found))]
    assert ids == [route.CHECK_ID]
    # RDMA carries the KV
    assert route.evaluate(ctx, HostFacts(rdma=usable, route=found)) == []
    on = HostContext("a", ("decode",), Requirements(), rdma_mode="on", peers=("x",))
    assert route.commands(on) == []


def test_the_found_interface_becomes_ucx_net_devices_unless_set_or_rdma() -> None:
    inv = load_inventory(INV)
    off = {"gpu-a": False, "gpu-b": False}
    env = dict(
        build_plan(inv, PlanFacts(rdma_present=off, rdma_ports={}, tcp_ifaces={"gpu-b": ["eth0"]}))
        .hosts["gpu-b"]
        .services[0]
        .environment
    )
    assert env["UCX_NET_DEVICES"] == "eth0"
    on = {"gpu-a": True, "gpu-b": True}
    env = dict(
        build_plan(inv, PlanFacts(rdma_present=on, rdma_ports={}, tcp_ifaces={"gpu-b": ["eth0"]}))
        .hosts["gpu-b"]
        .services[0]
        .environment
    )
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1"  # the declared HCA, not the TCP interface


def test_findings_carry_the_interface_and_survive_the_record() -> None:
    class Rep:
        rdma_present = False
        facts = HostFacts(route=facts(text("testbed-ok.txt")))
        nics: dict[str, object] = {}  # no engine NIC chosen (RDMA off)

    class Res:
        hosts = {"gpu-b": Rep()}

    f = findings.from_preflight(Res())
    assert f.tcp_ifaces == {"gpu-b": ["eth0"]}
    shipped = findings.records_to_ship(f)
    back = findings.from_records(shipped)
    assert back.tcp_ifaces == {"gpu-b": ["eth0"]} and back.rdma_present == {"gpu-b": False}
    # a record without interfaces reads as before
    plain = findings.record_text(True, ["mlx5_0:1"])
    assert plain == '{"ports": ["mlx5_0:1"], "rdma": true}\n'
