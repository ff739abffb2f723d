"""The checks preflight adds from what it knows without a host's output: the registry
lookups (``images``), and, in ``local``, the inventory itself (``agreement``) and this
machine's files and environment (``secret_refs``, ``tls``), which run.py also reports for a
host it could not reach."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone

from pdboot.inventory.rules import deployment_hosts
from pdboot.inventory.schema import Inventory
from pdboot.preflight.checks import (
    CheckResult,
    HostContext,
    agreement,
    images,
    secret_refs,
    tls,
)
from pdboot.preflight.registry import Lookup


def evaluate(ctx: HostContext, inv: Inventory, looked: Mapping[str, Lookup]) -> list[CheckResult]:
    """Image existence on the hosts that pull them; tier agreement on each decode host
    (the side that checks the NIXL compatibility hash at the handshake)."""
    return images.evaluate(ctx, looked, inv.router_image, inv.router.proxy_image) + local(ctx, inv)


def local(ctx: HostContext, inv: Inventory) -> list[CheckResult]:
    """What this machine judges from the inventory and its own files, needing no answer from
    the host: reported whether or not the host could be reached (run.py)."""
    out = []
    if ctx.name == first_host(inv):  # this machine's secrets: reported once
        out += secret_refs.evaluate(inv)
    if "decode" in ctx.roles:
        out.append(agreement.evaluate(inv))
    if "router" in ctx.roles:  # router.tls: the pair the proxy will serve
        out += tls.evaluate(inv, datetime.now(timezone.utc))
    return out


def first_host(inv: Inventory) -> str:
    """The deployment's first host in inventory order."""
    used = set(deployment_hosts(inv))
    return next(h for h in inv.hosts if h in used)
