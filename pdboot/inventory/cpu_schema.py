"""The inventory's ``device`` and the models of ``device: cpu`` (the `cpu` section, a tier's
`cpus`). How the cores are laid out and the rules across fields: pdboot/inventory/cpu_layout.py.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pdboot.inventory.safety import check_index_groups
from pdboot.inventory.strict import Strict

MAX_CPU_INDEX = 4095  # the kernel's default NR_CPUS ceiling on x86_64 distributions

Device = Literal["cuda", "cpu"]
CpuCores = list[int] | list[list[int]]


def cores_distinct(v: CpuCores | None) -> CpuCores | None:
    """A tier's `cpus`: not empty, no empty list, no core twice, ids in range."""
    if v is None:
        return v
    check_index_groups(
        v,
        empty="list of CPU cores must not be empty (or leave cpus out)",
        group="core list",
        ids="CPU core ids",
        top=MAX_CPU_INDEX,
    )
    return v


class CpuSettings(Strict):
    """``device: cpu`` engines (vLLM's CPU backend; README "device: cpu")."""

    # Each engine's KV cache, GiB: VLLM_CPU_KVCACHE_SPACE, which vLLM parses as an integer
    # (vllm/envs.py); unset, vLLM takes 4.
    kv_cache_gib: int = Field(default=4, ge=1, le=65536)
    # Cores per engine, when a tier lists no `cpus`: a host's engines get consecutive
    # blocks of this many cores from core 0 (prefill engines first, then decode), bound by
    # VLLM_CPU_OMP_THREADS_BIND. None: vLLM's own binding, for one engine per host.
    cores_per_engine: int | None = Field(default=None, ge=1, le=MAX_CPU_INDEX + 1)
