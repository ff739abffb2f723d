"""GPU <-> RDMA NIC distances from ``nvidia-smi topo -m``, and the nearest ACTIVE HCA port(s)
for a group of GPUs (an engine's ``UCX_NET_DEVICES``).

The matrix is read by column NAME, never by a fixed layout, because real outputs differ:
tabs or spaces; NICs as ``NIC<n>`` columns with a ``NIC Legend:`` (R470+) or named directly
(``mlx5_0``, older drivers); no NIC at all; ``CPU Affinity`` / ``NUMA Affinity`` /
``GPU NUMA ID`` present or not; ANSI underline codes around the header; NIC rows with
trailing empty cells or none. nvidia-smi also prints its own columns out of step: a GPU
row carries an extra empty cell between ``NUMA Affinity`` and ``GPU NUMA ID`` (tab output),
so the affinity values are taken in order from the non-empty cells after the link cells.

Nothing here raises on odd text: what could not be read goes into ``TopoFacts.notes``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pdboot.ansi import strip_ansi
from pdboot.inventory.engines import EngineNic, EngineSpec, tier_engines
from pdboot.preflight.checks import CheckResult, Command, HostContext, Section, nic_ranks
from pdboot.preflight.checks.rdma import Port

if TYPE_CHECKING:
    from pdboot.preflight.checks.facts import HostFacts

COMMAND = "nvidia-smi topo -m"

# nvidia-smi's PCIe distances, nearest first. SOC is the pre-R384 name of SYS.
RANK: dict[str, int] = {"PIX": 0, "PXB": 1, "PHB": 2, "NODE": 3, "SYS": 4, "SOC": 4}
FAR = "SYS"

_HEAD_TOKEN_RE = re.compile(r"CPU\s+Affinity|NUMA\s+Affinity|GPU\s+NUMA\s+ID|\S+")
_LINK_RE = re.compile(r"X|PIX|PXB|PHB|NODE|SYS|SOC|NV\d+|N/A")
_GPU_RE = re.compile(r"GPU(\d+)")
_NIC_RE = re.compile(r"NIC\d+")
_LEGEND_RE = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_NAME_RE = re.compile(r"[A-Za-z][\w.:-]*")  # an RDMA device named in the old format
AFFINITY = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


def commands(ctx: HostContext) -> list[Command]:
    if not ctx.gpus_here:
        return []
    out = [Command("topo", COMMAND, "rdma", also_for=("gpu",))]
    if ctx.rdma_mode != "off":  # PCI addresses for one NIC per TP rank (nic_ranks.py)
        out.append(Command("pci", nic_ranks.COMMAND, "rdma"))
    return out


# --------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class TopoGpu:
    index: int  # as nvidia-smi numbers it on the host (GPU<index>)
    cpu_affinity: str | None = None  # "0-31,64-95"; None when absent or N/A
    numa_affinity: str | None = None
    gpu_numa_id: str | None = None


@dataclass(frozen=True)
class TopoNic:
    label: str  # the matrix's name for it: NIC0, or mlx5_0 in the old format
    device: str | None  # the RDMA device (mlx5_0, mlx5_bond_0); None: not in the NIC Legend


@dataclass(frozen=True)
class TopoFacts:
    gpus: tuple[TopoGpu, ...] = ()
    nics: tuple[TopoNic, ...] = ()
    # (row label, column label) -> cell as printed: X, PIX, PXB, PHB, NODE, SYS, SOC, NV<n>, N/A
    cells: Mapping[tuple[str, str], str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # what could not be read, in words
    # PCI addresses (nic_ranks.COMMAND): GPU index -> BDF, RDMA device -> BDF
    gpu_bdf: Mapping[int, str] = field(default_factory=dict)
    nic_bdf: Mapping[str, str] = field(default_factory=dict)

    def gpu(self, index: int) -> TopoGpu | None:
        return next((g for g in self.gpus if g.index == index), None)

    def nic(self, device: str) -> TopoNic | None:
        return next((n for n in self.nics if n.device == device), None)

    def link(self, gpu: int, device: str) -> str | None:
        """The GPU's cell for the device's NIC (its own row first, else the NIC's row)."""
        nic = self.nic(device)
        if nic is None:
            return None
        label = f"GPU{gpu}"
        return self.cells.get((label, nic.label)) or self.cells.get((nic.label, label))


def rank(link: str | None) -> int | None:
    """0 (PIX, nearest) .. 4 (SYS); None for X, NV#, N/A and anything unread."""
    return RANK.get(link) if link else None


# --------------------------------------------------------------------------- parser


def parse_matrix(text: str) -> TopoFacts:
    """Facts from the text of ``nvidia-smi topo -m``. Never raises."""
    lines = [strip_ansi(ln).rstrip("\r\n") for ln in text.splitlines()]
    head_at = next((i for i, ln in enumerate(lines) if _is_header(ln)), None)
    if head_at is None:
        first = next((ln.strip() for ln in lines if ln.strip()), "")
        why = f"first line: {first[:120]!r}" if first else "empty output"
        return TopoFacts(notes=(f"no topology matrix found ({why})",))
    columns = _HEAD_TOKEN_RE.findall(lines[head_at])
    links = [_norm_head(c) for c in columns if _norm_head(c) not in AFFINITY]
    affinity = [_norm_head(c) for c in columns if _norm_head(c) in AFFINITY]
    notes: list[str] = []
    legend = _legend(lines[head_at + 1 :])
    cells: dict[tuple[str, str], str] = {}
    gpus: list[TopoGpu] = []
    for ln in lines[head_at + 1 :]:
        if not ln.strip() or ln.strip().startswith("Legend"):
            break
        row = _row(ln, links, affinity, cells, notes)
        if row is not None and any(g.index == row.index for g in gpus):
            notes.append(f"row GPU{row.index} repeated: the first kept")
        elif row is not None:
            gpus.append(row)
    nics = _nics(links, legend, notes)
    seen = {g.index for g in gpus}
    for c in links:
        m = _GPU_RE.fullmatch(c)
        if m and int(m.group(1)) not in seen:
            notes.append(f"column {c} has no row")
            gpus.append(TopoGpu(int(m.group(1))))
    return TopoFacts(tuple(sorted(gpus, key=lambda g: g.index)), nics, cells, tuple(notes))


def _norm_head(token: str) -> str:
    return " ".join(token.split())


def _is_header(line: str) -> bool:
    if line.lstrip().startswith("#"):
        return False
    tokens = _HEAD_TOKEN_RE.findall(line)
    return (
        bool(tokens)
        and bool(_GPU_RE.fullmatch(tokens[0]))
        and not any(_LINK_RE.fullmatch(t) for t in tokens)
    )


def _legend(lines: Iterable[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    in_legend = False
    for ln in lines:
        if ln.strip().startswith("NIC Legend"):
            in_legend = True
        elif in_legend and (m := _LEGEND_RE.match(ln)):
            out[m.group(1)] = m.group(2)
    return out


def _row(
    line: str,
    links: Sequence[str],
    affinity: Sequence[str],
    cells: dict[tuple[str, str], str],
    notes: list[str],
) -> TopoGpu | None:
    """Record one matrix row's cells; a GPU row also gives its TopoGpu."""
    parts = [p.strip() for p in line.split("\t")] if "\t" in line else line.split()
    label, values = parts[0], parts[1:]
    if label not in links:
        notes.append(f"row {label!r} is not a column of the header: ignored")
        return None
    if len(values) < len(links):
        notes.append(f"row {label}: {len(values)} of {len(links)} link cells")
    for col, value in zip(links, values, strict=False):
        if _LINK_RE.fullmatch(value):
            cells[(label, col)] = value
        else:
            notes.append(f"row {label}, column {col}: unreadable cell {value!r}")
    m = _GPU_RE.fullmatch(label)
    if not m:
        return None
    rest = [v for v in values[len(links) :] if v]
    if len(rest) > len(affinity):
        notes.append(f"row {label}: {len(rest) - len(affinity)} cell(s) past the last column")
    got = dict(zip(affinity, rest, strict=False))
    return TopoGpu(
        int(m.group(1)),
        _value(got.get("CPU Affinity")),
        _value(got.get("NUMA Affinity")),
        _value(got.get("GPU NUMA ID")),
    )


def _value(cell: str | None) -> str | None:
    return None if cell is None or cell.upper() == "N/A" else cell


def _nics(links: Sequence[str], legend: Mapping[str, str], notes: list[str]) -> tuple[TopoNic, ...]:
    out: list[TopoNic] = []
    for c in links:
        if _GPU_RE.fullmatch(c):
            continue
        if _NIC_RE.fullmatch(c):
            if c not in legend:
                notes.append(f"{c} is not in the NIC Legend: its device is unknown")
            out.append(TopoNic(c, legend.get(c)))
        elif _NAME_RE.fullmatch(c):
            out.append(TopoNic(c, c))  # old format: the device names itself
        else:
            notes.append(f"column {c!r} is neither a GPU nor a NIC: ignored")
    return tuple(out)


def facts(s: Mapping[str, Section]) -> TopoFacts:
    sec = s.get("topo")
    if sec is None or sec.rc is None:
        return TopoFacts(notes=("nvidia-smi topo -m did not finish",))
    f = parse_matrix(sec.output)
    pci = s.get("pci")
    if pci is not None and pci.rc is not None:
        gpu_bdf, nic_bdf = nic_ranks.parse(pci.output)
        f = dataclasses.replace(f, gpu_bdf=gpu_bdf, nic_bdf=nic_bdf)
    if sec.rc != 0:
        return dataclasses.replace(f, notes=(*f.notes, f"nvidia-smi topo -m exit {sec.rc}"))
    return f


# --------------------------------------------------------------------------- the choice


@dataclass(frozen=True)
class NicChoice:
    """The nearest ACTIVE HCA port(s) for a group of GPUs.

    ``ports`` are ``device:port`` names (UCX_NET_DEVICES' form), empty when nothing could be
    chosen (then ``reason`` says why). ``link`` is the group's distance to them.
    """

    ports: tuple[str, ...]
    link: str | None
    reason: str = ""

    @property
    def across_socket(self) -> bool:
        """The nearest ACTIVE NIC is across the CPU socket: KV traffic crosses QPI/UPI."""
        return self.link is not None and rank(self.link) == RANK[FAR]


def active_port(name: str) -> Port:
    """``mlx5_0:1`` (UCX's form; ``mlx5_0`` means port 1) as an ACTIVE Port."""
    dev, _, num = name.strip().partition(":")
    return Port(dev, int(num) if num.isdigit() else 1, "ACTIVE")


def choose(topo: TopoFacts, gpus: Sequence[int], ports: Iterable[Port | str]) -> NicChoice:
    """The ACTIVE port(s) nearest the GPU group (PIX < PXB < PHB < NODE < SYS).

    Group rule: a NIC's distance to the group is its distance to the group's FARTHEST GPU
    (every TP rank moves its own KV slice through UCX_NET_DEVICES, so the slowest path
    bounds the transfer); the NIC(s) with the smallest such distance win, ties give all
    of them, with every ACTIVE port of each. NICs with an unknown distance to some GPU of
    the group (unread cell, NV#) are left out. Ports not ACTIVE are never chosen; a port
    given by name (``mlx5_0:1``) is taken as ACTIVE.
    """
    if not gpus:
        return NicChoice((), None, "no GPU given")
    missing = [g for g in gpus if topo.gpu(g) is None]
    if missing:
        return NicChoice((), None, f"GPU {', '.join(map(str, missing))} not in nvidia-smi topo -m")
    active = [p for p in (active_port(x) if isinstance(x, str) else x for x in ports) if p.active]
    if not active:
        return NicChoice((), None, "no ACTIVE HCA port")
    by_dev: dict[str, list[Port]] = {}
    for p in active:
        by_dev.setdefault(p.device, []).append(p)
    dist: dict[str, int] = {}
    for dev in by_dev:
        ranks = [rank(topo.link(g, dev)) for g in gpus]
        if all(r is not None for r in ranks):
            dist[dev] = max(r for r in ranks if r is not None)
    if not dist:
        return NicChoice((), None, _why_unplaced(topo, by_dev))
    best = min(dist.values())
    chosen = [
        f"{p.device}:{p.port}"
        for d in sorted(by_dev, key=_natural)
        if dist.get(d) == best
        for p in sorted(by_dev[d], key=lambda p: p.port)
    ]
    link = next(k for k, v in RANK.items() if v == best)
    return NicChoice(tuple(chosen), link)


def _natural(name: str) -> list[int | str]:
    """mlx5_2 before mlx5_10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _why_unplaced(topo: TopoFacts, by_dev: Mapping[str, list[Port]]) -> str:
    known = sorted((n.device for n in topo.nics if n.device), key=_natural)
    return (
        f"no distance known between the GPUs and the ACTIVE HCA(s) "
        f"{', '.join(sorted(by_dev, key=_natural))} "
        f"(nvidia-smi topo -m lists {', '.join(known) or 'no NIC'})"
    )


def ucx_net_devices(choice: NicChoice, explicit: str | None) -> str | None:
    """The engine's UCX_NET_DEVICES: an explicit ``kv_transfer.ucx.net_devices`` wins (even
    ``all``); else the chosen ports; None leaves UCX to pick (nothing could be chosen)."""
    if explicit:
        return explicit
    return ",".join(choice.ports) or None


# --------------------------------------------------------------------------- the area


def parse(ctx: HostContext, s: Mapping[str, Section]) -> TopoFacts | None:
    return facts(s) if ctx.gpus_here else None


def gpu_count(f: HostFacts) -> int | None:
    """How many GPUs preflight found (for `engines_per_host: all`); None: unknown."""
    gpus = f.gpu.gpus if f.gpu is not None else ()
    return len(gpus) or None


def host_engines(ctx: HostContext, f: HostFacts) -> list[EngineSpec]:
    """The engines of the host, with ``engines_per_host: all`` resolved from the facts."""
    count = gpu_count(f)
    return [e for role, t in ctx.tiers for e in tier_engines(role, t, ctx.name, count)]


def _candidates(ctx: HostContext, f: HostFacts) -> list[Port | str] | None:
    """The HCA ports to choose among: the declared devices, else what RDMA facts list;
    None where RDMA is not in use here."""
    if ctx.rdma_mode == "off":
        return None
    if ctx.rdma_devices:
        return list(ctx.rdma_devices)
    r = f.rdma
    if r is None or not r.checked or not r.usable:
        return None
    return list(r.ports)


def engine_choices(ctx: HostContext, f: HostFacts) -> list[tuple[EngineSpec, NicChoice]]:
    """Each engine of the host and the ACTIVE port(s) nearest its GPUs ([] where RDMA is
    not in use or the inventory names the devices)."""
    ports = _candidates(ctx, f)
    if ports is None or ctx.ucx_net_devices or f.topo is None:
        return []
    topo = f.topo
    out = []
    for e in host_engines(ctx, f):
        gpus = [g.index for g in topo.gpus] if e.gpus == "all" else list(e.gpus)
        out.append((e, choose(topo, gpus, ports)))
    return out


def engine_nics(ctx: HostContext, f: HostFacts) -> dict[str, EngineNic]:
    """Engine name -> its chosen port(s), for the plan and the record on the host."""
    out = {}
    ports = _candidates(ctx, f)
    for e, c in engine_choices(ctx, f):
        if c.ports and f.topo is not None:
            gpus = tuple(g.index for g in f.topo.gpus) if e.gpus == "all" else e.gpus
            per_gpu = {g: choose(f.topo, [g], ports).ports for g in gpus} if ports else {}
            pcie = nic_ranks.pairs(per_gpu, f.topo.gpu_bdf, f.topo.nic_bdf, gpus)
            out[e.name] = EngineNic(c.ports, c.link, gpus, pcie)
    return out


def evaluate(ctx: HostContext, f: HostFacts) -> list[CheckResult]:
    if f.topo is None:
        return []
    return [_topology(f.topo), *_affinity(ctx, f)]


def _topology(t: TopoFacts) -> CheckResult:
    if not t.gpus:
        return CheckResult(
            "gpu.topology",
            "warn",
            "nvidia-smi topo -m gave no matrix: " + "; ".join(t.notes[:3]),
            "engines get every ACTIVE port (UCX_NET_DEVICES) instead of their nearest",
        )
    nics = ", ".join(n.device or n.label for n in t.nics) or "no NIC"
    msg = f"{len(t.gpus)} GPU(s), {nics}"
    if t.notes:
        return CheckResult(
            "gpu.topology",
            "warn",
            msg + "; could not read: " + "; ".join(t.notes[:4]),
            "the unread parts are left out of the nearest-NIC choice",
        )
    return CheckResult("gpu.topology", "pass", msg)


def _affinity(ctx: HostContext, f: HostFacts) -> list[CheckResult]:
    if ctx.ucx_net_devices and _candidates(ctx, f) is not None:
        return [
            CheckResult(
                "rdma.nic_affinity",
                "pass",
                f"explicit: every engine uses {ctx.ucx_net_devices} (kv_transfer.ucx.net_devices)",
            )
        ]
    out = []
    for e, c in engine_choices(ctx, f):
        on = "all GPUs" if e.gpus == "all" else "GPUs " + ",".join(map(str, e.gpus))
        if not c.ports:
            out.append(
                CheckResult(
                    "rdma.nic_affinity",
                    "warn",
                    f"{e.key}: {on}: no nearest NIC ({c.reason}); UCX picks by itself",
                    "check nvidia-smi topo -m and the HCA ports",
                )
            )
        elif c.across_socket:
            out.append(
                CheckResult(
                    "rdma.nic_affinity",
                    "warn",
                    f"{e.key}: {on} -> {','.join(c.ports)} ({c.link}): the nearest ACTIVE NIC "
                    "is across the CPU socket; KV traffic crosses the CPU interconnect",
                    "bring up a port next to these GPUs, or give the engine GPUs near an "
                    "ACTIVE NIC (the tier's gpus groups)",
                )
            )
        else:
            out.append(
                CheckResult(
                    "rdma.nic_affinity", "pass", f"{e.key}: {on} -> {','.join(c.ports)} ({c.link})"
                )
            )
    return out
