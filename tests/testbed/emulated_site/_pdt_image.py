"""EMULATION (see README.md): what the host's profile says this image's torch/NIXL report."""

from __future__ import annotations

import json
from typing import Any

PROFILE = "/usr/local/share/pdt-nvidia/profile.json"  # written by the NVIDIA hook
# torch 2.11.0+cu128's torch.cuda.get_arch_list() (pytorch/pytorch#182250)
ARCH_LIST = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
UCT_MODULES = ["cma", "cuda", "cuda_gdrcopy", "ib", "rdmacm", "tcp"]


def profile() -> dict[str, Any]:
    try:
        with open(PROFILE) as f:
            return dict(json.load(f))
    except (OSError, ValueError):
        return {}  # no GPUs requested: the hook wrote nothing


def knob(key: str, default: Any) -> Any:
    return (profile().get("image") or {}).get(key, default)
