"""The platform settings behind blocked GPU peer-to-peer inside a host, read where they are
set (gpu_settings.py's ``gpu.p2p`` reads only the driver's verdict):

- ``gpu.acs``: PCIe Access Control Services on the bridges above the GPUs. ``lspci -vvv``
  prints each bridge's ``ACSCtl:`` line (pciutils' format: ``SrcValid+ TransBlk- ReqRedir+
  CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-``, ``+`` on). ``ReqRedir+`` /
  ``CmpltRedir+`` (and ``EgressCtrl+``) send a GPU's peer requests up to the root complex
  instead of across the switch: NCCL's troubleshooting guide ("PCI Access Control Services")
  says peer-to-peer then runs slowly or hangs, and asks for ACS off. A bridge is above a GPU
  when the GPU's bus lies in its ``secondary..subordinate`` range (its ``Bus:`` line); root
  ports are left out (Linux sets ACS there whenever the IOMMU is on, and peers under one
  switch never cross them).
  Without root, lspci prints ``Capabilities: <access denied>``: the check says it is
  unread rather than guess.
- ``gpu.iommu``: the kernel's IOMMU domain of each GPU's group
  (Documentation/ABI/testing/sysfs-kernel-iommu_groups: ``/sys/kernel/iommu_groups/N/type``
  is ``DMA`` / ``DMA-FQ`` (translated), ``identity`` (passthrough), ``blocked``,
  ``unmanaged`` (a VFIO guest's); ``.../N/devices/`` links each member). Translated DMA
  between GPUs goes through the IOMMU (NCCL asks for ``iommu=pt``); no groups: no IOMMU.
  The kernel command line is kept for the message (``iommu=pt``, ``intel_iommu=on``, ...)
  and decides where the type files are missing (kernels before 5.11).

Only a host with two or more GPUs has peer-to-peer to judge: with one, both say they skip.
Pure parsers over the documented formats (tests/unit/fixtures/acs/, README there).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from pdboot.preflight.checks import MISSING, CheckResult, Command, HostContext, ParseError, Section

if TYPE_CHECKING:
    from pdboot.preflight.checks.facts import HostFacts

NVIDIA = "lspci -D -n -d 10de:"  # every NVIDIA function: GPUs are class 0300 / 0302
BRIDGES = "lspci -D -vvv -d ::0604"  # PCI bridges only: root and switch ports
IOMMU_TYPES = "grep -H . /sys/kernel/iommu_groups/*/type"
IOMMU_DEVICES = "find /sys/kernel/iommu_groups/ -type l"
CMDLINE = "cat /proc/cmdline"
T = TypeVar("T")
REDIRECTS = ("ReqRedir", "CmpltRedir", "EgressCtrl")  # what moves peer traffic upstream
TRANSLATED = ("DMA", "DMA-FQ")
_IOMMU_WORDS = ("iommu", "intel_iommu", "amd_iommu", "iommu.passthrough", "iommu.strict")

FIX_ACS = (
    "disable ACS on the PCIe switch ports above the GPUs: the BIOS setting (often "
    "'ACS Control' or 'PCIe ACS'), or at each boot `sudo setpci -s BDF ECAP_ACS+0x6.w=0000` "
    "for every bridge listed (NCCL's troubleshooting guide); then `sudo lspci -vvv | grep "
    "ACSCtl` shows ReqRedir- CmpltRedir- and `nvidia-smi topo -p2p r` shows OK"
)
FIX_IOMMU = (
    "put the IOMMU in passthrough: add `iommu=pt` (with `intel_iommu=on` or `amd_iommu=on` "
    "where the IOMMU is wanted) to GRUB_CMDLINE_LINUX in /etc/default/grub, `sudo "
    "update-grub` and reboot, or turn the IOMMU off in the BIOS; then "
    "`cat /sys/kernel/iommu_groups/*/type` shows identity for the GPUs' groups"
)
FIX_UNREAD = (
    "run `sudo lspci -vvv | grep ACSCtl` on the host by hand: every bridge above the GPUs "
    "should show ReqRedir- CmpltRedir-"
)


def commands(ctx: HostContext) -> list[Command]:
    if not ctx.gpus_here:
        return []
    return [
        Command("nvidia_pci", NVIDIA, "gpu"),
        Command("bridges", BRIDGES, "gpu"),
        Command("iommu_types", IOMMU_TYPES, "gpu"),
        Command("iommu_devices", IOMMU_DEVICES, "gpu"),
        Command("cmdline", CMDLINE, "gpu"),
    ]


@dataclass(frozen=True)
class Bridge:
    bdf: str  # 0000:00:01.0
    secondary: int  # the bus range below it
    subordinate: int
    acs: Mapping[str, bool] | None  # ACSCtl's flags; None: no ACS capability shown
    denied: bool  # lspci printed <access denied> (no root): capabilities unread
    root_port: bool = False  # its Express capability says "Root Port"


@dataclass(frozen=True)
class AcsFacts:
    gpus: tuple[str, ...] | None  # the NVIDIA GPUs' addresses; None: lspci unread
    bridges: tuple[Bridge, ...] | None
    bridges_section: Section = MISSING
    iommu_types: Mapping[int, str] | None = None  # group -> type; None: no type files
    iommu_devices: Mapping[str, int] | None = None  # address -> group; {}: no IOMMU
    cmdline: tuple[str, ...] = ()  # the kernel command line's IOMMU words


_BDF = re.compile(r"^([0-9a-fA-F]{4}):([0-9a-fA-F]{2}):[0-9a-fA-F]{2}\.[0-7]$")


def _bus(bdf: str) -> tuple[str, int]:
    m = _BDF.match(bdf)
    if m is None:
        raise ParseError(f"not a PCI address: {bdf!r}")
    return m.group(1).lower(), int(m.group(2), 16)


def parse_nvidia(text: str) -> tuple[str, ...]:
    """``lspci -D -n``: ``0000:1b:00.0 0302: 10de:2330 (rev a1)``; the GPUs' addresses."""
    out = []
    for line in text.splitlines():
        words = line.split()
        if len(words) < 3:
            continue
        _bus(words[0])
        if words[1].rstrip(":") in ("0300", "0302"):
            out.append(words[0].lower())
    return tuple(out)


_BUS_LINE = re.compile(r"Bus: primary=[0-9a-f]+, secondary=([0-9a-f]+), subordinate=([0-9a-f]+)")
_FLAG = re.compile(r"(\w+)([+-])")


def parse_bridges(text: str) -> tuple[Bridge, ...]:
    """``lspci -D -vvv``: a block per device (its address first, unindented), the
    ``Bus:`` line and, under the Access Control Services capability, ``ACSCtl:``."""
    out: list[Bridge] = []
    block: list[str] = []

    def close() -> None:
        if not block:
            return
        bdf = block[0].split()[0].lower()
        _bus(bdf)
        rng = next((m for ln in block if (m := _BUS_LINE.search(ln))), None)
        if rng is not None:  # a bridge (the filter passes only bridges)
            acs_line = next((ln for ln in block if ln.strip().startswith("ACSCtl:")), None)
            acs = None
            if acs_line is not None:
                acs = {k: v == "+" for k, v in _FLAG.findall(acs_line.split(":", 1)[1])}
            denied = any("<access denied>" in ln for ln in block)
            root = any(re.search(r"Express \(v\d\) Root Port", ln) for ln in block)
            out.append(Bridge(bdf, int(rng[1], 16), int(rng[2], 16), acs, denied, root))
        block.clear()

    for line in text.splitlines():
        if line and not line[0].isspace():
            close()
            if _BDF.match(line.split()[0]):
                block.append(line)
            continue
        if block and line.strip():
            block.append(line)
    close()
    return tuple(out)


_TYPE_LINE = re.compile(r"^/sys/kernel/iommu_groups/(\d+)/type:(\S+)$")
_DEVICE_LINE = re.compile(r"^/sys/kernel/iommu_groups/(\d+)/devices/(\S+)$")


def parse_iommu_types(text: str) -> dict[int, str]:
    """``grep -H .`` over the type files: ``/sys/kernel/iommu_groups/12/type:DMA-FQ``."""
    out = {}
    for line in text.splitlines():
        if m := _TYPE_LINE.match(line.strip()):
            out[int(m[1])] = m[2]
    return out


def parse_iommu_devices(text: str) -> dict[str, int]:
    """``find -type l``: ``/sys/kernel/iommu_groups/17/devices/0000:3b:00.0``."""
    out = {}
    for line in text.splitlines():
        if m := _DEVICE_LINE.match(line.strip()):
            out[m[2].lower()] = int(m[1])
    return out


def parse_cmdline(text: str) -> tuple[str, ...]:
    """The command line's IOMMU words (``iommu=pt``, ``intel_iommu=on``, ...)."""
    return tuple(w for w in text.split() if w.split("=", 1)[0] in _IOMMU_WORDS)


def _try(section: Section, parser: Callable[[str], T]) -> T | None:
    if section.rc != 0:
        return None
    try:
        return parser(section.output)
    except ParseError:
        return None


def parse(ctx: HostContext, s: Mapping[str, Section]) -> AcsFacts | None:
    if not ctx.gpus_here:
        return None
    gpus = _try(s.get("nvidia_pci", MISSING), parse_nvidia)
    b = s.get("bridges", MISSING)
    bridges = _try(b, parse_bridges)
    types = _try(s.get("iommu_types", MISSING), parse_iommu_types)
    dev = s.get("iommu_devices", MISSING)
    devices = _try(dev, parse_iommu_devices)
    if devices is None and dev.rc is not None and "No such file" in dev.output:
        devices = {}  # no /sys/kernel/iommu_groups: no IOMMU
    cmd = s.get("cmdline", MISSING)
    words = parse_cmdline(cmd.output) if cmd.rc == 0 else ()
    return AcsFacts(gpus, bridges, b, types, devices, words)


# --------------------------------------------------------------------------- verdicts


def bridges_above(bridges: tuple[Bridge, ...], gpu: str) -> list[Bridge]:
    domain, bus = _bus(gpu)
    return [
        b
        for b in bridges
        if _bus(b.bdf)[0] == domain and b.secondary <= bus <= b.subordinate and b.bdf != gpu
    ]


def acs_verdict(gpus: tuple[str, ...], bridges: tuple[Bridge, ...]) -> CheckResult:
    """Judged on the switch ports above the GPUs: Linux turns ACS on at root ports whenever
    the IOMMU is on, and peers under one switch never cross them (gpu.iommu judges that)."""
    switch = tuple(b for b in bridges if not b.root_port)
    above = {g: bridges_above(switch, g) for g in gpus}
    ports = {b.bdf: b for bs in above.values() for b in bs}
    redirecting = {
        bdf: [k for k in REDIRECTS if b.acs and b.acs.get(k)]
        for bdf, b in ports.items()
        if b.acs and any(b.acs.get(k) for k in REDIRECTS)
    }
    if redirecting:
        under = sorted(g for g, bs in above.items() if any(b.bdf in redirecting for b in bs))
        what = "; ".join(f"{bdf}: {'+ '.join(ks)}+" for bdf, ks in sorted(redirecting.items()))
        return CheckResult(
            "gpu.acs",
            "warn",
            f"PCIe ACS redirects peer-to-peer on the switch ports above GPUs {', '.join(under)} "
            f"({what}): their peer traffic goes up to the root complex, and NCCL's "
            "tensor-parallel exchange and cuda_ipc KV between them run slowly or hang",
            FIX_ACS,
        )
    if ports and all(b.denied for b in ports.values()):
        return CheckResult(
            "gpu.acs",
            "skip",
            f"ACS unread: lspci shows the capabilities of the {len(ports)} PCIe ports above "
            "the GPUs only to root",
            FIX_UNREAD,
        )
    read = sum(1 for b in ports.values() if not b.denied)
    return CheckResult(
        "gpu.acs",
        "pass",
        f"no ACS redirect on the {read} PCIe switch ports above the {len(gpus)} GPUs",
    )


def iommu_verdict(f: AcsFacts, gpus: tuple[str, ...]) -> CheckResult | None:
    if f.iommu_devices is None:
        return None  # not read (--only, or find failed otherwise)
    line = " ".join(f.cmdline) or "no IOMMU words"
    if not f.iommu_devices:
        return CheckResult("gpu.iommu", "pass", f"no IOMMU groups: the IOMMU is off ({line})")
    # the GPUs' groups; GPUs unread (no lspci): every group, so a translated one still shows
    groups = (
        {g: f.iommu_devices.get(g) for g in gpus}
        if gpus
        else {f"device {d}": n for d, n in f.iommu_devices.items()}
    )
    if f.iommu_types:
        translated = sorted(
            f"{g} (group {n}: {f.iommu_types[n]})"
            for g, n in groups.items()
            if n is not None and f.iommu_types.get(n) in TRANSLATED
        )
        if not translated:
            return CheckResult(
                "gpu.iommu", "pass", f"the GPUs' IOMMU groups are not translated ({line})"
            )
    else:  # no type files (before Linux 5.11): the command line says
        passthrough = {"iommu=pt", "iommu.passthrough=1", "iommu=off"} & set(f.cmdline)
        if passthrough:
            return CheckResult("gpu.iommu", "pass", f"IOMMU in passthrough ({line})")
        translated = [f"{g} (group {n})" for g, n in sorted(groups.items()) if n is not None]
        if not translated:
            return None
    return CheckResult(
        "gpu.iommu",
        "warn",
        f"the IOMMU translates the DMA of GPUs {', '.join(translated)} (kernel command "
        f"line: {line}): peer-to-peer between them goes through the IOMMU, slowly or not at "
        "all",
        FIX_IOMMU,
    )


def evaluate(ctx: HostContext, facts: HostFacts) -> list[CheckResult]:
    f, g = facts.gpu_acs, facts.gpu
    if f is None or g is None or not g.gpus:
        return []  # gpu.nvidia_smi already says why
    n = len(g.gpus)
    if n < 2:
        why = "one GPU on this host: no peer-to-peer inside it to judge"
        return [CheckResult("gpu.acs", "skip", why), CheckResult("gpu.iommu", "skip", why)]
    out: list[CheckResult] = []
    if f.bridges_section.rc is not None and f.bridges_section.rc != 0:
        out.append(
            CheckResult(
                "gpu.acs",
                "skip",
                f"lspci failed (exit {f.bridges_section.rc}): ACS unread: "
                + f.bridges_section.first_lines(1),
                "install pciutils (lspci) on the host",
            )
        )
    elif f.gpus and f.bridges is not None:
        out.append(acs_verdict(f.gpus, f.bridges))
    iommu = iommu_verdict(f, f.gpus or ())
    if iommu is not None:
        out.append(iommu)
    return out
