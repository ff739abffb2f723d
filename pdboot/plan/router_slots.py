"""The router's two places on its host (pure): home (``router.internal_port``, the plan's
router, what compose.yaml starts) and spare (``router.swap_port``), where a router change
starts the new router beside the old one (deploy/router_swap.py). Outside a swap only home
runs; the proxy's nginx.conf names both upstreams (plan/proxy.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from pdboot.inventory.schema import Inventory
from pdboot.plan.model import LABEL_ROUTER_SLOT, Service

Slot = Literal["home", "spare"]
SPARE_NAME = "router-swap"  # its service and container name suffix (<project>-router-swap)
SPARE_LABEL = (LABEL_ROUTER_SLOT, "spare")
SPARE_COMPOSE = "router-swap.yaml"  # its compose file beside compose.yaml
SPARE_PROJECT_SUFFIX = "-swap"  # its own compose project: compose.yaml's never sees it


def with_flag(command: Sequence[str], flag: str, value: str) -> tuple[str, ...]:
    """``command`` with the value after ``flag`` replaced, or the pair appended."""
    out = list(command)
    if flag in out[:-1]:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return tuple(out)


def spare_router(inv: Inventory, router: Service) -> Service:
    """``router`` (the plan's, or a successor's) as it runs in the spare place: its own
    loopback and metrics ports, name and slot label; every other setting the same."""
    r = inv.router
    command = with_flag(router.command, "--port", str(r.swap_port))
    command = with_flag(command, "--prometheus-port", str(r.swap_metrics_port))
    return replace(
        router,
        name=SPARE_NAME,
        port=r.swap_port,
        metrics_port=r.swap_metrics_port,
        command=command,
        labels=(*[kv for kv in router.labels if kv[0] != LABEL_ROUTER_SLOT], SPARE_LABEL),
    )


def spare_project(router: Service) -> str:
    return router.project + SPARE_PROJECT_SUFFIX


def slot_port(inv: Inventory, slot: Slot) -> int:
    return inv.router.internal_port if slot == "home" else inv.router.swap_port


def other(slot: Slot) -> Slot:
    return "spare" if slot == "home" else "home"
