"""One NIC per tensor-parallel rank: each GPU of a TP group paired with its own nearest ACTIVE
HCA by PCI address, for vLLM's ``VLLM_GPU_NIC_PCIE_MAPPING`` (pure).

vLLM 0.33 and 0.34 (``vllm/v1/executor/vllm_net_devices.py``) read
``VLLM_GPU_NIC_PCIE_MAPPING`` (``GPU_BDF=NIC_BDF`` pairs, comma-separated) with
``VLLM_NIC_SELECTION_VARS`` (``UCX_NET_DEVICES:1``): each worker looks up its own GPU's PCI
address, finds the NIC paired with it, names it by ``/sys/class/infiniband/<dev>/device``
and sets ``UCX_NET_DEVICES=<dev>:1`` for itself. Without it the whole TP group shares one
``UCX_NET_DEVICES`` list (the NICs nearest the group's farthest GPU), so on an 8-NIC host a
TP=2 engine moves both ranks' KV through one NIC.

``nvidia-smi topo -m`` gives the distances but no PCI addresses; one more command gives them:
the GPUs' ``pci.bus_id`` and each RDMA device's PCI directory (the resolved ``device`` link,
whose name vLLM compares). The plan renders the variables (plan/vllm_args.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

COMMAND = (
    "nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader; "
    'for d in /sys/class/infiniband/*; do [ -e "$d/device" ] && '
    'echo "nic=${d##*/}|$(readlink -f "$d/device")"; done; true'
)
# domain:bus:device.function, the domain 4 (sysfs) or 8 (nvidia-smi) hex digits
_BDF = re.compile(r"(?:[0-9A-Fa-f]{4,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]")


def parse(text: str) -> tuple[dict[int, str], dict[str, str]]:
    """(GPU index -> PCI address, RDMA device -> PCI address); odd lines are left out."""
    gpus: dict[int, str] = {}
    nics: dict[str, str] = {}
    for ln in text.splitlines():
        if ln.startswith("nic="):
            name, _, path = ln[len("nic=") :].partition("|")
            base = path.strip().rstrip("/").rsplit("/", 1)[-1]
            if name.strip() and _BDF.fullmatch(base):
                nics[name.strip()] = base.lower()
            continue
        idx, _, bus = ln.partition(",")
        if idx.strip().isdigit() and _BDF.fullmatch(bus.strip()):
            gpus[int(idx.strip())] = bus.strip().lower()
    return gpus, nics


def pairs(
    nearest: Mapping[int, Sequence[str]],
    gpu_bdf: Mapping[int, str],
    nic_bdf: Mapping[str, str],
    gpus: Sequence[int],
) -> tuple[tuple[str, str], ...]:
    """(GPU address, NIC address) per GPU of the group, each GPU's first nearest port's
    device; () for one GPU, or when any GPU lacks a NIC or an address (all or nothing: a
    rank left out would keep the shared list while the others moved)."""
    if len(gpus) < 2:
        return ()
    out = []
    for g in gpus:
        ports = nearest.get(g) or ()
        dev = ports[0].split(":", 1)[0] if ports else None
        if dev is None or g not in gpu_bdf or dev not in nic_bdf:
            return ()
        out.append((gpu_bdf[g], nic_bdf[dev]))
    return tuple(out)


__all__ = ["COMMAND", "pairs", "parse"]
