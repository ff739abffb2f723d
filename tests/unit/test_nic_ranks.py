"""One NIC per tensor-parallel rank (pdboot/preflight/checks/nic_ranks.py, plan/vllm_args.py):
the per-GPU nearest NIC read from REAL `nvidia-smi topo -m` captures (fixtures/topo/, copies of
../shared/fixtures/topo), paired by PCI address as vLLM's vllm_net_devices.py reads them. The
captures carry no PCI addresses; those come from the second command's output (nvidia-smi's
`pci.bus_id` form and sysfs' resolved `device` links), given here as plain values."""

from __future__ import annotations

from pathlib import Path

from pdboot.inventory.engines import EngineNic
from pdboot.plan.build import build_plan
from pdboot.plan.facts import PlanFacts
from pdboot.preflight.checks import Section
from pdboot.preflight.checks.facts import HostFacts
from pdboot.preflight.checks.nic_ranks import pairs, parse
from pdboot.preflight.checks.rdma import Port, RdmaFacts
from pdboot.preflight.checks.topo import choose, engine_nics, facts
from pdboot.preflight.contexts import contexts
from pdboot.preflight.findings import parse_engines, record_text
from tests.unit.test_engines import _facts, inv

TOPO = Path(__file__).parent / "fixtures" / "topo"
B300 = (TOPO / "b300_cx8_8gpu_nvlink_8bondnic_deepep590.txt").read_text()
A800 = (TOPO / "a800_8gpu_nvlink_8bondnic_tabs.txt").read_text()
# nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader (its 8-digit domain), then the
# RDMA devices' resolved `device` links (sysfs' 4-digit domain)
GPU_BUS = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
NIC_BUS = ["19", "2b", "3b", "5e", "9b", "ac", "bb", "dc"]
PCI = "".join(f"{i}, 00000000:{b.upper()}:00.0\n" for i, b in enumerate(GPU_BUS)) + "".join(
    f"nic=mlx5_bond_{i}|/sys/devices/pci0000:{b}/0000:{b}:01.0/0000:{b}:00.0\n"
    for i, b in enumerate(NIC_BUS)
)


def bonds() -> list[Port]:
    return [Port(f"mlx5_bond_{i}", 1, "ACTIVE") for i in range(8)]


def test_pci_addresses_parse_and_odd_lines_are_left_out() -> None:
    gpus, nics = parse(PCI + "garbage\n8, N/A\nnic=mlx5_9|/sys/devices/virtual/whatever\n")
    assert gpus[0] == "00000000:18:00.0" and gpus[7] == "00000000:db:00.0" and len(gpus) == 8
    assert nics["mlx5_bond_1"] == "0000:2b:00.0" and "mlx5_9" not in nics and len(nics) == 8


def test_each_rank_of_a_tp2_group_gets_its_own_nearest_nic_on_the_real_b300_matrix() -> None:
    topo = facts({"topo": Section(B300, 0), "pci": Section(PCI, 0)})
    # the group's shared choice: the NICs nearest its FARTHEST GPU; here the four of the
    # socket tie at NODE, one list for both ranks
    shared = choose(topo, [0, 1], bonds())
    assert shared.link == "NODE" and shared.ports == tuple(f"mlx5_bond_{i}:1" for i in range(4))
    per_gpu = {g: choose(topo, [g], bonds()).ports for g in (0, 1)}
    assert per_gpu == {0: ("mlx5_bond_0:1",), 1: ("mlx5_bond_1:1",)}  # PXB each
    assert pairs(per_gpu, topo.gpu_bdf, topo.nic_bdf, [0, 1]) == (
        ("00000000:18:00.0", "0000:19:00.0"),
        ("00000000:2a:00.0", "0000:2b:00.0"),
    )
    # GPUs 2 and 5: across the sockets, each still its own PXB NIC
    per = {g: choose(topo, [g], bonds()).ports for g in (2, 5)}
    assert pairs(per, topo.gpu_bdf, topo.nic_bdf, [2, 5])[1] == ("00000000:ab:00.0", "0000:ac:00.0")
    # TP 1, or an address missing: no mapping (all or nothing)
    assert pairs(per_gpu, topo.gpu_bdf, topo.nic_bdf, [0]) == ()
    assert pairs(per_gpu, topo.gpu_bdf, {}, [0, 1]) == ()


def test_ties_take_the_first_of_the_nearest_on_the_real_a800_matrix() -> None:
    topo = facts({"topo": Section(A800, 0), "pci": Section(PCI, 0)})
    # two PIX NICs per GPU pair: GPU0 and GPU1 both get mlx5_bond_0 (the first of the tie)
    per = {g: choose(topo, [g], bonds()).ports for g in (0, 1)}
    assert per[0][0] == per[1][0] == "mlx5_bond_0:1"


def test_preflight_records_the_mapping_and_the_plan_renders_it() -> None:
    i = inv(decode__tensor_parallel_size=2, decode__gpus=[0, 1])
    ctx = contexts(i)["gpu-b"]
    base = _facts()
    f = HostFacts(
        gpu=base.gpu,
        rdma=RdmaFacts(["uverbs0"], bonds(), []),
        topo=facts({"topo": Section(B300, 0), "pci": Section(PCI, 0)}),
    )
    nics = engine_nics(ctx, f)
    assert nics["decode"].pcie_map == (
        ("00000000:18:00.0", "0000:19:00.0"),
        ("00000000:2a:00.0", "0000:2b:00.0"),
    )
    # the record on the host keeps it (up without preflight reads it back)
    again, _ = parse_engines(record_text(True, [], nics=nics))
    assert again["decode"] == nics["decode"]
    plan = build_plan(
        i, PlanFacts(rdma_present={"gpu-a": True, "gpu-b": True}, engine_nics={"gpu-b": nics})
    )
    env = dict(next(s for s in plan.services() if s.name == "decode").environment)
    assert env["VLLM_GPU_NIC_PCIE_MAPPING"] == (
        "00000000:18:00.0=0000:19:00.0,00000000:2a:00.0=0000:2b:00.0"
    )
    assert env["VLLM_NIC_SELECTION_VARS"] == "UCX_NET_DEVICES:1"
    shared = ",".join(f"mlx5_bond_{i}:1" for i in range(4))
    assert env["UCX_NET_DEVICES"] == shared  # the shared list stays, as the fallback
    # TP 1, RDMA off, or an explicit UCX list: nothing
    one = EngineNic(("mlx5_bond_0:1",), "PXB", (0,), nics["decode"].pcie_map)
    i1 = inv(decode__gpus=[0])
    env1 = dict(
        next(
            s
            for s in build_plan(
                i1, PlanFacts(rdma_present={"gpu-b": True}, engine_nics={"gpu-b": {"decode": one}})
            ).services()
            if s.name == "decode"
        ).environment
    )
    assert "VLLM_GPU_NIC_PCIE_MAPPING" not in env1
    off = build_plan(
        i, PlanFacts(rdma_present={"gpu-a": False, "gpu-b": False}, engine_nics={"gpu-b": nics})
    )
    assert "VLLM_GPU_NIC_PCIE_MAPPING" not in dict(
        next(s for s in off.services() if s.name == "decode").environment
    )
