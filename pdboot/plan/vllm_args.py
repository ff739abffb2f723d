"""Engine arguments pdboot renders because vLLM 0.34's defaults moved (pure).

- ``--block-size``: one explicit size on both tiers (inventory/vllm_rules.py's
  ``block_size``). vLLM 0.34 moved the GPU default from 16 to 64, its push connector refuses
  different P/D sizes, and its pull connector with different sizes needs the router to
  forward ``remote_num_tokens``; a size left to each image's default would differ as soon as
  the tiers or the images differ.
- ``--gpu-memory-utilization 0.92`` on GPU engines: 0.33's default. 0.34's default is None,
  which means 1.0 whenever its extensible KV cache is on (all memory left after warmup goes to
  the KV cache: nothing else may share the GPU), else 0.92.
- ``--disable-extensible-kv-cache`` on GPU engines of 0.34 unless the tier asks for
  ``--enable-extensible-kv-cache``. vLLM 0.34 turns the cache on for NIXL with a cuda KV buffer
  only when the container can open an IMEX channel (``/dev/nvidia-caps-imex-channels``), since
  without one transfers within a host would lose NVLink; pdboot's containers get none, so for
  ``cuda`` it would be off anyway (with a log line saying so). With a ``cpu`` KV buffer vLLM
  turns it on regardless (the connector copies in process), which sizes the KV cache from the
  memory left after warmup and refuses non-compact VLLM_KV_CACHE_LAYOUTs. Off keeps both tiers
  sized the same way as under 0.33, whatever the host and buffer; operators who move KV only
  across hosts can pass --enable-extensible-kv-cache in extra_args.

And, for any release: one NIC per tensor-parallel rank (``nic_rank_env``).
"""

from __future__ import annotations

from collections.abc import Sequence

from pdboot.inventory.engines import EngineNic
from pdboot.inventory.schema import Inventory, Tier
from pdboot.inventory.vllm_rules import block_size, extensible_kv_cache, inventory_target
from pdboot.inventory.vllm_target import at_least

GPU_MEMORY_UTILIZATION = "0.92"  # vLLM 0.33's default, explicit since 0.34 has none
_GPU_MEMORY_FLAGS = ("--gpu-memory-utilization", "--device-memory-utilization")


def _given(args: Sequence[str], *flags: str) -> bool:
    for a in args:
        name = a.split("=", 1)[0]
        if name.startswith("--") and "--" + name[2:].replace("_", "-") in flags:
            return True
    return False


def version_args(inv: Inventory, tier: Tier) -> list[str]:
    """What an engine of ``tier`` gets before the tier's own extra_args. Nothing for a 0.33
    image: its defaults are the ones pdboot was built on (16-token blocks on GPUs, 0.92), and
    a deployment running 0.33 keeps its containers (their config hash) across pdboot's
    upgrade."""
    args = tier.extra_args
    out: list[str] = []
    if not at_least(inventory_target(inv).version, "0.34"):
        return out
    if not _given(args, "--block-size"):
        out += ["--block-size", str(block_size(inv))]
    if inv.device != "cuda":
        return out
    if not _given(args, *_GPU_MEMORY_FLAGS):
        out += ["--gpu-memory-utilization", GPU_MEMORY_UTILIZATION]
    off = "--disable-extensible-kv-cache"
    if not extensible_kv_cache(inv, tier) and not _given(args, off):
        out.append(off)
    return out


# vLLM's per-worker NIC choice (vllm/v1/executor/vllm_net_devices.py): each rank sets this
# variable to its own NIC's name plus the suffix
NIC_SELECTION_VARS = "UCX_NET_DEVICES:1"


def nic_rank_env(inv: Inventory, tier: Tier, rdma: bool, nic: EngineNic | None) -> dict[str, str]:
    """One NIC per TP rank: ``VLLM_GPU_NIC_PCIE_MAPPING`` (GPU=NIC PCI addresses, each GPU's
    own nearest ACTIVE HCA, preflight/checks/nic_ranks.py) and ``VLLM_NIC_SELECTION_VARS``,
    for an RDMA engine of TP > 1 whose mapping preflight could make. An explicit
    ``kv_transfer.ucx.net_devices`` wins (the operator's list for every rank)."""
    if not rdma or nic is None or not nic.pcie_map or tier.tensor_parallel_size < 2:
        return {}
    if inv.kv_transfer.ucx.net_devices:
        return {}
    return {
        "VLLM_GPU_NIC_PCIE_MAPPING": ",".join(f"{g}={n}" for g, n in nic.pcie_map),
        "VLLM_NIC_SELECTION_VARS": NIC_SELECTION_VARS,
    }


__all__ = ["GPU_MEMORY_UTILIZATION", "NIC_SELECTION_VARS", "nic_rank_env", "version_args"]
