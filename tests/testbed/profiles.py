"""EMULATED hardware profiles for test hosts: what a host's nvidia-smi, ibv_devinfo,
/dev/infiniband, /proc/driver/nvidia and NVIDIA container runtime look like.

Nothing here is a real GPU or NIC. The `h200` profile reproduces the real capture in
shared/fixtures/h200-host/ (values copied from it). The RTX PRO 6000 profiles are DERIVED:
the formats are the capture's; the values (name "NVIDIA RTX PRO 6000 Blackwell Server
Edition", 97887 MiB, compute capability 12.0, 600 W, driver 580.95.05 / CUDA 13.0, bus ids,
serials, UUIDs) were changed to those public RTX PRO 6000 outputs show; UUIDs are made up.

A profile is a plain dict (written as JSON into the host's folder, read by the emulators).
`resolve(name, overrides)` deep-merges overrides, so a test can say e.g.
``HostSpec("a", profile="rtx6000x2", overrides={"container_runtime": False})``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

EMULATORS = Path(__file__).resolve().parent / "emulators"
UVERBS_MAJOR = 231  # the real major of /dev/infiniband/uverbs*
UVERBS_MINOR = 192
RDMA_CM = (10, 258)  # as in the H200 capture's ls -la /dev/infiniband


# as the H200 capture shows them; the RTX PRO 6000 Server Edition profiles say the same
_SERVER_GPU_SETTINGS: dict[str, Any] = {
    "persistence_mode": "Enabled",
    "display_active": "Off",
    "mig_mode": "Disabled",
    "ecc_mode": "Enabled",
    "ecc_errors_uncorrected": 0,
    "fan": "N/A",
}


def _rtx_gpu(index: int, bus: str) -> dict[str, Any]:
    return {
        "index": index,
        "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "uuid": None,  # derived from the host name: see resolve()
        "serial": f"178172541{index:04d}",
        "bus_id": bus,
        "memory_total": 97887,
        "memory_reserved": 503,
        "memory_used": 0,
        "compute_cap": "12.0",
        "architecture": "Blackwell",
        **_SERVER_GPU_SETTINGS,
        "temperature": 31 + index,
        "pstate": "P8",
        "power_draw": 28.0 + index,
        "power_limit": 600.0,
        "utilization": 0,
        "compute_mode": "Default",
        "clocks_max_sm": 3090,
        "pcie_gen_max": 5,
        "pcie_width_max": 16,
        "vbios": "98.02.52.00.02",
        "inforom_img": "G153.0200.00.01",
    }


RTX6000X2: dict[str, Any] = {
    "description": "EMULATED 2x RTX PRO 6000 Blackwell Server Edition, R580 / CUDA 13.0, "
    "ConnectX-7 InfiniBand port ACTIVE, NVIDIA container runtime present",
    "driver": "580.95.05",
    "nvml": "580.95",
    "cuda": "13.0",
    "gpus": [_rtx_gpu(0, "00000000:01:00.0"), _rtx_gpu(1, "00000000:41:00.0")],
    "processes": [],
    "mig_devices": [],
    "rdma": {
        "tools": True,  # ibv_devinfo installed
        "uverbs": True,  # /dev/infiniband/uverbs* present
        "rdma_cm": True,
        "devices": [
            {
                "name": "mlx5_0",
                "state": "ACTIVE",
                "link_layer": "InfiniBand",
                "node_guid": "b83f:d203:00c5:a3b0",
                "fw_ver": "28.39.2048",
                "board_id": "MT_0000000838",
                "vendor_part_id": 4129,
            }
        ],
    },
    "container_runtime": True,
    "disk_mb": None,
}

H200: dict[str, Any] = {
    "description": "EMULATED copy of the real H200 host in shared/fixtures/h200-host "
    "(1x H200, 580.159.04 / CUDA 13.0, /dev/infiniband with rdma_cm only, no RDMA tools)",
    "driver": "580.159.04",
    "nvml": "580.159",
    "cuda": "13.0",
    "gpus": [
        {
            "index": 0,
            "name": "NVIDIA H200",
            "uuid": "GPU-dff3982f-1734-4108-9e3a-3be6c0ad1d14",
            "serial": "1653724066845",
            "bus_id": "00000000:00:06.0",
            "memory_total": 143771,
            "memory_reserved": 616,
            "memory_free": 143156,
            "memory_used": 0,
            "compute_cap": "9.0",
            "architecture": "Hopper",
            **_SERVER_GPU_SETTINGS,
            "temperature": 37,
            "pstate": "P0",
            "power_draw": 126.0,
            "power_limit": 700.0,
            "utilization": 0,
            "compute_mode": "Default",
            "clocks_max_sm": 1980,
            "pcie_gen_max": 5,
            "pcie_width_max": 16,
            "vbios": "96.00.A5.00.1A",
            "inforom_img": "G520.0282.02.02",
        }
    ],
    "processes": [],
    "mig_devices": [],
    "rdma": {"tools": False, "uverbs": False, "rdma_cm": True, "devices": []},
    "container_runtime": False,  # the capture: no Docker, no toolkit
    "disk_mb": None,
}


# An 8-GPU RTX PRO 6000 Server Edition box (no NVLink: PCIe only) with two sockets, each
# with two PCIe switches; each switch holds two GPUs and one ConnectX-7 HCA. `topo` places a
# device for the emulated `nvidia-smi topo -m`: other NUMA node -> SYS, other host bridge ->
# NODE, other switch -> PHB, same switch -> PXB, same leaf bridge -> PIX (nvidia-smi's Legend).
_RTX8_BUS = ("16", "38", "49", "5A", "98", "B8", "C9", "DA")
_RTX8_CPUS = ("0-31,64-95", "32-63,96-127")


def _rtx8_gpu(index: int) -> dict[str, Any]:
    g = _rtx_gpu(index, f"00000000:{_RTX8_BUS[index]}:00.0")
    sw = index // 2
    g["topo"] = {
        "numa": index // 4,
        "cpus": _RTX8_CPUS[index // 4],
        "bridge": f"hb{sw}",
        "switch": f"sw{sw}",
        "leaf": f"sw{sw}.{index % 2}",
    }
    return g


def _rtx8_hca(i: int, state: str) -> dict[str, Any]:
    return {
        "name": f"mlx5_{i}",
        "state": state,
        "link_layer": "InfiniBand",
        "node_guid": f"b83f:d203:00c5:a3b{i}",
        "fw_ver": "28.39.2048",
        "board_id": "MT_0000000838",
        "vendor_part_id": 4129,
        "lid": 12 + i,
        "topo": {"numa": i // 2, "bridge": f"hb{i}", "switch": f"sw{i}", "leaf": f"sw{i}.0"},
    }


RTX6000X8: dict[str, Any] = {
    "description": "EMULATED 8x RTX PRO 6000 Blackwell Server Edition (PCIe, 2 sockets: GPUs "
    "0-3 / 4-7), R580 / CUDA 13.0, 4 ConnectX-7 InfiniBand HCAs: mlx5_0 PIX to GPU 0 (PXB to 1), "
    "mlx5_1 PIX to GPU 2 (PXB to 3), mlx5_2 PIX to GPU 4 (PXB to 5), mlx5_3 PIX to GPU 6 (PXB "
    "to 7) but PORT_DOWN; NVIDIA container runtime present",
    "driver": "580.95.05",
    "nvml": "580.95",
    "cuda": "13.0",
    "gpus": [_rtx8_gpu(i) for i in range(8)],
    "processes": [],
    "mig_devices": [],
    "rdma": {
        "tools": True,
        "uverbs": True,
        "rdma_cm": True,
        "devices": [_rtx8_hca(i, "DOWN" if i == 3 else "ACTIVE") for i in range(4)],
    },
    "container_runtime": True,
    "disk_mb": None,
}


def _variant(base: dict[str, Any], description: str, **changes: Any) -> dict[str, Any]:
    p = copy.deepcopy(base)
    p["description"] = description
    for k, v in changes.items():
        p[k] = v
    return p


def _with_gpus(base: dict[str, Any], **gpu_changes: Any) -> list[dict[str, Any]]:
    return [dict(g, **gpu_changes) for g in copy.deepcopy(base["gpus"])]


_RDMA_DOWN = copy.deepcopy(RTX6000X2["rdma"])
_RDMA_DOWN["devices"][0]["state"] = "DOWN"
_RDMA_ROCE = copy.deepcopy(RTX6000X2["rdma"])
_RDMA_ROCE["devices"][0]["link_layer"] = "Ethernet"
_NO_RDMA = {"tools": False, "uverbs": False, "rdma_cm": False, "devices": []}

PROFILES: dict[str, dict[str, Any]] = {
    "rtx6000x2": RTX6000X2,
    "h200": H200,
    "rtx6000x8": RTX6000X8,
    "rtx6000x2-roce": _variant(
        RTX6000X2,
        "EMULATED healthy 2x RTX PRO 6000, ConnectX-7 in Ethernet (RoCE) mode",
        rdma=_RDMA_ROCE,
    ),
    "rtx6000x2-port-down": _variant(
        RTX6000X2, "EMULATED 2x RTX PRO 6000 whose ConnectX-7 port is PORT_DOWN", rdma=_RDMA_DOWN
    ),
    "rtx6000x2-no-rdma": _variant(
        RTX6000X2, "EMULATED 2x RTX PRO 6000 without any RDMA NIC", rdma=_NO_RDMA
    ),
    "old-driver": _variant(
        RTX6000X2,
        "EMULATED 2x RTX PRO 6000 on an old R550 driver (550.90.07 / CUDA 12.4)",
        driver="550.90.07",
        nvml="550.90",
        cuda="12.4",
    ),
    "no-driver": _variant(
        RTX6000X2,
        "EMULATED host with GPUs but no NVIDIA driver: no "
        "nvidia-smi, no /proc/driver/nvidia, no container runtime",
        driver=None,
        container_runtime=False,
    ),
    "gpu-busy": _variant(
        RTX6000X2,
        "EMULATED 2x RTX PRO 6000 whose GPU 0 runs another process (81920 MiB, 97% busy)",
        processes=[
            {"gpu": 0, "pid": 48213, "type": "C", "name": "/usr/bin/python3", "used_memory": 81920}
        ],
    ),
    "mig": _variant(
        RTX6000X2,
        "EMULATED 2x RTX PRO 6000 with MIG enabled on GPU 0",
        mig_devices=[
            {
                "gpu": 0,
                "gi": 3,
                "ci": 0,
                "dev": 0,
                "memory_used": 64,
                "memory_total": 24192,
                "bar1_used": 0,
                "bar1_total": 8327,
                "sm": 46,
            }
        ],
    ),
    "no-container-runtime": _variant(
        RTX6000X2,
        "EMULATED 2x RTX PRO 6000 without the NVIDIA Container Toolkit",
        container_runtime=False,
    ),
    "cpu-only": _variant(
        RTX6000X2,
        "EMULATED host without GPUs or driver (an ingress/router box)",
        driver=None,
        gpus=[],
        rdma=_NO_RDMA,
        container_runtime=False,
    ),
}
PROFILES["gpu-busy"]["gpus"][0].update(
    memory_used=81920 + 2, utilization=97, pstate="P0", power_draw=512.0
)
PROFILES["mig"]["gpus"][0].update(mig_mode="Enabled")


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` merged in, mappings key by key; neither is modified."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def resolve(
    profile: str | dict[str, Any], overrides: dict[str, Any] | None, host: str
) -> dict[str, Any]:
    if isinstance(profile, str):
        if profile not in PROFILES:
            raise ValueError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
        p = copy.deepcopy(PROFILES[profile])
        p["profile"] = profile
    else:
        p = copy.deepcopy(profile)
        p.setdefault("profile", "custom")
    p = deep_merge(p, overrides or {})
    for g in p.get("gpus", []):
        if not g.get("uuid"):
            h = hashlib.sha256(f"{host}/{g['index']}".encode()).hexdigest()
            g["uuid"] = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
    return p


def _script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def _mknod(path: Path, major: int, minor: int) -> None:
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    path.chmod(0o666)  # crw-rw-rw- like the real nodes (umask would drop the bits)


def install(host_dir: Path, profile: dict[str, Any]) -> None:
    """Write the host's emulated tools, devices and driver files from its profile."""
    (host_dir / "profile.json").write_text(json.dumps(profile, indent=1))
    sbin, ib = host_dir / "sbin", host_dir / "ib"
    py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    env = f"PDT_PROFILE={host_dir / 'profile.json'}"
    if profile.get("driver"):
        _script(
            sbin / "nvidia-smi",
            f'#!/bin/sh\n{env} exec {py} -S -E {EMULATORS / "nvidia_smi.py"} "$@"\n',
        )
        drv = host_dir / "procdriver" / "nvidia"
        drv.mkdir(parents=True, exist_ok=True)
        # "kernel_module": "proprietary" shows the closed module's line (no dma-buf, so
        # no GPUDirect RDMA without nvidia_peermem); the open one is the default
        kmod = (
            "NVIDIA UNIX x86_64 Kernel Module"
            if profile.get("kernel_module") == "proprietary"
            else "NVIDIA UNIX Open Kernel Module for x86_64"
        )
        (drv / "version").write_text(
            f"NVRM version: {kmod}  "
            f"{profile['driver']}  Release Build  (pdboot-testbed@emulated)  \n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14) \n"
        )
    rdma = profile.get("rdma") or {}
    if rdma.get("tools"):
        _script(
            sbin / "ibv_devinfo",
            f'#!/bin/sh\n{env} exec {py} -S -E {EMULATORS / "ibv_devinfo.py"} "$@"\n',
        )
    if rdma.get("rdma_cm"):
        _mknod(ib / "rdma_cm", *RDMA_CM)
    if rdma.get("uverbs"):
        for i, _dev in enumerate(rdma.get("devices", [])):
            _mknod(ib / f"uverbs{i}", UVERBS_MAJOR, UVERBS_MINOR + i)
    if profile.get("container_runtime"):
        # Stand-ins for the NVIDIA Container Toolkit: the hook that makes dockerd accept
        # GPU requests (it installs the emulated nvidia-smi into the container: there is no
        # GPU), and a runtime named nvidia that is plain runc.
        _script(
            sbin / "nvidia-container-runtime-hook",
            f'#!/bin/sh\n{env} exec {py} -S -E {EMULATORS / "nvidia_hook.py"} "$@"\n',
        )
        _script(
            sbin / "nvidia-container-runtime",
            '#!/bin/sh\n# EMULATED NVIDIA runtime (pdboot testbed): plain runc\nexec runc "$@"\n',
        )
        _script(
            sbin / "nvidia-ctk",
            "#!/bin/sh\n# EMULATED (pdboot testbed)\n"
            'echo "NVIDIA Container Toolkit CLI version 1.17.8"\n',
        )
