"""`kv_transfer.rdma: auto` from preflight's findings to the plan, and the record that lets
`status` / `up --skip-preflight` rebuild the same config hashes (pure: captured preflight
output, plain values)."""

from __future__ import annotations

from pdboot.inventory.load import parse_inventory
from pdboot.inventory.schema import Inventory, Requirements
from pdboot.plan.build import build_plan
from pdboot.plan.facts import PlanFacts
from pdboot.plan.model import Plan, Service
from pdboot.preflight.checks import HostContext, Section, parse_sections
from pdboot.preflight.findings import (
    active_ports,
    describe,
    from_preflight,
    from_records,
    parse_record,
    record_text,
    records_to_ship,
)
from pdboot.preflight.run import DOMAINS, HostReport, PreflightResult, evaluate_host, rdma_usable
from tests.unit.paths import FIXTURES, INVENTORIES

FIX = FIXTURES / "derived"


def svc_at(plan: Plan, key: str) -> Service:
    """The planned service ``role@host``."""
    return next(s for s in plan.services() if s.key == key)


def undeclared() -> Inventory:
    """1P1D, rdma auto, no host declares rdma_devices."""
    text = (INVENTORIES / "1p1d.yaml").read_text().replace("    rdma_devices: [mlx5_0]\n", "")
    inv = parse_inventory(text)
    assert inv.kv_transfer.rdma == "auto" and not any(h.rdma_devices for h in inv.hosts.values())
    return inv


def host_output(c: HostContext, variant: str | None) -> str:
    """What a host prints for the batch: the healthy RTX PRO 6000 capture, overlaid."""
    merged: dict[str, Section] = parse_sections((FIX / "rtx6000x2-r580-healthy.txt").read_text())
    if variant:
        merged.update(parse_sections((FIX / variant).read_text()))
    out = []
    for _, d in DOMAINS:
        for cmd in d.commands(c):
            s = merged.get(cmd.line) or merged.get("@" + cmd.key)
            if s is not None:
                out.append(f"### $ {cmd.line}\n{s.output.rstrip(chr(10))}\n### exit={s.rc}")
    return "\n".join(out) + "\n"


def report(name: str, variant: str | None) -> HostReport:
    c = HostContext(name=name, roles=("decode",), req=Requirements())
    checks, facts = evaluate_host(c, host_output(c, variant))
    return HostReport(name, True, checks, facts, rdma_present=rdma_usable(c, facts))


def preflight_result() -> PreflightResult:
    # gpu-a: ConnectX-7 port ACTIVE; gpu-b: no RDMA NIC at all
    return PreflightResult(
        {"gpu-a": report("gpu-a", None), "gpu-b": report("gpu-b", "no-rdma.txt")}
    )


def engines(plan: Plan) -> dict[str, tuple[bool, str | None]]:
    return {s.key: (s.rdma, dict(s.environment).get("UCX_NET_DEVICES")) for s in plan.engines}


def test_preflight_findings_turn_rdma_on_only_where_a_port_is_active() -> None:
    inv = undeclared()
    assert engines(build_plan(inv)) == {  # dry run: only the declared devices count
        "decode@gpu-b": (False, None),
        "prefill@gpu-a": (False, None),
    }
    f = from_preflight(preflight_result())
    assert f.rdma_present == {"gpu-a": True, "gpu-b": False}
    assert f.rdma_ports == {"gpu-a": ["mlx5_0:1"]}
    plan = build_plan(inv, f)
    assert engines(plan) == {"decode@gpu-b": (False, None), "prefill@gpu-a": (True, "mlx5_0:1")}
    lines = describe(inv, plan, f, skipped=False)
    assert lines == [
        "rdma (auto): off for gpu-b (preflight found no RDMA device with an ACTIVE port)",
        "rdma (auto): on for gpu-a (preflight found mlx5_0:1 ACTIVE)",
    ]


def test_a_down_port_is_not_usable_rdma() -> None:
    rep = report("gpu-a", "ib-port-down.txt")
    f = from_preflight(PreflightResult({"gpu-a": rep}))
    assert f.rdma_present == {"gpu-a": False} and f.rdma_ports == {}
    assert active_ports(rep.facts) == []


def test_declared_devices_name_the_ucx_devices_even_when_preflight_found_others() -> None:
    inv = parse_inventory((INVENTORIES / "1p1d.yaml").read_text())  # declares mlx5_0
    plan = build_plan(
        inv,
        PlanFacts(rdma_present={"gpu-a": True, "gpu-b": True}, rdma_ports={"gpu-a": ["mlx5_3:1"]}),
    )
    assert engines(plan)["prefill@gpu-a"] == (True, "mlx5_0:1")


def test_the_record_rebuilds_the_same_config_hashes_without_preflight() -> None:
    inv = undeclared()
    f = from_preflight(preflight_result())
    deployed = build_plan(inv, f)
    shipped = records_to_ship(f)
    assert set(shipped) == {"gpu-a", "gpu-b"}
    # what status / up --skip-preflight read back from the hosts (gpu-c never preflighted)
    back = from_records({**shipped, "gpu-c": None})
    assert back.source == "recorded" and back.rdma_present == f.rdma_present
    again = build_plan(inv, back)
    assert [s.config_hash for s in again.services()] == [s.config_hash for s in deployed.services()]
    # ... whereas the declared-devices fallback would have reported prefill@gpu-a changed
    naive = {s.key: s.config_hash for s in build_plan(inv).services()}
    assert naive["prefill@gpu-a"] != svc_at(deployed, "prefill@gpu-a").config_hash
    assert describe(inv, again, back, skipped=True)[1] == (
        "rdma (auto): on for gpu-a (as the last preflight found, recorded on the host)"
    )


def test_only_a_preflight_of_this_run_is_recorded() -> None:
    assert records_to_ship(None) == {}
    assert records_to_ship(PlanFacts(rdma_present={"gpu-a": True}, source="recorded")) == {}


def test_no_finding_falls_back_to_the_declared_devices_and_says_so() -> None:
    inv = undeclared()
    plan = build_plan(inv)
    assert describe(inv, plan, from_records({}), skipped=True)[0] == (
        "rdma (auto): off for gpu-b (inventory declares no rdma_devices; "
        "--skip-preflight and no earlier preflight finding)"
    )
    on = parse_inventory((INVENTORIES / "1p1d.yaml").read_text() + 'kv_transfer: {rdma: "on"}\n')
    assert describe(on, build_plan(on), None, skipped=True) == []


def test_records_that_are_not_ours_are_ignored() -> None:
    assert parse_record(record_text(True, ["mlx5_0:1"])) == (True, ["mlx5_0:1"])
    assert parse_record("") is None
    assert parse_record('{"rdma": "yes"}') is None
    assert parse_record("[1, 2]") is None
    assert parse_record('{"rdma": false, "ports": [3]}') == (False, [])
    assert from_records({"gpu-a": "garbage", "gpu-b": record_text(False, [])}).rdma_present == {
        "gpu-b": False
    }
