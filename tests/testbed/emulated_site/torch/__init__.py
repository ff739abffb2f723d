"""EMULATED torch for the testbed's stand-in image (see ../README.md). Not PyTorch."""

from __future__ import annotations

from types import SimpleNamespace

import _pdt_image

__version__ = "2.11.0+cu128"
version = SimpleNamespace(cuda="12.8")


def _gpus() -> list[dict]:
    return list(_pdt_image.profile().get("gpus") or [])


def _arch_list() -> list[str]:
    # like torch: an empty list when CUDA is not available
    return list(_pdt_image.knob("arch_list", _pdt_image.ARCH_LIST)) if _gpus() else []


def _capability(i: int) -> tuple[int, int]:
    major, _, minor = str(_gpus()[i]["compute_cap"]).partition(".")
    return int(major), int(minor or 0)


cuda = SimpleNamespace(
    is_available=lambda: bool(_gpus()),
    device_count=lambda: len(_gpus()),
    get_arch_list=_arch_list,
    get_device_capability=_capability,
)
