"""`pdboot preflight` of several engines per host, end to end: two rtx6000x8 testbed hosts
(8 emulated RTX PRO 6000 each, four HCAs with mlx5_3 PORT_DOWN, a real-format
`nvidia-smi topo -m`), 4 prefill + 4 decode engines per host at TP 1. Every engine's ports
are checked free, every engine is given its nearest ACTIVE port, and a group across the CPU
socket is warned about. Real CLI (a subprocess), real sshd and dockerd."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.cli import Cli
from tests.conftest import RTX_PAIR, module_testbed
from tests.testbed.harness import Testbed

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

FOUR_FOUR = {
    "prefill": {"engines_per_host": 4, "gpus": [0, 1, 2, 3]},
    "decode": {"engines_per_host": 4, "gpus": [4, 5, 6, 7]},
}
# engine -> (UCX_NET_DEVICES, distance) on either host: mlx5_3 (by GPUs 6, 7) is down
NEAREST = {
    "prefill": ("mlx5_0:1", "PIX"),
    "prefill-1": ("mlx5_0:1", "PXB"),
    "prefill-2": ("mlx5_1:1", "PIX"),
    "prefill-3": ("mlx5_1:1", "PXB"),
    "decode": ("mlx5_2:1", "PIX"),
    "decode-1": ("mlx5_2:1", "PXB"),
    "decode-2": ("mlx5_2:1", "NODE"),
    "decode-3": ("mlx5_2:1", "NODE"),
}


tb = module_testbed(RTX_PAIR, images_needed=False)


def preflight(cli: Cli, inv: Path, *args: str) -> dict[str, Any]:
    _, doc = cli.run_json("preflight", str(inv), "--json", *args, timeout=180)
    return dict(doc)


def checks(doc: dict[str, Any], host: str, cid: str) -> list[dict[str, str]]:
    return [c for c in doc["hosts"][host]["checks"] if c["id"] == cid]


def test_every_engine_gets_its_nearest_port_and_its_ports_checked(
    cli: Cli, tb: Testbed, tmp_path: Path
) -> None:
    both = ["gpu-a", "gpu-b"]
    inv = tb.inventory(
        tmp_path / "inv.yaml",
        prefill=both,
        decode=both,
        router="gpu-a",
        overrides={**FOUR_FOUR, "kv_transfer": {"rdma": "auto"}},
    )
    doc = preflight(
        cli,
        inv,
        "--only",
        "rdma",
        "--only",
        "gpu.topology",
        "--only",
        "host.ports",
        "--only",
        "network.side_channel",
    )
    for host in both:
        topo = checks(doc, host, "gpu.topology")
        assert [c["status"] for c in topo] == ["pass"], topo
        assert "8 GPU(s), mlx5_0, mlx5_1, mlx5_2, mlx5_3" in topo[0]["message"]
        got = {}
        for c in checks(doc, host, "rdma.nic_affinity"):
            assert c["status"] == "pass", c
            name, rest = c["message"].split("@", 1)
            port, link = rest.split(" -> ", 1)[1].split(" ")
            got[name] = (port, link.strip("()"))
        assert got == NEAREST
        ports = checks(doc, host, "host.ports")
        assert ports[0]["status"] == "pass", ports
        for port in (8200, 8230, 5630, 8201, 8231, 5631):
            assert str(port) in ports[0]["message"]
        side = checks(doc, host, "network.side_channel")
        assert len(side) == 8  # every prefill engine of both hosts


def test_a_group_across_the_socket_is_warned_about(cli: Cli, tb: Testbed, tmp_path: Path) -> None:
    inv = tb.inventory(
        tmp_path / "inv.yaml",
        prefill=["gpu-a"],
        decode=["gpu-b"],
        router="gpu-a",
        overrides={
            "prefill": {"tensor_parallel_size": 2, "gpus": [[0, 1], [3, 4]]},
            "decode": {"tensor_parallel_size": 2, "gpus": [[6, 7]]},
        },
    )
    doc = preflight(cli, inv, "--only", "rdma.nic_affinity")
    aff = checks(doc, "gpu-a", "rdma.nic_affinity")
    assert [c["status"] for c in aff] == ["pass", "warn"], aff
    assert "prefill-1@gpu-a: GPUs 3,4 -> " in aff[1]["message"]
    assert "(SYS)" in aff[1]["message"] and "across the CPU socket" in aff[1]["message"]
    (dec,) = checks(doc, "gpu-b", "rdma.nic_affinity")
    assert dec["message"] == "decode@gpu-b: GPUs 6,7 -> mlx5_2:1 (NODE)"
