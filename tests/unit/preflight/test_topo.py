"""nvidia-smi topo -m: the parser on every published output in fixtures/topo/ (copies of
shared/fixtures/topo, see their README) and the H200 capture, the nearest-NIC choice, and
mutated outputs that must never make either raise."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest

from pdboot.preflight.checks import Section, parse_sections
from pdboot.preflight.checks.rdma import Port
from pdboot.preflight.checks.topo import NicChoice, TopoFacts, choose, facts, rank, ucx_net_devices
from pdboot.preflight.checks.topo import parse_matrix as parse
from tests.unit.paths import FIXTURES

FIX = FIXTURES
TOPO = FIX / "topo"
TOPO_FILES = sorted(p.name for p in TOPO.glob("*.txt"))


def _h200_topo() -> str:
    return parse_sections((FIX / "h200-host" / "smi.txt").read_text())["nvidia-smi topo -m"].output


def _text(name: str) -> str:
    return _h200_topo() if name == "h200" else (TOPO / name).read_text()


def _bonds(n: int) -> list[str]:
    return [f"mlx5_bond_{i}" for i in range(n)]


def _mlx(n: int) -> list[str]:
    return [f"mlx5_{i}" for i in range(n)]


# file -> (GPU count, NIC devices in column order, {(gpu, device): link},
#          {(row, col): cell}, {gpu: (cpu affinity, numa affinity, gpu numa id)})
EXPECTED: dict[str, tuple[int, list[str], dict[Any, str], dict[Any, str], dict[int, Any]]] = {
    "a100_1gpu_5bondnic_lmdeploy_check_env.txt": (
        1,
        _bonds(5),
        {(0, "mlx5_bond_3"): "PXB", (0, "mlx5_bond_4"): "NODE", (0, "mlx5_bond_0"): "SYS"},
        {("NIC4", "NIC4"): "X", ("NIC0", "NIC1"): "NODE"},
        {0: ("32-63,96-127", "1", None)},
    ),
    "a10_4gpu_pcie_2nic_all_sys.txt": (
        4,
        _mlx(2),
        {(0, "mlx5_0"): "SYS", (3, "mlx5_1"): "SYS"},
        {("NIC0", "NIC1"): "PIX", ("GPU1", "GPU2"): "SYS"},
        {3: ("0-127", "0", None)},
    ),
    "a800_8gpu_nvlink_8bondnic_tabs.txt": (
        8,
        _bonds(8),
        {
            (0, "mlx5_bond_1"): "PIX",
            (2, "mlx5_bond_2"): "PIX",
            (4, "mlx5_bond_0"): "SYS",
            (7, "mlx5_bond_5"): "NODE",
        },
        {("GPU0", "GPU7"): "NV8", ("NIC7", "NIC7"): "X"},
        {0: ("0-61", "0", None), 4: ("62-123", "1", None)},
    ),
    "b300_cx8_8gpu_nvlink_8bondnic_deepep590.txt": (
        8,
        _bonds(8),
        {(1, "mlx5_bond_1"): "PXB", (0, "mlx5_bond_1"): "NODE", (7, "mlx5_bond_0"): "SYS"},
        {("GPU3", "GPU4"): "NV18"},
        {7: ("64-127,192-255", "1", None)},
    ),
    "h100_8gpu_no_nvlink_in_matrix_12nic_tabs_deepep397.txt": (
        8,
        _mlx(12),
        {
            (0, "mlx5_0"): "PIX",
            (0, "mlx5_2"): "PIX",
            (1, "mlx5_3"): "PIX",
            (7, "mlx5_11"): "PIX",
            (4, "mlx5_0"): "SYS",
        },
        {("NIC10", "NIC11"): "NODE", ("GPU0", "GPU1"): "NODE"},
        {0: ("0,2,4,6,8,10", "0", None), 5: ("1,3,5,7,9,11", "1", None)},
    ),
    "rtx4090_8gpu_pcie_4nic_phb_blog.txt": (
        8,
        _mlx(4),
        {(6, "mlx5_0"): "PHB", (6, "mlx5_3"): "PHB", (0, "mlx5_0"): "SYS"},
        {("NIC2", "NIC3"): "PIX"},
        {0: ("24-31,88-95", "3", None), 7: ("32-39,96-103", "4", None)},
    ),
    "rtx_pro_6000_blackwell_8gpu_pcie_no_nic_blog.txt": (
        8,
        [],
        {},
        {("GPU0", "GPU1"): "SYS", ("GPU7", "GPU7"): "X"},
        {4: ("112-119,240-247", "14", None), 7: ("80-87,208-215", "10", None)},
    ),
    "traverse_4gpu_nv3_4mlx5_oldformat_tabs.txt": (
        4,
        _mlx(4),
        {(0, "mlx5_0"): "NODE", (2, "mlx5_3"): "NODE", (1, "mlx5_2"): "SYS"},
        {("GPU0", "GPU1"): "NV3", ("mlx5_0", "mlx5_1"): "PIX"},
        {2: ("64-127", "8", None)},
    ),
    "h200": (1, [], {}, {("GPU0", "GPU0"): "X"}, {0: ("0-15", "0", None)}),
}


def test_every_fixture_has_expectations() -> None:
    assert set(TOPO_FILES) | {"h200"} == set(EXPECTED)


@pytest.mark.parametrize("name", [*TOPO_FILES, "h200"])
def test_parse_fixture(name: str) -> None:
    n_gpus, nics, links, cells, affinity = EXPECTED[name]
    f = parse(_text(name))
    assert f.notes == ()
    assert [g.index for g in f.gpus] == list(range(n_gpus))
    assert [n.device for n in f.nics] == nics
    for (gpu, dev), link in links.items():
        assert f.link(gpu, dev) == link, (gpu, dev)
    for key, cell in cells.items():
        assert f.cells[key] == cell, key
    for gpu, (cpu, numa, gpu_numa) in affinity.items():
        g = f.gpu(gpu)
        assert g is not None
        assert (g.cpu_affinity, g.numa_affinity, g.gpu_numa_id) == (cpu, numa, gpu_numa)
    # the matrix is square: every GPU has a cell towards every NIC
    for g in f.gpus:
        assert all(f.link(g.index, n.device) for n in f.nics if n.device)


def test_legend_names_the_nic_columns() -> None:
    f = parse(_text("a800_8gpu_nvlink_8bondnic_tabs.txt"))
    assert f.nics[3].label == "NIC3" and f.nics[3].device == "mlx5_bond_3"
    old = parse(_text("traverse_4gpu_nv3_4mlx5_oldformat_tabs.txt"))
    assert old.nics[3].label == "mlx5_3" and old.nics[3].device == "mlx5_3"


def test_unreadable_parts_become_notes() -> None:
    text = _text("a10_4gpu_pcie_2nic_all_sys.txt")
    broken = text.replace(
        "GPU2    SYS     SYS      X      SYS     SYS     SYS ",
        "GPU2    SYS     SYS      X      SYS     S?S     SYS ",
    )
    f = parse(broken)
    assert ("GPU2", "NIC0") not in f.cells
    assert f.link(2, "mlx5_0") == "SYS"  # read from NIC0's row instead
    assert any("GPU2" in n and "NIC0" in n for n in f.notes), f.notes
    lines = text.splitlines(keepends=True)
    twice = parse("".join(lines[:6] + lines[5:]))  # GPU1's row printed twice
    assert [g.index for g in twice.gpus] == [0, 1, 2, 3]
    assert "row GPU1 repeated: the first kept" in twice.notes
    no_legend = parse(text.split("NIC Legend:")[0])
    assert [n.device for n in no_legend.nics] == [None, None]
    assert any("NIC0 is not in the NIC Legend" in n for n in no_legend.notes)


@pytest.mark.parametrize(
    "text,why",
    [
        ("", "empty output"),
        (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
            "couldn't communicate",
        ),
    ],
)
def test_no_matrix(text: str, why: str) -> None:
    f = parse(text)
    assert f.gpus == () and len(f.notes) == 1 and why in f.notes[0]


def test_facts_from_sections() -> None:
    ok = facts({"topo": Section(_h200_topo(), 0)})
    assert [g.index for g in ok.gpus] == [0] and ok.notes == ()
    assert "did not finish" in facts({"topo": Section("", None)}).notes[0]
    failed = facts({"topo": Section("No devices were found\n", 6)})
    assert failed.gpus == () and failed.notes[-1] == "nvidia-smi topo -m exit 6"


# --------------------------------------------------------------------------- choice


def _ports(devices: list[str], down: tuple[str, ...] = ()) -> list[Port]:
    return [Port(d, 1, "DOWN" if d in down else "ACTIVE") for d in devices]


def _choose(name: str, gpus: list[int], ports: list[Port] | list[str]) -> NicChoice:
    return choose(parse(_text(name)), gpus, ports)


def test_nearest_with_ties() -> None:
    c = _choose("a800_8gpu_nvlink_8bondnic_tabs.txt", [0], _ports(_bonds(8)))
    assert c == NicChoice(("mlx5_bond_0:1", "mlx5_bond_1:1"), "PIX")
    assert not c.across_socket
    c = _choose("h100_8gpu_no_nvlink_in_matrix_12nic_tabs_deepep397.txt", [0], _ports(_mlx(12)))
    assert c.ports == ("mlx5_0:1", "mlx5_1:1", "mlx5_2:1") and c.link == "PIX"
    c = _choose("h100_8gpu_no_nvlink_in_matrix_12nic_tabs_deepep397.txt", [7], _ports(_mlx(12)))
    assert c.ports == ("mlx5_11:1",)
    c = _choose("h100_8gpu_no_nvlink_in_matrix_12nic_tabs_deepep397.txt", [0, 4], _ports(_mlx(12)))
    assert c.across_socket and c.ports[:3] == ("mlx5_0:1", "mlx5_1:1", "mlx5_2:1")
    assert c.ports[-3:] == ("mlx5_9:1", "mlx5_10:1", "mlx5_11:1")  # name order, numbers as numbers


def test_group_takes_its_farthest_gpu() -> None:
    a800 = "a800_8gpu_nvlink_8bondnic_tabs.txt"
    # GPUs 0 and 1 share their PIX NICs; 0 and 2 do not: every socket-0 NIC is NODE to one
    assert _choose(a800, [0, 1], _ports(_bonds(8))).ports == ("mlx5_bond_0:1", "mlx5_bond_1:1")
    c = _choose(a800, [0, 2], _ports(_bonds(8)))
    assert c.link == "NODE" and c.ports == tuple(f"mlx5_bond_{i}:1" for i in range(4))
    c = _choose(a800, [0, 4], _ports(_bonds(8)))
    assert c.link == "SYS" and len(c.ports) == 8 and c.across_socket


def test_only_active_ports() -> None:
    a800 = "a800_8gpu_nvlink_8bondnic_tabs.txt"
    c = _choose(a800, [0], _ports(_bonds(8), down=("mlx5_bond_0",)))
    assert c.ports == ("mlx5_bond_1:1",) and c.link == "PIX"
    c = _choose(a800, [0], _ports(_bonds(8), down=tuple(_bonds(4))))
    assert c.link == "SYS" and c.across_socket and c.ports[0] == "mlx5_bond_4:1"
    both = [Port("mlx5_0", 2, "ACTIVE"), Port("mlx5_0", 1, "ACTIVE"), Port("mlx5_1", 1, "INIT")]
    c = _choose("traverse_4gpu_nv3_4mlx5_oldformat_tabs.txt", [0, 1], both)
    assert c == NicChoice(("mlx5_0:1", "mlx5_0:2"), "NODE")


def test_ports_by_name_are_active() -> None:
    a800 = "a800_8gpu_nvlink_8bondnic_tabs.txt"
    c = _choose(a800, [6], ["mlx5_bond_0:1", "mlx5_bond_7", "mlx5_bond_6:2"])
    assert c == NicChoice(("mlx5_bond_6:2", "mlx5_bond_7:1"), "PIX")


def test_across_socket_warning() -> None:
    c = _choose("a10_4gpu_pcie_2nic_all_sys.txt", [1], _ports(_mlx(2)))
    assert c.ports == ("mlx5_0:1", "mlx5_1:1") and c.link == "SYS" and c.across_socket
    rtx = "rtx4090_8gpu_pcie_4nic_phb_blog.txt"
    assert _choose(rtx, [6], _ports(_mlx(4))).link == "PHB"
    assert _choose(rtx, [0], _ports(_mlx(4))).across_socket


@pytest.mark.parametrize(
    "name,gpus,ports,why",
    [
        (
            "rtx_pro_6000_blackwell_8gpu_pcie_no_nic_blog.txt",
            [0],
            _ports(["mlx5_0"]),
            "lists no NIC",
        ),
        (
            "a10_4gpu_pcie_2nic_all_sys.txt",
            [0],
            _ports(_mlx(2), down=tuple(_mlx(2))),
            "no ACTIVE HCA port",
        ),
        ("a10_4gpu_pcie_2nic_all_sys.txt", [0], [], "no ACTIVE HCA port"),
        ("a10_4gpu_pcie_2nic_all_sys.txt", [0, 9], _ports(_mlx(2)), "GPU 9 not in"),
        ("a10_4gpu_pcie_2nic_all_sys.txt", [], _ports(_mlx(2)), "no GPU"),
        ("a10_4gpu_pcie_2nic_all_sys.txt", [0], _ports(["mlx5_7"]), "lists mlx5_0, mlx5_1"),
    ],
)
def test_nothing_to_choose(name: str, gpus: list[int], ports: list[Port], why: str) -> None:
    c = _choose(name, gpus, ports)
    assert c.ports == () and c.link is None and not c.across_socket and why in c.reason


def test_explicit_net_devices_win() -> None:
    c = NicChoice(("mlx5_0:1", "mlx5_1:1"), "PIX")
    assert ucx_net_devices(c, None) == "mlx5_0:1,mlx5_1:1"
    assert ucx_net_devices(c, "mlx5_3:1") == "mlx5_3:1"
    assert ucx_net_devices(c, "all") == "all"
    assert ucx_net_devices(NicChoice((), None, "no NIC"), None) is None


def test_rank_order() -> None:
    order = ["PIX", "PXB", "PHB", "NODE", "SYS"]
    assert sorted(order, key=lambda x: rank(x) or 0) == order
    assert rank("SOC") == rank("SYS")
    assert rank("NV8") is None and rank("X") is None and rank(None) is None


# --------------------------------------------------------------------------- fuzz


def _mutations(text: str, rng: random.Random) -> str:
    kind = rng.randrange(7)
    lines = text.splitlines(keepends=True)
    if kind == 0:  # cut anywhere
        return text[: rng.randrange(len(text) + 1)]
    if kind == 1 and text:  # drop a character
        i = rng.randrange(len(text))
        return text[:i] + text[i + 1 :]
    if kind == 2 and lines:  # drop or double a line
        i = rng.randrange(len(lines))
        return "".join(lines[:i] + ([lines[i]] * rng.randrange(3)) + lines[i + 1 :])
    if kind == 3:  # a token turned into noise
        tokens = re.split(r"(\s+)", text)
        i = rng.randrange(len(tokens))
        tokens[i] = rng.choice(["", "N/A", "\t", "GPU99", "NIC42", "X", "NV", "??", "\x1b[4m"])
        return "".join(tokens)
    if kind == 4:  # tabs <-> spaces
        return text.replace("\t", "    ") if "\t" in text else re.sub(r" {2,}", "\t", text)
    if kind == 5 and len(lines) > 1:  # lines swapped
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
        return "".join(lines)
    return "".join(chr(rng.randrange(1, 0x250)) if rng.random() < 0.02 else c for c in text)


@pytest.mark.parametrize("name", [*TOPO_FILES, "h200"])
def test_mutated_outputs_never_raise(name: str) -> None:
    rng = random.Random(name)
    text = _text(name)
    ports = _ports(_mlx(12) + _bonds(8))
    for _ in range(300):
        text_m = text
        for _ in range(rng.randrange(1, 4)):
            text_m = _mutations(text_m, rng)
        f = parse(text_m)
        assert isinstance(f, TopoFacts)
        for gpus in ([0], [0, 1], [g.index for g in f.gpus]):
            c = choose(f, gpus, ports)
            assert c.link is None or c.ports
