"""Several engines per host: layout, rules, ports, plan, converge, preflight wiring, the
nearest-NIC choice per engine and its record. Plain values and real-format outputs only."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from pdboot.inventory.engines import ENGINE_PORT_STRIDE, EngineNic, engine_ports, tier_groups
from pdboot.inventory.load import InventoryError
from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.plan.converge import orphans, plan_up
from pdboot.plan.facts import PlanFacts
from pdboot.plan.model import LABEL_ENGINE
from pdboot.plan.render import render_all, render_summary
from pdboot.preflight.checks import parse_sections
from pdboot.preflight.checks.facts import HostFacts
from pdboot.preflight.checks.gpu import GpuFacts
from pdboot.preflight.checks.rdma import Port, RdmaFacts
from pdboot.preflight.checks.topo import engine_nics, evaluate, host_engines, parse_matrix
from pdboot.preflight.contexts import contexts
from pdboot.preflight.findings import (
    describe_nics,
    from_records,
    parse_engines,
    plan_from,
    records_to_ship,
)
from tests.unit.builders import inventory, rtx_gpus, running_as_planned
from tests.unit.paths import FIXTURES

DERIVED = FIXTURES / "derived"
TOPO8 = parse_sections((DERIVED / "topo-rtx6000x8.txt").read_text())["nvidia-smi topo -m"].output


def inv(**tiers: Any) -> Inventory:
    return inventory(
        {"gpu-a": "10.0.0.1", "gpu-b": "10.0.0.2"},
        ["gpu-a"],
        ["gpu-b"],
        "gpu-a",
        name="t",
        model="Qwen/Qwen3-32B",
        overrides={k.replace("__", "."): v for k, v in tiers.items()},
    )


def issues(**tiers: Any) -> list[str]:
    with pytest.raises(InventoryError) as e:
        inv(**tiers)
    return [str(i) for i in e.value.issues]


FOUR_FOUR = {
    "prefill": {"hosts": ["gpu-a", "gpu-b"], "engines_per_host": 4, "gpus": [0, 1, 2, 3]},
    "decode": {"hosts": ["gpu-a", "gpu-b"], "engines_per_host": 4, "gpus": [4, 5, 6, 7]},
}


# --------------------------------------------------------------------------- layout


def test_the_forms_of_a_tier() -> None:
    i = inv(prefill__engines_per_host=3, prefill__tensor_parallel_size=2)
    assert tier_groups(i.prefill) == [(0, 1), (2, 3), (4, 5)]
    i = inv(prefill__gpus=[[0, 1], [4, 5]], prefill__tensor_parallel_size=2)
    assert tier_groups(i.prefill) == [(0, 1), (4, 5)]
    i = inv(
        prefill__gpus=[2, 3, 6, 7], prefill__engines_per_host=2, prefill__tensor_parallel_size=2
    )
    assert tier_groups(i.prefill) == [(2, 3), (6, 7)]
    i = inv(prefill__engines_per_host="all", prefill__tensor_parallel_size=2)
    assert tier_groups(i.prefill, 4) == [(0, 1), (2, 3)]
    assert tier_groups(i.prefill, 5) == [(0, 1), (2, 3)]  # a GPU left over is left idle
    assert len(tier_groups(i.prefill)) == 4  # before preflight: 8 GPUs assumed
    # old forms: one engine
    assert tier_groups(inv().prefill) == ["all"]
    assert tier_groups(inv(prefill__gpus=[3]).prefill) == [(3,)]


def test_port_scheme() -> None:
    i = inv(prefill__engines_per_host=3)
    assert ENGINE_PORT_STRIDE == 10
    assert [engine_ports(i.prefill, n) for n in range(3)] == [
        (8200, 5600),
        (8210, 5610),
        (8220, 5620),
    ]


# --------------------------------------------------------------------------- rules


def test_groups_must_be_tp_sized_and_disjoint() -> None:
    got = issues(prefill__gpus=[[0, 1], [2]], prefill__tensor_parallel_size=2)
    assert any("prefill.gpus[1]" in m and "tensor_parallel_size is 2" in m for m in got)
    got = issues(prefill__gpus=[[0, 1], [1, 2]], prefill__tensor_parallel_size=2)
    assert any("distinct" in m for m in got)
    got = issues(prefill__gpus=[[0], [1]], prefill__engines_per_host=3)
    assert any("prefill.engines_per_host" in m and "2 GPU group(s)" in m for m in got)
    got = issues(prefill__gpus=[0, 1, 2], prefill__engines_per_host=2)
    assert any("list exactly 2" in m for m in got)
    got = issues(
        prefill__gpus=[0, 1, 2], prefill__engines_per_host="all", prefill__tensor_parallel_size=2
    )
    assert any("do not split" in m for m in got)
    assert any("greater than or equal to 1" in m for m in issues(prefill__engines_per_host=0))


def test_tiers_sharing_a_host_share_no_gpu() -> None:
    colo = {"hosts": ["gpu-a"], "engines_per_host": 2}
    got = issues(prefill=colo, decode={**colo, "gpus": [1, 2]})
    assert any("share host 'gpu-a' and GPU(s) [1]" in m for m in got)
    got = issues(
        prefill={"hosts": ["gpu-a"], "engines_per_host": "all"},
        decode={"hosts": ["gpu-a"], "gpus": [7]},
    )
    assert any("instead of 'all'" in m for m in got)
    inv(**FOUR_FOUR)  # disjoint pools: fine


def test_ports_clash_across_tiers_at_load_time() -> None:
    # decode's base 8210 is prefill's second engine's port
    got = issues(
        prefill={"hosts": ["gpu-a"], "engines_per_host": 2, "gpus": [0, 1]},
        decode={"hosts": ["gpu-a"], "gpus": [2], "port": 8210},
    )
    assert any("port 8210 on host 'gpu-a' is already used by prefill-1 HTTP" in m for m in got)
    got = issues(prefill__engines_per_host=3, router={"host": "gpu-a", "port": 8220})
    assert any("router.port" in m and "prefill-2 HTTP" in m for m in got)
    got = issues(prefill__engines_per_host=2, prefill__port=65530)
    assert any("past 65535" in m for m in got)


def test_old_inventories_keep_their_messages() -> None:
    got = issues(prefill__gpus=[0], prefill__tensor_parallel_size=2)
    assert any("list exactly one GPU per rank" in m for m in got)


# --------------------------------------------------------------------------- plan


def test_plan_names_ports_labels_and_router_workers() -> None:
    plan = build_plan(inv(**FOUR_FOUR))
    keys = [s.key for s in plan.services()]
    assert keys[:4] == ["decode@gpu-a", "decode-1@gpu-a", "decode-2@gpu-a", "decode-3@gpu-a"]
    assert len(keys) == 18 and keys[-2:] == ["router@gpu-a", "proxy@gpu-a"]
    by = {s.key: s for s in plan.services()}
    p2 = by["prefill-2@gpu-b"]
    assert (p2.port, p2.side_channel_port, p2.gpus) == (8220, 5620, (2,))
    assert p2.container_name == "pdboot-t-prefill-2"
    assert dict(p2.environment)["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5620"
    assert p2.command[p2.command.index("--port") + 1] == "8220"
    assert dict(p2.labels)[LABEL_ENGINE] == "2"
    assert LABEL_ENGINE not in dict(by["decode@gpu-a"].labels)  # engine 0: none
    cmd = plan.router.command
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--decode"] == [
        f"http://10.0.0.{h}:{8201 + 10 * n}" for h in (1, 2) for n in range(4)
    ]
    assert cmd.count("--prefill") == 8
    assert len({s.config_hash for s in plan.services()}) == 18
    # compose service names are unique per host
    for hp in plan.hosts.values():
        assert len({s.name for s in hp.services}) == len(hp.services)


def test_a_single_engine_tier_has_no_engine_label() -> None:
    plan = build_plan(inv())
    assert all(LABEL_ENGINE not in dict(s.labels) for s in plan.services())
    assert [s.key for s in plan.services()] == [
        "decode@gpu-b",
        "prefill@gpu-a",
        "router@gpu-a",
        "proxy@gpu-a",
    ]


def test_render_shows_the_engines_and_what_needs_preflight() -> None:
    plan = build_plan(inv(**FOUR_FOUR))
    text = render_all(plan)["gpu-b"]
    assert "#   prefill-3  GPUs 3        :8230  side channel :5630" in text
    assert "needs preflight's facts" in text
    assert yaml.safe_load(text)["services"]["decode-3"]["deploy"]["resources"]["reservations"][
        "devices"
    ][0]["device_ids"] == ["7"]
    auto = build_plan(inv(prefill__engines_per_host="all"))
    assert auto.unresolved and "gpu-a" in auto.unresolved[0]
    assert "Needs preflight's facts: prefill on gpu-a" in render_summary(auto)
    counted = build_plan(inv(prefill__engines_per_host="all"), PlanFacts(gpu_counts={"gpu-a": 4}))
    assert counted.unresolved == () and len(counted.prefill_engines) == 4


def test_nearest_nic_sets_each_engines_ucx_devices_and_explicit_wins() -> None:
    nics = {"gpu-b": {"decode-1": EngineNic(("mlx5_0:1",), "PXB", (1,))}}
    i = inv(decode__engines_per_host=2)
    plan = build_plan(
        i,
        PlanFacts(
            rdma_present={"gpu-a": True, "gpu-b": True},
            rdma_ports={"gpu-b": ["mlx5_0:1", "mlx5_2:1"]},
            engine_nics=nics,
        ),
    )
    by = {s.key: dict(s.environment) for s in plan.services()}
    assert by["decode-1@gpu-b"]["UCX_NET_DEVICES"] == "mlx5_0:1"
    assert by["decode@gpu-b"]["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_2:1"  # no choice: all
    assert describe_nics(plan)[1] == "nic: decode-1@gpu-b -> mlx5_0:1 (PXB, nearest GPUs 1)"
    doc = yaml.safe_load(yaml.safe_dump({"kv_transfer": {"ucx": {"net_devices": "mlx5_9:1"}}}))
    explicit = i.model_copy(
        update={"kv_transfer": i.kv_transfer.model_validate(doc["kv_transfer"])}
    )
    plan = build_plan(explicit, PlanFacts(rdma_present={"gpu-b": True}, engine_nics=nics))
    assert {dict(s.environment).get("UCX_NET_DEVICES") for s in plan.decode_engines} == {"mlx5_9:1"}


# --------------------------------------------------------------------------- converge


def test_changing_one_group_recreates_only_that_engine_and_the_router() -> None:
    before = build_plan(inv(prefill__gpus=[[0], [1], [2]]))
    running = running_as_planned(before.services())
    after = build_plan(inv(prefill__gpus=[[0], [5], [2]]))
    steps = [s for stage in plan_up(after, running) for s in stage]
    changed = {s.service.key: s.kind for s in steps if s.kind != "unchanged"}
    assert changed == {"prefill-1@gpu-a": "recreate", "router@gpu-a": "recreate"}
    assert orphans(after, running) == []


def test_fewer_engines_leave_orphans_by_engine() -> None:
    running = running_as_planned(build_plan(inv(prefill__engines_per_host=3)).services())
    after = build_plan(inv(prefill__engines_per_host=2))
    assert [o.key for o in orphans(after, running)] == ["prefill-2@gpu-a"]
    steps = [s for stage in plan_up(after, running, live=True) for s in stage]
    # live workers: the router's hash leaves its worker lists out; the orphan is deregistered
    assert {s.service.key for s in steps if s.kind != "unchanged"} == set()
    static = running_as_planned(
        build_plan(inv(prefill__engines_per_host=3, router__live_workers=False)).services()
    )
    after = build_plan(inv(prefill__engines_per_host=2, router__live_workers=False))
    steps = [s for stage in plan_up(after, static) for s in stage]
    assert {s.service.key for s in steps if s.kind != "unchanged"} == {"router@gpu-a"}


def test_adding_engines_keeps_engine_zero() -> None:
    running = running_as_planned(build_plan(inv(decode__gpus=[0])).services())
    after = build_plan(inv(decode__gpus=[0, 1], decode__engines_per_host=2))
    kinds = {s.service.key: s.kind for st in plan_up(after, running) for s in st}
    assert kinds["decode@gpu-b"] == "unchanged" and kinds["decode-1@gpu-b"] == "create"


# --------------------------------------------------------------------------- preflight


def test_preflight_checks_every_engines_ports_and_probes_them() -> None:
    ctxs = contexts(inv(**FOUR_FOUR))
    ports = dict(ctxs["gpu-b"].ports)
    assert ports[8230] == "prefill-3 HTTP" and ports[5631] == "decode-3 NIXL side channel"
    assert ports[9231] == "decode-3 NIXL telemetry"  # HTTP + 1000, each engine its own
    assert len(ctxs["gpu-b"].ports) == 24
    side = [p for p in ctxs["gpu-b"].probes if p.check_id == "network.side_channel"]
    assert sorted((p.address, p.port) for p in side) == sorted(
        (f"10.0.0.{h}", 5600 + 10 * n) for h in (1, 2) for n in range(4)
    )
    ingress = [p for p in ctxs["gpu-a"].probes if p.check_id == "network.ingress"]
    assert len(ingress) == 16
    needs = ctxs["gpu-a"].gpu_needs
    assert [(n.engine, n.gpus) for n in needs][:2] == [("prefill", (0,)), ("prefill-1", (1,))]


def _facts(n_gpus: int = 8, down: tuple[str, ...] = ("mlx5_3",)) -> HostFacts:
    gpus = rtx_gpus(n_gpus)
    ports = [
        Port(
            f"mlx5_{i}",
            1,
            "DOWN" if f"mlx5_{i}" in down else "ACTIVE",
            "InfiniBand",
            "400 Gb/sec (4X NDR)",
        )
        for i in range(4)
    ]
    gpu = GpuFacts(parse_sections("### $ x\n### exit=0\n")["x"], gpus)
    return HostFacts(gpu=gpu, rdma=RdmaFacts(["uverbs0"], ports, []), topo=parse_matrix(TOPO8))


def test_each_engine_gets_its_nearest_active_port() -> None:
    ctx = contexts(inv(**FOUR_FOUR))["gpu-a"]
    nics = engine_nics(ctx, _facts())
    assert {n: (e.ports, e.link) for n, e in nics.items()} == {
        "prefill": (("mlx5_0:1",), "PIX"),
        "prefill-1": (("mlx5_0:1",), "PXB"),
        "prefill-2": (("mlx5_1:1",), "PIX"),
        "prefill-3": (("mlx5_1:1",), "PXB"),
        "decode": (("mlx5_2:1",), "PIX"),
        "decode-1": (("mlx5_2:1",), "PXB"),
        "decode-2": (("mlx5_2:1",), "NODE"),  # mlx5_3 beside it is down
        "decode-3": (("mlx5_2:1",), "NODE"),
    }
    res = [r for r in evaluate(ctx, _facts()) if r.id == "rdma.nic_affinity"]
    assert len(res) == 8 and all(r.status == "pass" for r in res)
    assert res[0].message == "prefill@gpu-a: GPUs 0 -> mlx5_0:1 (PIX)"


def test_only_a_far_port_is_a_warning_and_explicit_devices_pass() -> None:
    ctx = contexts(inv(**FOUR_FOUR))["gpu-a"]
    far = [
        r for r in evaluate(ctx, _facts(down=("mlx5_2", "mlx5_3"))) if r.id == "rdma.nic_affinity"
    ]
    warn = [r for r in far if r.status == "warn"]
    assert len(warn) == 4 and "across the CPU socket" in warn[0].message
    assert "decode@gpu-a: GPUs 4 -> mlx5_0:1,mlx5_1:1 (SYS)" in warn[0].message
    ex = ctx.__class__(**{**ctx.__dict__, "ucx_net_devices": "mlx5_0:1"})
    got = [r for r in evaluate(ex, _facts()) if r.id == "rdma.nic_affinity"]
    assert [r.status for r in got] == ["pass"] and "explicit" in got[0].message
    assert engine_nics(ex, _facts()) == {}


def test_engines_per_host_all_follows_the_gpus_found() -> None:
    i = inv(prefill__engines_per_host="all", prefill__tensor_parallel_size=2)
    ctx = contexts(i)["gpu-a"]
    assert [e.gpus for e in host_engines(ctx, _facts(4))] == [(0, 1), (2, 3)]
    assert [n.gpus for n in ctx.gpu_needs] == ["all"]


def test_gpu_topology_check() -> None:
    ctx = contexts(inv())["gpu-a"]
    res = evaluate(ctx, _facts())
    assert res[0].id == "gpu.topology" and res[0].status == "pass"
    assert "8 GPU(s), mlx5_0, mlx5_1, mlx5_2, mlx5_3" in res[0].message
    bad = evaluate(ctx, HostFacts(topo=parse_matrix("command not found")))
    assert bad[0].status == "warn" and "no topology matrix" in bad[0].message


# --------------------------------------------------------------------------- the record


def test_the_record_keeps_each_engines_nic_and_the_gpu_count() -> None:
    i = inv(prefill__engines_per_host="all", decode__engines_per_host=2)
    nics = {"gpu-b": {"decode-1": EngineNic(("mlx5_1:1",), "PIX", (1,))}}
    f = PlanFacts(
        rdma_present={"gpu-a": True, "gpu-b": True},
        rdma_ports={"gpu-b": ["mlx5_1:1"]},
        tcp_ifaces={"gpu-b": ["ens1f0"]},
        engine_nics=nics,
        gpu_counts={"gpu-a": 4},
        source="preflight",
    )
    deployed = plan_from(i, f)
    back = from_records(records_to_ship(f))
    assert back.tcp_ifaces == {"gpu-b": ["ens1f0"]}
    again = plan_from(i, back)
    assert [(s.key, s.config_hash) for s in again.services()] == [
        (s.key, s.config_hash) for s in deployed.services()
    ]
    assert len(again.stages[1]) == 4 and again.unresolved == ()
    assert parse_engines('{"rdma": true, "engines": {"x": {"ports": [1]}}, "gpu_count": -1}') == (
        {},
        None,
    )


# --------------------------------------------------------------------------- model


def test_model_fits_and_kv_estimate_per_engine() -> None:
    from pdboot.preflight.checks import model

    ctx = contexts(inv(**FOUR_FOUR))["gpu-a"]
    mf = model.ModelFacts("/m", 64, 8, 128, 2, 32_000_000_000, 64 << 30)
    sec = parse_sections("### $ x\n### exit=0\n")["x"]
    facts = HostFacts(**{**_facts().__dict__, "model": model.ModelAreaFacts(sec, mf)})
    res = model.evaluate(ctx, facts)
    weights = [r for r in res if r.id == "model.weights"]
    assert len(weights) == 8 and weights[1].message.startswith("prefill-1: weights")
    kv = [r.message for r in res if r.id == "model.kv_transfer"]
    assert len(kv) == 8
    assert kv[0].startswith("prefill@gpu-a via mlx5_0:1, shared by 2 engines: KV cache")
    assert "at 400 Gb/s" in kv[0]


def test_a_recorded_nic_for_other_gpus_is_not_used() -> None:
    nics = {"gpu-b": {"decode-1": EngineNic(("mlx5_0:1",), "PXB", (1,))}}
    moved = inv(decode__gpus=[[0], [6]])
    plan = build_plan(
        moved,
        PlanFacts(
            rdma_present={"gpu-b": True},
            rdma_ports={"gpu-b": ["mlx5_0:1", "mlx5_2:1"]},
            engine_nics=nics,
        ),
    )
    env = dict(plan.stages[0][1].environment)
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_2:1"


# --------------------------------------------------------------------------- status / logs


def test_selectors_name_engines() -> None:
    from pdboot.deploy.status import SelectorError, select_service

    i = inv(**FOUR_FOUR)
    assert select_service(i, "prefill-2@gpu-b").key == "prefill-2@gpu-b"
    assert select_service(i, "router").key == "router@gpu-a"
    with pytest.raises(SelectorError, match="pick one: decode-3@gpu-a, decode-3@gpu-b"):
        select_service(i, "decode-3")
    with pytest.raises(SelectorError, match="no prefill-7 on host 'gpu-a'"):
        select_service(i, "prefill-7@gpu-a")
    with pytest.raises(SelectorError, match="decode runs 2 times"):
        select_service(i, "decode")
    assert select_service(inv(), "decode").key == "decode@gpu-b"


def test_status_rows_per_engine_with_their_nic() -> None:
    from datetime import datetime, timezone

    from pdboot.deploy.status import rows_for
    from pdboot.transport.http import HttpAnswer
    from pdboot.views.status import nic_lines

    nics = {"gpu-b": {"decode-1": EngineNic(("mlx5_0:1",), "PXB", (1,))}}
    plan = build_plan(
        inv(decode__engines_per_host=2), PlanFacts(rdma_present={"gpu-b": True}, engine_nics=nics)
    )
    running = running_as_planned(plan.services())
    rows = rows_for(
        plan, running, set(), datetime.now(timezone.utc), lambda *_a, **_k: HttpAnswer(200, "")
    )
    assert [r.service for r in rows] == [
        "decode@gpu-b",
        "decode-1@gpu-b",
        "prefill@gpu-a",
        "router@gpu-a",
        "proxy@gpu-a",
    ]
    assert all(r.healthy and r.matches_inventory for r in rows)
    assert "  decode-1@gpu-b  mlx5_0:1 (PXB, nearest GPUs 1)" in nic_lines(rows)
    # a leftover engine (a tier that shrank) shows under its own name
    more = running_as_planned(
        build_plan(
            inv(decode__engines_per_host=3), PlanFacts(rdma_present={"gpu-b": True})
        ).services()
    )
    extra = [o for o in more if o.service_name == "decode-2"]
    rows = rows_for(
        plan,
        running + extra,
        set(),
        datetime.now(timezone.utc),
        lambda *_a, **_k: HttpAnswer(200, ""),
    )
    assert rows[-1].service == "decode-2@gpu-b" and not rows[-1].planned
