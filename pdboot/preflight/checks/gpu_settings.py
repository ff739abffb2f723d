"""Host settings that break P/D between the GPUs of one host: peer-to-peer blocked by the
platform (ACS / IOMMU), and HMM left on under the CUDA 13 driver on multi-GPU hosts.

- ``gpu.p2p``: ``nvidia-smi topo -p2p r`` prints, for each pair of GPUs, whether one can
  read the other's memory directly. Its legend (every driver since R450; R610 adds DR):
  X self, OK, CNS chipset not supported, GNS GPU not supported, TNS topology not
  supported, NS not supported, DR disabled by regkey, U unknown. A tensor-parallel engine's
  GPUs exchange activations every layer (NCCL), and two engines on one host can pass KV
  through cuda_ipc: without P2P both go through host memory. CNS / TNS / NS on GPUs that
  support it (data-centre and workstation boards) is the platform: PCIe Access Control
  Services redirecting peer traffic to the root complex, or an IOMMU in translation mode
  (NCCL's troubleshooting guide, "PCI Access Control Services (ACS)").
- ``gpu.hmm``: the ``nvidia_uvm`` module's ``uvm_disable_hmm`` parameter (a kernel bool
  parameter: sysfs prints ``Y`` or ``N``). CUDA 13's release notes list an HMM
  initialisation failure as a known issue; multi-GPU hosts on the CUDA 13 driver set
  ``options nvidia_uvm uvm_disable_hmm=1``. Judged where it applies: two or more GPUs and a
  driver reporting CUDA 13 or later.

Pure parsers over the real formats (tests/unit/fixtures/p2p/, README there); the verdicts
read the GPU area's facts for the GPU count, the CUDA version and the engines' GPUs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdboot.preflight.checks import (
    MISSING,
    CheckResult,
    Command,
    HostContext,
    ParseError,
    Section,
    version_tuple,
)

if TYPE_CHECKING:
    from pdboot.preflight.checks.facts import HostFacts

P2P = "nvidia-smi topo -p2p r"
HMM = "cat /sys/module/nvidia_uvm/parameters/uvm_disable_hmm"
BLOCKED = {
    "CNS": "chipset not supported",
    "TNS": "topology not supported",
    "NS": "not supported",
    "GNS": "GPU not supported",
    "DR": "disabled by regkey",
    "U": "unknown",
}
PLATFORM = ("CNS", "TNS", "NS")  # what ACS / the IOMMU / the board's PCIe path cause

FIX_P2P = (
    "let the GPUs reach each other: disable PCIe ACS on the switches between them (BIOS "
    "setting, or `setpci` on each bridge as NCCL's troubleshooting guide shows) and put the "
    "IOMMU in passthrough (kernel command line `iommu=pt`, with `intel_iommu=on` or "
    "`amd_iommu=on`) or off in the BIOS; then check `nvidia-smi topo -p2p r` shows OK"
)
FIX_HMM = (
    "echo 'options nvidia_uvm uvm_disable_hmm=1' | sudo tee /etc/modprobe.d/nvidia-uvm-hmm.conf, "
    "then reload nvidia_uvm (no GPU process running) or reboot; "
    "`cat /sys/module/nvidia_uvm/parameters/uvm_disable_hmm` must print Y"
)


def commands(ctx: HostContext) -> list[Command]:
    if not ctx.gpus_here:
        return []
    return [Command("p2p", P2P, "gpu"), Command("hmm", HMM, "gpu")]


@dataclass(frozen=True)
class GpuSettingsFacts:
    p2p: Mapping[tuple[int, int], str] | None  # (i, j) -> OK / CNS / ...; None: not read
    p2p_section: Section = MISSING
    hmm_disabled: bool | None = None  # uvm_disable_hmm; None: nvidia_uvm not loaded / unread
    hmm_section: Section = MISSING


_GPU_RE = re.compile(r"GPU(\d+)$")


def parse_p2p(text: str) -> dict[tuple[int, int], str]:
    """The matrix of ``nvidia-smi topo -p2p r|w|n|a|p``: a header of GPU names, one row per
    GPU (leading space, tabs or spaces), then the legend. Escape codes (the header is
    underlined on a terminal) are dropped. {} for a one-GPU host."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    cols: list[int] | None = None
    out: dict[tuple[int, int], str] = {}
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("Legend"):
            if cols is not None and out:
                break
            continue
        if cols is None:
            if all(_GPU_RE.match(w) for w in words):
                cols = [int(w[3:]) for w in words]
            continue
        m = _GPU_RE.match(words[0])
        if m is None:
            break  # the legend, or a line after the matrix
        row = int(m.group(1))
        cells = words[1:]
        if len(cells) != len(cols):
            raise ParseError(f"row GPU{row}: {len(cells)} cells for {len(cols)} GPUs")
        for col, cell in zip(cols, cells, strict=True):
            if col != row:
                out[(row, col)] = cell
    if cols is None:
        raise ParseError("no GPU header line")
    return out


def parse_hmm(text: str) -> bool | None:
    """sysfs prints a bool module parameter as Y or N (older kernels: 1 / 0)."""
    v = text.strip()
    if v in ("Y", "1"):
        return True
    if v in ("N", "0"):
        return False
    if "No such file" in v:  # nvidia_uvm not loaded (yet: it loads on first CUDA use)
        return None
    raise ParseError(f"not a bool parameter: {v[:40]!r}")


def parse(ctx: HostContext, s: Mapping[str, Section]) -> GpuSettingsFacts | None:
    if not ctx.gpus_here:
        return None
    p, h = s.get("p2p", MISSING), s.get("hmm", MISSING)
    p2p: dict[tuple[int, int], str] | None = None
    if p.rc == 0:
        try:
            p2p = parse_p2p(p.output)
        except ParseError:
            p2p = None
    hmm: bool | None = None
    if h.rc is not None:
        try:
            hmm = parse_hmm(h.output)
        except ParseError:
            hmm = None
    return GpuSettingsFacts(p2p, p, hmm, h)


# --------------------------------------------------------------------------- verdicts


def _engine_groups(ctx: HostContext, n_gpus: int) -> list[tuple[str, tuple[int, ...]]]:
    """Each engine's GPUs here ("all": every GPU), for the pairs that must reach each other."""
    out = []
    for need in ctx.gpu_needs:
        gpus = tuple(range(n_gpus)) if need.gpus == "all" else need.gpus
        out.append((need.engine or need.tier, gpus))
    return out


def p2p_verdict(ctx: HostContext, p2p: Mapping[tuple[int, int], str], n_gpus: int) -> CheckResult:
    """Blocked pairs inside one engine (tensor parallel: NCCL every layer) fail on the
    platform's causes; blocked pairs elsewhere on the host (two engines: cuda_ipc for KV)
    warn. GNS is the board's own limit (GeForce): a warning with no platform fix."""
    inside: list[str] = []
    between: list[str] = []
    same = {(a, b) for _, g in _engine_groups(ctx, n_gpus) for a in g for b in g if a != b}
    cells: set[str] = set()
    for (a, b), cell in sorted(p2p.items()):
        if a > b or cell == "OK":
            continue
        cells.add(cell)
        pair = f"GPU {a} <-> GPU {b}: {cell} ({BLOCKED.get(cell, cell)})"
        (inside if (a, b) in same else between).append(pair)
    if not inside and not between:
        return CheckResult("gpu.p2p", "pass", f"peer-to-peer reads OK between all {n_gpus} GPUs")
    platform = bool(cells & set(PLATFORM))
    if inside and platform:
        return CheckResult(
            "gpu.p2p",
            "fail",
            "GPUs of one tensor-parallel engine cannot read each other's memory: "
            + "; ".join(inside)
            + ": NCCL falls back to host memory every layer, and KV between engines here "
            "cannot use cuda_ipc",
            FIX_P2P,
        )
    return CheckResult(
        "gpu.p2p",
        "warn",
        "peer-to-peer blocked: "
        + "; ".join(inside + between)
        + ": KV and activations between these GPUs go through host memory",
        FIX_P2P if platform else "these boards do not offer peer-to-peer; nothing to set",
    )


def hmm_verdict(n_gpus: int, cuda: str | None, hmm_disabled: bool | None) -> CheckResult | None:
    """None where it does not apply: one GPU, CUDA before 13, or nothing read."""
    try:
        cuda13 = cuda is not None and version_tuple(cuda) >= (13,)
    except ParseError:
        cuda13 = False
    if n_gpus < 2 or not cuda13:
        return None
    if hmm_disabled is None:
        return CheckResult(
            "gpu.hmm",
            "pass",
            "nvidia_uvm not loaded yet (uvm_disable_hmm unread); it loads on first CUDA use",
        )
    if hmm_disabled:
        return CheckResult("gpu.hmm", "pass", f"HMM disabled (uvm_disable_hmm=Y), {n_gpus} GPUs")
    return CheckResult(
        "gpu.hmm",
        "warn",
        f"HMM is on (uvm_disable_hmm=N) with {n_gpus} GPUs under the CUDA {cuda} driver: "
        "CUDA 13 lists an HMM initialisation failure as a known issue, and engines on "
        "multi-GPU hosts can fail to create their CUDA context",
        FIX_HMM,
    )


def evaluate(ctx: HostContext, facts: HostFacts) -> list[CheckResult]:
    s, g = facts.gpu_settings, facts.gpu
    if s is None or g is None or not g.gpus:
        return []  # gpu.nvidia_smi already says why
    n = len(g.gpus)
    out = []
    if n >= 2 and s.p2p is not None:
        out.append(p2p_verdict(ctx, s.p2p, n))
    elif n >= 2 and s.p2p_section.rc not in (None, 0):
        out.append(
            CheckResult(
                "gpu.p2p",
                "warn",
                f"nvidia-smi topo -p2p r failed (exit {s.p2p_section.rc}): "
                + s.p2p_section.first_lines(2),
            )
        )
    hmm = hmm_verdict(n, g.cuda, s.hmm_disabled)
    if hmm is not None and s.hmm_section.rc is not None:  # rc None: did not run (--only)
        out.append(hmm)
    return out
