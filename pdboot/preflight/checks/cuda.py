"""Can the engine image's CUDA run on this host's driver (``docker.image_cuda``)? The image's
CUDA version, from the registry's config, the image on the host or its tag; the oldest driver
each CUDA toolkit needs (NVIDIA's table); and the verdict. Pure.
"""

from __future__ import annotations

import json
import re

from pdboot.preflight.checks import (
    CheckResult,
    HostContext,
    ParseError,
    Section,
    unparsed,
    version_tuple,
)
from pdboot.preflight.registry import Lookup

# CUDA major.minor -> the oldest Linux x86_64 driver of that toolkit's GA release, from
# NVIDIA's CUDA Toolkit release notes, Table 3 "CUDA Toolkit and Corresponding Driver
# Versions" (docs.nvidia.com/cuda/cuda-toolkit-release-notes/). The toolkit's GA driver,
# not the minor-version-compatibility floor (525.60.13 for all of 12.x), because CUDA images
# set NVIDIA_REQUIRE_CUDA=cuda>=MAJOR.MINOR and the NVIDIA container runtime refuses to
# start them on a driver that reports an older CUDA. Updates (13.0.1) share their GA's floor.
MIN_DRIVER_FOR_CUDA: dict[tuple[int, int], str] = {
    (13, 0): "580.65.06",
    (12, 9): "575.51.03",
    (12, 8): "570.26",
    (12, 6): "560.28.03",
    (12, 4): "550.54.14",
    (12, 2): "535.54.03",
    (12, 1): "530.30.02",
    (12, 0): "525.60.13",
    (11, 8): "520.61.05",
}


_CUDA_ENV_RE = re.compile(r"^CUDA_VERSION=(\d+)\.(\d+)")
_CU_TAG_RE = re.compile(r"cu(\d{2,3})")


def parse_image_env(text: str) -> str | None:
    """CUDA_VERSION from `docker image inspect --format '{{json .Config.Env}}'`."""
    try:
        env = json.loads(text.strip().splitlines()[0]) if text.strip() else None
    except (json.JSONDecodeError, IndexError):
        raise ParseError("not a JSON list") from None
    if not isinstance(env, list):
        raise ParseError("not a JSON list")
    for item in env:
        m = _CUDA_ENV_RE.match(str(item))
        if m:
            return f"{m.group(1)}.{m.group(2)}"
    return None


def cuda_from_tag(image: str, default: str) -> tuple[str, str]:
    """(CUDA version, why) guessed from the tag when the image is not on the host yet."""
    tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else "latest"
    m = _CU_TAG_RE.search(tag)
    if m:
        digits = m.group(1)
        return f"{digits[:-1]}.{digits[-1]}", f"from the tag {tag!r}"
    return default, "requirements.cuda: the image is not on the host yet"


def driver_floor(cuda: str) -> tuple[str, bool] | None:
    """(oldest driver, exact?) for a CUDA version. A minor newer than the table knows gets
    its major's newest known floor, marked inexact (a lower bound); an unknown major: None."""
    try:
        v = version_tuple(cuda)
    except ParseError:
        return None
    if len(v) < 2:
        return None
    key = (v[0], v[1])
    if key in MIN_DRIVER_FOR_CUDA:
        return MIN_DRIVER_FOR_CUDA[key], True
    lower = [k for k in MIN_DRIVER_FOR_CUDA if k[0] == v[0] and k < key]
    return (MIN_DRIVER_FOR_CUDA[max(lower)], False) if lower else None


_REQUIRE_RE = re.compile(r"cuda>=(\d+\.\d+)")


def cuda_from_config(look: Lookup | None) -> tuple[str | None, str]:
    """(CUDA version, why) from the registry's image config, or (None, why not)."""
    if look is None:
        return None, ""
    cfg = look.config
    if cfg is None:
        return None, f"registry lookup failed: {look.error}"
    if cfg.cuda_version:
        return cfg.cuda_version, "CUDA_VERSION in the registry's image config, before any pull"
    m = _REQUIRE_RE.search(cfg.require_cuda or "")
    if m:
        return m.group(1), "NVIDIA_REQUIRE_CUDA in the image config from the registry"
    return None, "the image config in the registry has no CUDA_VERSION"


def image_cuda_check(
    ctx: HostContext,
    image: Section | None,
    local_cuda: str | None,
    image_error: bool,
    driver: str | None,
) -> CheckResult:
    """docker.image_cuda. Where the CUDA version comes from, best first: the registry's image
    config, the local image (``image``: `docker image inspect`), a cuXYZ tag,
    requirements.cuda."""
    cuda, why = cuda_from_config(ctx.image_lookup)
    registry_note = why if cuda is None and why else ""
    if cuda is None and image is not None and image.rc == 0:
        if image_error:
            return unparsed("docker.image_cuda", image, "docker image inspect")
        cuda = local_cuda
        why = "CUDA_VERSION of the image on this host"
    if cuda is None:
        cuda, why = cuda_from_tag(ctx.image, ctx.req.cuda)
    if registry_note:
        why = f"{why}; {registry_note}"
    found = driver_floor(cuda)
    if found is None:
        return CheckResult("docker.image_cuda", "warn", f"unknown CUDA {cuda} ({why})")
    need, exact = found
    if driver is None:
        return CheckResult(
            "docker.image_cuda", "skip", f"image needs CUDA {cuda} ({why}); driver unknown"
        )
    try:
        ok = version_tuple(driver) >= version_tuple(need)
    except ParseError:
        return CheckResult("docker.image_cuda", "warn", f"cannot compare driver {driver!r}")
    if ok and not exact:
        return CheckResult(
            "docker.image_cuda",
            "warn",
            f"{ctx.image} needs CUDA {cuda} ({why}); pdboot only knows that CUDA "
            f"{cuda.split('.')[0]}.x needs driver >= {need} (this host: {driver})",
            "check the driver against NVIDIA's CUDA release notes (Table 3)",
        )
    if ok:
        return CheckResult(
            "docker.image_cuda",
            "pass",
            f"{ctx.image} needs CUDA {cuda} ({why}): driver {driver} >= {need}",
        )
    return CheckResult(
        "docker.image_cuda",
        "fail",
        f"{ctx.image} needs CUDA {cuda} ({why}), which needs driver >= {need}; "
        f"this host has {driver}: containers would fail with 'CUDA driver version is "
        "insufficient'",
        f"upgrade the driver to >= {need}, or use an image built for an older CUDA",
    )
