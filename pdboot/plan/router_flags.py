"""The router's command-line pieces that more than the plan's builder reads (pure): the
cache_aware thresholds, and the worker-list flags its config hash leaves out (export
rebuilds the command without them too)."""

from __future__ import annotations

from collections.abc import Sequence

from pdboot.inventory.schema import Inventory


def cache_aware_flags(inv: Inventory, policies: tuple[str, str]) -> list[str]:
    """The router-wide cache_aware thresholds, only when a tier routes with cache_aware."""
    r = inv.router
    if "cache_aware" not in policies:
        return []
    return [
        "--cache-threshold",
        f"{r.cache_threshold:g}",
        "--balance-abs-threshold",
        str(r.balance_abs_threshold),
    ]


# The router flags that list its workers. With live workers the router ignores them (IGW mode
# starts with 0 workers; pdboot POSTs every engine), but its argument check refuses P/D mode
# without them; kept out of the config hash: the engine set alone never recreates it.
WORKER_FLAGS = ("--prefill", "--decode")


def without_workers(command: Sequence[str]) -> list[str]:
    """The router command less its worker lists (what its hash covers with live workers)."""
    out: list[str] = []
    skip = False
    for arg in command:
        if skip:
            skip = False
        elif arg in WORKER_FLAGS:
            skip = True
        else:
            out.append(arg)
    return out
