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

And, for any release: one NIC per tensor-parallel rank (``nic_rank_env``), and
``--shutdown-timeout`` (``shutdown_args``) where the release's parser has it.

``--shutdown-timeout``: vLLM's default, 0, aborts every request in flight on SIGTERM; pdboot
gives each engine timeouts.drain_seconds (whole seconds: the parser takes an int) so a
stop (`down`, a roll, a blue/green switch) lets them finish. Whether the release has the flag
is read from its own `vllm serve` parser: the option list pdboot froze from that release's
parser (inventory/optionlists.py; 0.33 and 0.34 both have it), and after the pull the image's
parser judges the command (preflight/image_args.py). Docker's stop grace (``stop_grace_s``)
exceeds it by STOP_MARGIN_S, so Docker's SIGKILL never comes first. Neither is part of the
config hash (plan/build.py's ``_with_hash``): adding them must not replace every running
engine on the first `up` after pdboot's upgrade (for a tier of one, an outage).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pdboot.inventory.engines import EngineNic
from pdboot.inventory.optionlists import VLLM_SERVE_BY_VERSION
from pdboot.inventory.schema import Inventory, Tier
from pdboot.inventory.vllm_rules import block_size, extensible_kv_cache, inventory_target
from pdboot.inventory.vllm_target import at_least

GPU_MEMORY_UTILIZATION = "0.92"  # vLLM 0.33's default, explicit since 0.34 has none
_GPU_MEMORY_FLAGS = ("--gpu-memory-utilization", "--device-memory-utilization")
SHUTDOWN_TIMEOUT = "--shutdown-timeout"
STOP_MARGIN_S = 30  # Docker's grace beyond vLLM's own: its exit after the drain (workers, NIXL)
DEFAULT_STOP_GRACE_S = 30  # Docker's grace for what has no shutdown timeout (router, proxy)


def _given(args: Sequence[str], *flags: str) -> bool:
    for a in args:
        name = a.split("=", 1)[0]
        if name.startswith("--") and "--" + name[2:].replace("_", "-") in flags:
            return True
    return False


def version_args(inv: Inventory, tier: Tier) -> list[str]:
    """What an engine of ``tier`` gets before the tier's own extra_args: what 0.34's moved
    defaults need, then ``--shutdown-timeout`` (``shutdown_args``)."""
    return [*_moved_defaults(inv, tier), *shutdown_args(inv, tier)]


def _moved_defaults(inv: Inventory, tier: Tier) -> list[str]:
    """Nothing for a 0.33 image: its defaults are the ones pdboot was built on (16-token
    blocks on GPUs, 0.92), and a deployment running 0.33 keeps its containers (their config
    hash) across pdboot's upgrade."""
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


def shutdown_seconds(inv: Inventory) -> int:
    """timeouts.drain_seconds in whole seconds, rounded up (vLLM's parser takes an int)."""
    return math.ceil(inv.timeouts.drain_seconds)


def has_shutdown_timeout(inv: Inventory) -> bool:
    """Whether the targeted release's `vllm serve` parser has --shutdown-timeout."""
    return SHUTDOWN_TIMEOUT in VLLM_SERVE_BY_VERSION[inventory_target(inv).version]


def shutdown_args(inv: Inventory, tier: Tier) -> list[str]:
    """``--shutdown-timeout <drain_seconds>`` where the release has the flag and the tier's
    extra_args do not set it themselves."""
    if not has_shutdown_timeout(inv) or _given(tier.extra_args, SHUTDOWN_TIMEOUT):
        return []
    return [SHUTDOWN_TIMEOUT, str(shutdown_seconds(inv))]


def stop_grace_s(inv: Inventory) -> int:
    """Docker's SIGTERM-to-SIGKILL grace for an engine: beyond its --shutdown-timeout (the
    tier's own value when extra_args set one) by STOP_MARGIN_S."""
    longest = shutdown_seconds(inv)
    for _name, tier in inv.tiers():
        args = tier.extra_args
        for i, a in enumerate(args):
            name, eq, value = a.partition("=")
            if name.replace("_", "-") != SHUTDOWN_TIMEOUT:
                continue
            given = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            if given.isdigit():
                longest = max(longest, int(given))
    return longest + STOP_MARGIN_S


def without_shutdown_timeout(command: Sequence[str]) -> list[str]:
    """The command less ``--shutdown-timeout N`` (what the config hash is taken over)."""
    out = list(command)
    for i, a in enumerate(out[:-1]):
        if a == SHUTDOWN_TIMEOUT:
            return out[:i] + out[i + 2 :]
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


__all__ = [
    "DEFAULT_STOP_GRACE_S",
    "GPU_MEMORY_UTILIZATION",
    "NIC_SELECTION_VARS",
    "SHUTDOWN_TIMEOUT",
    "has_shutdown_timeout",
    "nic_rank_env",
    "shutdown_args",
    "stop_grace_s",
    "version_args",
    "without_shutdown_timeout",
]
