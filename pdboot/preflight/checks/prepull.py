"""The checks preflight adds from what it knows without a host's output: the registry
lookups (``images``) and the inventory itself (``agreement``). One entry point so
preflight/run.py needs a single hook line."""

from __future__ import annotations

from collections.abc import Mapping

from pdboot.inventory.schema import Inventory
from pdboot.preflight.checks import CheckResult, HostContext, agreement, images
from pdboot.preflight.registry import Lookup


def evaluate(ctx: HostContext, inv: Inventory, looked: Mapping[str, Lookup]) -> list[CheckResult]:
    """Image existence on the hosts that pull them; tier agreement on each decode host
    (the side that checks the NIXL compatibility hash at the handshake)."""
    out = images.evaluate(ctx, looked, inv.router_image, inv.router.proxy_image)
    if "decode" in ctx.roles:
        out.append(agreement.evaluate(inv))
    return out
