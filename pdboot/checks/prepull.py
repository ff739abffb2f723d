"""The checks preflight adds from what it knows without a host's output: the registry
lookups (pdboot/checks/images.py) and the inventory itself (pdboot/checks/agreement.py).
One entry point so preflight.py needs a single hook line."""

from __future__ import annotations

from collections.abc import Mapping

from pdboot.checks import CheckResult, HostContext, agreement, images
from pdboot.inventory import Inventory
from pdboot.registry import Lookup


def evaluate(ctx: HostContext, inv: Inventory, looked: Mapping[str, Lookup]) -> list[CheckResult]:
    """Image existence on the hosts that pull them; tier agreement on each decode host
    (the side that checks the NIXL compatibility hash at the handshake)."""
    out = images.evaluate(ctx, looked, inv.router_image)
    if "decode" in ctx.roles:
        out.append(agreement.evaluate(inv))
    return out
