"""The 8-GPU RTX PRO 6000 host (profile rtx6000x8): its GPUs, its four HCAs, a `topo -m`
that pdboot's parser reads into the expected nearest NIC per GPU, and a compose service with
`device_ids` that is granted exactly those GPUs (the stand-in says which)."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable

import yaml

from pdboot.preflight.checks.rdma import parse_devices, parse_ibv_devinfo
from pdboot.preflight.checks.topo import NicChoice, choose
from pdboot.preflight.checks.topo import parse_matrix as parse
from tests.testbed.harness import HostSpec, Testbed

MakeTestbed = Callable[..., Testbed]

# host GPU -> (nearest ACTIVE port, distance): mlx5_3 (next to GPUs 6 and 7) is PORT_DOWN
NEAREST = {
    0: ("mlx5_0:1", "PIX"),
    1: ("mlx5_0:1", "PXB"),
    2: ("mlx5_1:1", "PIX"),
    3: ("mlx5_1:1", "PXB"),
    4: ("mlx5_2:1", "PIX"),
    5: ("mlx5_2:1", "PXB"),
    6: ("mlx5_2:1", "NODE"),
    7: ("mlx5_2:1", "NODE"),
}


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())


def _wait_metrics(url: str, deadline_s: float = 60) -> str:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return _get(url)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _compose(tb: Testbed, name: str, device_ids: list[str], port: int) -> str:
    """A compose project on host gpu8 running the stand-in with a GPU reservation."""
    service = {
        "image": tb.image,
        "network_mode": "host",
        "command": ["Qwen/Qwen3-0.6B", "--port", str(port)],
        "environment": {"STANDIN_LOAD_SECONDS": "0.2"},
        "ulimits": {"memlock": 8388608, "nofile": 20000},
        "deploy": {
            "resources": {
                "reservations": {
                    "devices": [
                        {"driver": "nvidia", "device_ids": device_ids, "capabilities": ["gpu"]}
                    ]
                }
            }
        },
    }
    path = tb.dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "services": {"engine": service}}))
    return f"docker compose -f {path}"


def test_rtx6000x8_gpus_nics_and_granted_gpus(make_testbed: MakeTestbed) -> None:
    tb = make_testbed([HostSpec("gpu8", profile="rtx6000x8")])
    host = tb.hosts["gpu8"]
    listed = tb.ssh("gpu8", "nvidia-smi -L", check=True).stdout.splitlines()
    assert [ln.split(":")[0] for ln in listed] == [f"GPU {i}" for i in range(8)]
    uuids = [g["uuid"] for g in host.profile["gpus"]]
    assert all(u in ln for u, ln in zip(uuids, listed, strict=True))

    ports = parse_ibv_devinfo(tb.ssh("gpu8", "ibv_devinfo").stdout)
    assert [(p.device, p.state) for p in ports] == [
        ("mlx5_0", "ACTIVE"),
        ("mlx5_1", "ACTIVE"),
        ("mlx5_2", "ACTIVE"),
        ("mlx5_3", "DOWN"),
    ]
    devs = parse_devices(tb.ssh("gpu8", "ls /dev/infiniband").stdout)
    assert sorted(devs) == ["rdma_cm", "uverbs0", "uverbs1", "uverbs2", "uverbs3"]

    topo = parse(tb.ssh("gpu8", "nvidia-smi topo -m", check=True).stdout)
    assert topo.notes == ()
    assert [n.device for n in topo.nics] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert topo.link(6, "mlx5_3") == "PIX" and topo.link(0, "mlx5_2") == "SYS"
    for gpu, (port, link) in NEAREST.items():
        assert choose(topo, [gpu], ports) == NicChoice((port,), link), gpu
    assert choose(topo, [0, 1, 2, 3], ports) == NicChoice(("mlx5_0:1", "mlx5_1:1"), "NODE")
    assert choose(topo, [3, 4], ports).across_socket

    host.pull(tb.image)
    # device_ids 2 and 3, asked in the other order: the container sees the host's GPUs 2, 3
    project = _compose(tb, "grant", ["3", "2"], 8300)
    tb.ssh("gpu8", f"{project} up -d", check=True, timeout=120)
    metrics = _wait_metrics(f"http://{host.address}:8300/metrics")
    granted = [ln for ln in metrics.splitlines() if ln.startswith("standin_granted_gpu_info{")]
    assert len(granted) == 2, metrics[-2000:]
    for i, host_gpu in enumerate((2, 3)):
        assert f'index="{i}",uuid="{uuids[host_gpu]}"' in granted[i]
    inside = tb.ssh("gpu8", f"{project} exec -T engine nvidia-smi -L", check=True).stdout
    assert (
        inside == f"GPU 0: {host.profile['gpus'][2]['name']} (UUID: {uuids[2]})\n"
        f"GPU 1: {host.profile['gpus'][3]['name']} (UUID: {uuids[3]})\n"
    )
    # inside, GPU 0 (the host's GPU 2) still has mlx5_1 on its own PCIe switch
    inner = parse(tb.ssh("gpu8", f"{project} exec -T engine nvidia-smi topo -m").stdout)
    assert [g.index for g in inner.gpus] == [0, 1] and inner.link(0, "mlx5_1") == "PIX"
    # dockerd appends NVIDIA_VISIBLE_DEVICES=3,2 (device_ids, as asked) to the engine's own
    # environment only: `docker exec` sees the image's value
    logs = tb.ssh("gpu8", f"{project} logs engine", check=True).stdout
    assert f"STAND-IN granted GPUs (NVIDIA_VISIBLE_DEVICES=3,2): 0={uuids[2]}" in logs

    # a count: dockerd asks for GPUs 0..N-1
    two = tb.ssh(
        "gpu8",
        f"docker run --rm --gpus 2 --entrypoint nvidia-smi {tb.image} "
        "--query-gpu=uuid --format=csv,noheader",
        check=True,
    ).stdout
    assert two.split() == uuids[:2]

    # an id the host does not have: the hook refuses, the container does not start
    bad = _compose(tb, "nogpu", ["9"], 8301)
    res = tb.ssh("gpu8", f"{bad} up -d", timeout=120)
    assert res.returncode != 0 and "9: unknown device" in res.stderr, res.stderr
    assert tb.ssh("gpu8", "docker ps -q --filter name=nogpu", check=True).stdout == ""
