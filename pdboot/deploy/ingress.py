"""`up`'s standby ingress (docs/ingress-standby.md), once the router host's router and proxy
serve every engine: the standby's router, every engine registered on it as well, its proxy,
then keepalived on both ingress hosts and a wait until the virtual IP answers /health.

The standby's router listens on its own host's loopback at the same URL as the router host's
(``http://127.0.0.1:<internal_port>``): its calls go through a channel of the standby host's
SSH connection (router_admin.AdminFetch given that router), over the plain HTTP function, never
the router host's channel. Every `up` syncs its workers to the inventory's, whatever else
changed, so a standby left behind by an earlier `up` is brought back in step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pdboot.deploy.router_admin import AdminFetch
from pdboot.deploy.service_ops import ServiceOps, Where
from pdboot.deploy.up_options import UpStopped
from pdboot.deploy.waits import READY, Probe, WaitError, wait_all, waiting
from pdboot.events import Note, TierReady
from pdboot.plan.converge import Step
from pdboot.transport.http import HttpFn


def bring_up_ingress(where: Where, fetch: HttpFn, steps: Sequence[Step]) -> None:
    """``steps``: the change plan's ingress steps; ``fetch``: the plain HTTP function (not
    the router host's admin channel, which would take the standby router's URL for its
    own)."""
    plan = where.plan
    router = plan.standby_router
    if router is None:
        return
    admin = AdminFetch(plan, where.hosts, fetch, router=router)
    try:
        ops = ServiceOps(replace(where, fetch=admin))
        for role in ("router", "proxy", "keepalived"):
            mine = [s for s in steps if s.service.role == role]
            if any(s.kind != "unchanged" for s in mine):
                ops.start(mine)
            if role == "router":  # registers every engine (live workers), changed or not
                ops.wait([s.service for s in mine], router=True)
            elif role == "proxy":
                ops.wait([s.service for s in mine], router=False)
    finally:
        admin.close()
    if plan.keepalived:
        _wait_virtual_ip(where, fetch)


def _wait_virtual_ip(where: Where, fetch: HttpFn) -> None:
    """The endpoint's /health through the virtual IP: keepalived holds it on one host."""
    url = f"{where.plan.endpoint}/health"

    def probe() -> Probe:
        a = fetch(url, timeout=2.0)
        return READY if a.ok else waiting(a.describe())

    t = where.inv.timeouts
    try:
        took = wait_all(
            {"virtual IP": probe},
            what=f"{url} 200",
            deadline=t.router_ready_seconds,
            interval=t.poll_interval_seconds,
            clock=where.clock,
        )
    except WaitError as e:
        where.emit(
            Note(
                f"error: {e}; `pdboot logs INVENTORY keepalived` says why "
                "(`pdboot preflight` checks what VRRP needs)",
                "error",
            )
        )
        raise UpStopped from None
    where.emit(TierReady(("keepalived",), f"{where.plan.virtual_ip} answers /health", took))
