"""GPU checks: driver, CUDA, model and compute capability, count, free memory, MIG, ECC.

Fields come from ``--query-gpu ... --format=csv,noheader,nounits``: the table truncates
names ("NVIDIA RTX PRO 6000 Blac...") and renames its header from R610 on. The driver is
judged by the kernel module's version, never by the "CUDA Version" line, which a
forward-compat library inside a container can raise (570 driver printing CUDA 13.0).
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
    na,
    unparsed,
    version_tuple,
)
from pdboot.preflight.checks.owners import OwnerFacts, holder

if TYPE_CHECKING:
    from pdboot.preflight.checks.facts import HostFacts

QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "driver_version",
    "memory.total",
    "memory.used",
    "memory.free",
    "compute_cap",
    "mig.mode.current",
    "ecc.errors.uncorrected.volatile.total",
)
QUERY = f"nvidia-smi --query-gpu={','.join(QUERY_FIELDS)} --format=csv,noheader,nounits"
APPS = (
    "nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory "
    "--format=csv,noheader,nounits"
)
VERSION = "nvidia-smi --version"
KMOD = "cat /proc/driver/nvidia/version"


def commands(ctx: HostContext) -> list[Command]:
    if not ctx.gpus_here:
        return []
    return [
        Command("kmod", KMOD, "gpu", also_for=("docker",)),
        Command("query", QUERY, "gpu", also_for=("docker", "model")),
        Command("apps", APPS, "gpu"),
        Command("version", VERSION, "gpu"),
    ]


# --------------------------------------------------------------------------- parsers


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    driver: str
    mem_total_mib: int
    mem_used_mib: int | None
    mem_free_mib: int | None
    compute_cap: str
    mig: str  # Enabled / Disabled / N/A
    ecc_uncorrected: int | None  # None: not supported (ECC off, workstation boards)


@dataclass(frozen=True)
class App:
    gpu_uuid: str
    pid: int
    name: str
    used_mib: int | None


_UNIT_RE = re.compile(r"\s*(MiB|W|MHz|%)$")


def _csv_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in ln.split(", ")] for ln in text.splitlines() if ln.strip()]


def _int(v: str) -> int | None:
    v = _UNIT_RE.sub("", v.strip())
    if na(v):
        return None
    if not v.isdigit():
        raise ParseError(f"not a number: {v!r}")
    return int(v)


def parse_query(text: str, fields: tuple[str, ...] = QUERY_FIELDS) -> list[Gpu]:
    """CSV from --query-gpu, with or without the header line and units."""
    rows = _csv_rows(text)
    if not rows:
        raise ParseError("no GPU rows")
    names = list(fields)
    if rows[0] and rows[0][0] == "index":  # a header: take the field names from it
        names = [re.sub(r"\s*\[.*\]$", "", h) for h in rows[0]]
        rows = rows[1:]
    gpus = []
    for row in rows:
        if len(row) != len(names):
            raise ParseError(f"expected {len(names)} fields, got {len(row)}: {', '.join(row)}")
        f = dict(zip(names, row, strict=True))
        if "index" not in f:
            raise ParseError("field 'index' missing")
        idx = _int(f["index"])
        total = _int(f.get("memory.total", "0"))
        if idx is None or total is None:
            raise ParseError("index or memory.total missing")
        gpus.append(
            Gpu(
                index=idx,
                name=f.get("name", ""),
                uuid=f.get("uuid", ""),
                driver=f.get("driver_version", ""),
                mem_total_mib=total,
                mem_used_mib=_int(f.get("memory.used", "N/A")),
                mem_free_mib=_int(f.get("memory.free", "N/A")),
                compute_cap=f.get("compute_cap", ""),
                mig=f.get("mig.mode.current", "N/A").strip("[]"),
                ecc_uncorrected=_int(f.get("ecc.errors.uncorrected.volatile.total", "N/A")),
            )
        )
    return gpus


def parse_apps(text: str) -> list[App]:
    apps = []
    for row in _csv_rows(text):
        if row[0] in ("gpu_uuid", "pid"):  # header
            continue
        if len(row) != 4:
            raise ParseError(f"expected 4 fields: {', '.join(row)}")
        pid = _int(row[1])
        if pid is None:
            raise ParseError(f"no pid: {', '.join(row)}")
        apps.append(App(row[0], pid, row[2], _int(row[3])))
    return apps


_DRIVER_RE = re.compile(r"(?:DRIVER version|Driver Version|KMD Version)\s*:\s*([\d.]+)", re.I)
_CUDA_RE = re.compile(r"CUDA (?:UMD )?Version\s*:\s*([\d.]+)", re.I)
_KMOD_RE = re.compile(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s")


def parse_versions(text: str) -> tuple[str | None, str | None]:
    """(driver, cuda) from `nvidia-smi --version` or the table header (both R5xx and the
    R610 'KMD Version' / 'CUDA UMD Version' spellings)."""
    d = _DRIVER_RE.search(text)
    c = _CUDA_RE.search(text)
    return (d.group(1) if d else None, c.group(1) if c else None)


def parse_kmod(text: str) -> str | None:
    """The kernel module's version from /proc/driver/nvidia/version."""
    m = _KMOD_RE.search(text)
    return m.group(1) if m else None


# --------------------------------------------------------------------------- verdicts

FIX_DRIVER = (
    "install an R580+ NVIDIA driver (e.g. the distribution's nvidia-driver-580-open or the "
    "CUDA repo's cuda-drivers), then reboot"
)


def _fail(id_: str, msg: str, fix: str) -> CheckResult:
    return CheckResult(id_, "fail", msg, fix)


@dataclass(frozen=True)
class GpuFacts:
    """What the GPU commands said. The raw sections are kept for the failure messages."""

    query: Section  # nvidia-smi --query-gpu
    gpus: tuple[Gpu, ...] = ()  # empty when the query failed or did not parse
    query_error: str | None = None  # the query ran (exit 0) but did not parse
    driver: str | None = None  # the kernel module's version, else nvidia-smi's; None: no GPUs
    cuda: str | None = None  # the CUDA version the driver supports
    version: Section = MISSING  # nvidia-smi --version
    apps: tuple[App, ...] | None = ()  # processes holding GPU memory; None: did not parse
    apps_section: Section = MISSING


def parse(ctx: HostContext, s: Mapping[str, Section]) -> GpuFacts | None:
    if not ctx.gpus_here:
        return None
    q = s["query"]
    gpus: list[Gpu] = []
    error = None
    if q.rc == 0:
        try:
            gpus = parse_query(q.output)
        except ParseError as e:
            error = str(e)
    apps: tuple[App, ...] | None = ()
    if s["apps"].rc == 0:
        try:
            apps = tuple(parse_apps(s["apps"].output))
        except ParseError:
            apps = None
    return GpuFacts(
        query=q,
        gpus=tuple(gpus),
        query_error=error,
        driver=driver_version(gpus, s) if gpus else None,
        cuda=parse_versions(s["version"].output)[1],
        version=s["version"],
        apps=apps,
        apps_section=s["apps"],
    )


def evaluate(ctx: HostContext, facts: HostFacts) -> list[CheckResult]:
    f = facts.gpu
    if f is None:
        return []
    q = f.query
    if q.rc == 127 or "command not found" in q.output or "No such file" in q.output:
        return [
            _fail(
                "gpu.nvidia_smi",
                "nvidia-smi not found: no NVIDIA driver installed",
                FIX_DRIVER,
            )
        ]
    if q.rc != 0:
        msg = q.first_lines(2)
        if "couldn't communicate with the NVIDIA driver" in q.output:
            msg = "nvidia-smi cannot talk to the NVIDIA driver (module not loaded?): " + msg
        return [_fail("gpu.nvidia_smi", f"nvidia-smi failed (exit {q.rc}): {msg}", FIX_DRIVER)]
    if f.query_error is not None:
        return [unparsed("gpu.nvidia_smi", q, f"nvidia-smi --query-gpu ({f.query_error})")]
    gpus = list(f.gpus)
    return [
        CheckResult("gpu.nvidia_smi", "pass", f"nvidia-smi sees {len(gpus)} GPU(s)"),
        _driver(ctx, f),
        _cuda(ctx, f),
        *_model(ctx, gpus),
        _count(ctx, gpus),
        _memory(ctx, gpus, f, facts.owners),
        _mig(gpus),
        _ecc(gpus),
    ]


def driver_version(gpus: list[Gpu], s: Mapping[str, Section]) -> str | None:
    kmod = parse_kmod(s["kmod"].output) if s["kmod"].rc == 0 else None
    return kmod or (gpus[0].driver if gpus and not na(gpus[0].driver) else None)


def _driver(ctx: HostContext, f: GpuFacts) -> CheckResult:
    drv = f.driver
    if drv is None:
        return unparsed("gpu.driver", f.query, "the driver version")
    try:
        ok = version_tuple(drv) >= version_tuple(ctx.req.min_driver)
    except Exception:
        return unparsed("gpu.driver", Section(drv, 0), "the driver version")
    if ok:
        return CheckResult("gpu.driver", "pass", f"driver {drv} (>= {ctx.req.min_driver})")
    return _fail(
        "gpu.driver",
        f"driver {drv} is older than {ctx.req.min_driver}: CUDA {ctx.req.cuda} images "
        "will not start",
        FIX_DRIVER,
    )


def _cuda(ctx: HostContext, f: GpuFacts) -> CheckResult:
    cuda = f.cuda
    if cuda is None:
        return CheckResult(
            "gpu.cuda", "warn", f"CUDA version not reported: {f.version.first_lines(2)}"
        )
    try:
        ok = version_tuple(cuda) >= version_tuple(ctx.req.cuda)
    except ParseError:
        return unparsed("gpu.cuda", f.version, "the CUDA version")
    if ok:
        return CheckResult("gpu.cuda", "pass", f"driver supports CUDA {cuda}")
    return _fail(
        "gpu.cuda",
        f"driver supports CUDA {cuda}, the image needs {ctx.req.cuda}",
        FIX_DRIVER,
    )


def _selected(ctx: HostContext, gpus: list[Gpu]) -> list[Gpu]:
    want: set[int] = set()
    for need in ctx.gpu_needs:
        if need.gpus == "all":
            return gpus
        want |= set(need.gpus)
    return [g for g in gpus if g.index in want]


def _model(ctx: HostContext, gpus: list[Gpu]) -> list[CheckResult]:
    sel = _selected(ctx, gpus) or gpus
    names = sorted({g.name for g in sel})
    caps = sorted({g.compute_cap for g in sel})
    out = []
    if all(ctx.req.gpu_name.lower() in n.lower() for n in names):
        out.append(CheckResult("gpu.model", "pass", f"{', '.join(names)}"))
    else:
        out.append(
            CheckResult(
                "gpu.model",
                "warn",
                f"{', '.join(names)} is not a {ctx.req.gpu_name} (requirements.gpu_name)",
                "use the intended hosts, or set requirements.gpu_name if this GPU is intended",
            )
        )
    if caps == [ctx.req.compute_capability]:
        arch = architecture(caps[0])
        msg = f"compute capability {caps[0]}" + (f" ({arch})" if arch else "")
        out.append(CheckResult("gpu.compute_cap", "pass", msg))
    else:
        out.append(_other_architecture(ctx, names, caps))
    return out


# Compute capability -> architecture, from NVIDIA's CUDA GPUs table
# (developer.nvidia.com/cuda-gpus): 12.0 is SM120, the RTX PRO 6000 Blackwell and RTX 50
# boards pdboot is made for; 10.0 is the data-centre Blackwell (B200, GB200).
ARCHITECTURES = {
    "7.0": "Volta",
    "7.5": "Turing",
    "8.0": "Ampere",
    "8.6": "Ampere",
    "8.7": "Ampere",
    "8.9": "Ada Lovelace",
    "9.0": "Hopper",
    "10.0": "Blackwell",
    "10.3": "Blackwell",
    "11.0": "Blackwell",
    "12.0": "Blackwell",
    "12.1": "Blackwell",
}


def architecture(cap: str) -> str:
    return ARCHITECTURES.get(cap, "")


def _sm(cap: str) -> str:
    return "sm_" + cap.replace(".", "")


def _other_architecture(ctx: HostContext, names: list[str], caps: list[str]) -> CheckResult:
    """A GPU of another architecture than requirements.compute_capability names: say which,
    in so many words (an H100 or H200 is Hopper, 9.0, not Blackwell), and both ways out."""
    want = ctx.req.compute_capability
    want_arch = architecture(want)
    have = ", ".join(
        f"{c} ({architecture(c)}, {_sm(c)})" if architecture(c) else f"{c} ({_sm(c)})" for c in caps
    )
    archs = {architecture(c) for c in caps}
    verdict = f", not {want_arch}" if want_arch and want_arch not in archs and all(archs) else ""
    wanted = f"{want} ({want_arch}, {_sm(want)})" if want_arch else want
    name = names[0].removeprefix("NVIDIA ") if len(names) == 1 else "<nvidia-smi name>"
    return CheckResult(
        "gpu.compute_cap",
        "warn",
        f"{', '.join(names)}: compute capability {have}{verdict}; "
        f"requirements.compute_capability is {wanted}, which the image's kernels and CUDA "
        "arch list were chosen for",
        f"run on {want_arch or want} hosts ({ctx.req.gpu_name}); to use these GPUs on purpose, "
        f"set requirements: {{gpu_name: '{name}', compute_capability: '{caps[0]}'}} and an "
        f"image built for {_sm(caps[0])}",
    )


def _count(ctx: HostContext, gpus: list[Gpu]) -> CheckResult:
    have = {g.index for g in gpus}
    problems = []
    need_total = 0
    for need in ctx.gpu_needs:
        if need.gpus == "all":
            need_total += need.tensor_parallel_size
            if len(gpus) < need.tensor_parallel_size:
                problems.append(
                    f"{need.tier} needs {need.tensor_parallel_size} GPU(s) (tensor_parallel_size)"
                )
        else:
            need_total += len(need.gpus)
            missing = sorted(set(need.gpus) - have)
            if missing:
                problems.append(
                    f"{need.engine or need.tier} selects GPU(s) {missing} which do not exist"
                )
    if need_total > len(gpus) and not problems:
        problems.append(f"the tiers on this host need {need_total} GPUs together")
    if problems:
        return _fail(
            "gpu.count",
            f"{len(gpus)} GPU(s) present; " + "; ".join(problems),
            "lower tensor_parallel_size, fix the tier's gpus list, or use a host with more GPUs",
        )
    return CheckResult("gpu.count", "pass", f"{len(gpus)} GPU(s), {need_total} needed")


def _memory(
    ctx: HostContext, gpus: list[Gpu], f: GpuFacts, owners: OwnerFacts | None
) -> CheckResult:
    """Free memory on the GPUs the engines here use. What this deployment's own engines
    hold is theirs: a kept engine goes on using it, a replaced one frees it before its
    successor starts (`up` recreates before it creates). Only other processes count."""
    sel = _selected(ctx, gpus) or gpus
    apps = f.apps
    if apps is None:
        return unparsed("gpu.memory_free", f.apps_section, "--query-compute-apps")
    uuids = {g.uuid for g in sel}
    on_sel = [a for a in apps if a.gpu_uuid in uuids or not a.gpu_uuid]
    held_mib: dict[str, int] = {}  # GPU uuid -> MiB this deployment's engines hold
    own: dict[str, list[str]] = {}  # holder, in words -> "GPU 0: 88098 MiB", ...
    index = {g.uuid: g.index for g in gpus}
    busy = []
    for a in on_sel:
        c = owners.container_of(a.pid) if owners is not None else None
        if c is None:
            busy.append(a)
            continue
        held_mib[a.gpu_uuid] = held_mib.get(a.gpu_uuid, 0) + (a.used_mib or 0)
        mib = "?" if a.used_mib is None else str(a.used_mib)
        own.setdefault(holder(ctx, c), []).append(f"GPU {index.get(a.gpu_uuid, '?')}: {mib} MiB")
    low = [
        g
        for g in sel
        if g.mem_used_mib is not None
        and g.mem_used_mib - held_mib.get(g.uuid, 0) > max(1024, g.mem_total_mib // 20)
    ]
    if busy:
        procs = "; ".join(
            f"pid {a.pid} ({a.name}) uses {a.used_mib if a.used_mib is not None else '?'} MiB"
            for a in busy
        )
        return CheckResult(
            "gpu.memory_free",
            "warn",
            f"another process holds GPU memory: {procs}",
            "stop those processes, or vLLM's --gpu-memory-utilization will not find the "
            "memory it expects",
        )
    if low:
        used = ", ".join(f"GPU {g.index}: {g.mem_used_mib}/{g.mem_total_mib} MiB used" for g in low)
        return CheckResult(
            "gpu.memory_free",
            "warn",
            f"memory in use with no process listed: {used}",
            "check for processes in other containers or a stuck context",
        )
    free = ", ".join(
        f"GPU {g.index}: {g.mem_free_mib if g.mem_free_mib is not None else '?'}"
        f"/{g.mem_total_mib} MiB free"
        for g in sel
    )
    for who, rows in own.items():
        free += f"; held by this deployment: {who} ({', '.join(rows)})"
    return CheckResult("gpu.memory_free", "pass", free)


def _mig(gpus: list[Gpu]) -> CheckResult:
    on = [g.index for g in gpus if g.mig.lower() == "enabled"]
    if on:
        return _fail(
            "gpu.mig",
            f"MIG enabled on GPU(s) {on}: vLLM would see only a slice of each GPU",
            "sudo nvidia-smi -i <index> -mig 0 (then reset the GPU or reboot)",
        )
    return CheckResult("gpu.mig", "pass", "MIG disabled or not supported")


def _ecc(gpus: list[Gpu]) -> CheckResult:
    bad = [(g.index, g.ecc_uncorrected) for g in gpus if g.ecc_uncorrected]
    if bad:
        return _fail(
            "gpu.ecc",
            "uncorrected ECC errors: " + ", ".join(f"GPU {i}: {n}" for i, n in bad),
            "drain the host; reset the GPU (nvidia-smi -r) and check `nvidia-smi -q -d ECC`",
        )
    if all(g.ecc_uncorrected is None for g in gpus):
        return CheckResult("gpu.ecc", "pass", "ECC off or not reported")
    return CheckResult("gpu.ecc", "pass", "no uncorrected ECC errors")
