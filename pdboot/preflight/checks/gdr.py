"""GPUDirect RDMA: can the HCA read and write GPU memory directly on this host?

Without it UCX still moves KV over RDMA, but staged through host memory (cuda_copy), which
costs the bandwidth RDMA was chosen for. Two ways the kernel offers it (NVIDIA's GPUDirect
RDMA documentation, "Using nvidia-peermem" / "Using DMA-BUF"):
- the ``nvidia_peermem`` module loaded (``/sys/module/nvidia_peermem``), for any driver;
- dma-buf: a Linux kernel >= 5.12 and the OPEN GPU kernel modules
  (``/proc/driver/nvidia/version`` reads "NVIDIA UNIX Open Kernel Module"; the proprietary
  one reads "NVIDIA UNIX x86_64 Kernel Module"). ``nvidia_fs`` (GPUDirect Storage) is also
  accepted: it registers GPU memory with the HCA the same way.
Pure parser and verdict; the command prints ``key=value`` lines.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdboot.preflight.checks import CheckResult, Command, HostContext, Section

if TYPE_CHECKING:
    from pdboot.preflight.checks.facts import HostFacts

CHECK_ID = "rdma.gpudirect"
SCRIPT = (
    'echo "kernel=$(uname -r)"; '
    "for m in nvidia_peermem nvidia_fs; do [ -d /sys/module/$m ] && echo module=$m; done; "
    'echo "nvrm=$(head -n 1 /proc/driver/nvidia/version 2>/dev/null)"'
)
DMABUF_KERNEL = (5, 12)


def commands(ctx: HostContext) -> list[Command]:
    if not ctx.gpus_here or ctx.rdma_mode == "off":
        return []
    return [Command("gdr", SCRIPT, "rdma")]


@dataclass(frozen=True)
class GdrFacts:
    kernel: tuple[int, int] | None
    modules: frozenset[str]
    nvrm: str  # first line of /proc/driver/nvidia/version ("" when there is none)

    @property
    def open_modules(self) -> bool:
        return "Open Kernel Module" in self.nvrm

    @property
    def dmabuf(self) -> bool:
        return self.open_modules and self.kernel is not None and self.kernel >= DMABUF_KERNEL


def parse_text(text: str) -> GdrFacts:
    kernel: tuple[int, int] | None = None
    modules: set[str] = set()
    nvrm = ""
    for ln in text.splitlines():
        key, _, val = ln.partition("=")
        if key == "kernel":
            m = re.match(r"(\d+)\.(\d+)", val.strip())
            kernel = (int(m.group(1)), int(m.group(2))) if m else None
        elif key == "module":
            modules.add(val.strip())
        elif key == "nvrm":
            nvrm = val.strip()
    return GdrFacts(kernel, frozenset(modules), nvrm)


FIX = (
    "load nvidia_peermem (`sudo modprobe nvidia_peermem`, and list it in "
    "/etc/modules-load.d/ to survive reboots), or install the open GPU kernel modules "
    "(nvidia-open / `nvidia-driver-XXX-open`) on a kernel >= 5.12 for dma-buf"
)


def verdict(f: GdrFacts) -> CheckResult:
    if "nvidia_peermem" in f.modules:
        return CheckResult(CHECK_ID, "pass", "GPUDirect RDMA: nvidia_peermem is loaded")
    kernel = ".".join(map(str, f.kernel)) if f.kernel else "unknown"
    if f.dmabuf:
        msg = f"GPUDirect RDMA via dma-buf: open GPU kernel modules, kernel {kernel}"
        return CheckResult(CHECK_ID, "pass", msg)
    if "nvidia_fs" in f.modules:
        return CheckResult(CHECK_ID, "pass", "GPUDirect RDMA: nvidia_fs is loaded")
    if not f.nvrm:
        why = "no NVIDIA kernel module (/proc/driver/nvidia/version missing)"
    elif f.open_modules:
        why = f"open GPU kernel modules, but kernel {kernel} is older than 5.12 (no dma-buf)"
    else:
        why = "proprietary GPU kernel modules (no dma-buf) and nvidia_peermem is not loaded"
    return CheckResult(
        CHECK_ID,
        "warn",
        f"GPUDirect RDMA is not possible: {why}; UCX would stage KV through host memory",
        FIX,
    )


def parse(ctx: HostContext, s: Mapping[str, Section]) -> GdrFacts | None:
    """None where the command did not run (no GPU host, RDMA off, deselected, cut off)."""
    sec = s.get("gdr")
    if sec is None or sec.rc is None:
        return None
    return parse_text(sec.output)


def evaluate(ctx: HostContext, facts: HostFacts) -> list[CheckResult]:
    """Judged when RDMA will be used: kv_transfer.rdma on, or auto with usable HCAs
    (read from the RDMA area's facts)."""
    if facts.gdr is None or ctx.rdma_mode == "off":
        return []
    if ctx.rdma_mode == "auto" and not (
        facts.rdma is not None and facts.rdma.checked and facts.rdma.usable
    ):
        return []
    return [verdict(facts.gdr)]
