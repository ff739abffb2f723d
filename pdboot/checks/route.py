"""Without RDMA, KV moves over UCX's TCP transport: on which interface?

UCX picks every interface it finds unless ``UCX_NET_DEVICES`` names some, and a host with
Docker has ``docker0`` (and ``lo``): an endpoint built on one of those never reaches the
peer host (UCX endpoint timeouts at the first request). The kernel says which interface
reaches each peer engine host: ``ip -o route get ADDRESS``. That interface must not be
``docker0`` or ``lo``; pdboot then sets ``UCX_NET_DEVICES`` to it (an explicit
``kv_transfer.ucx.net_devices`` wins). Pure parser and verdict; the interfaces found are
read back from the passed check by ``ifaces_from`` (as rdma_findings reads ACTIVE ports).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from pdboot.checks import CheckResult, Command, HostContext, Section

CHECK_ID = "network.ucx_iface"
BAD = ("docker0", "lo")
PREFIX = "UCX_NET_DEVICES="


def peers(ctx: HostContext) -> list[str]:
    """The peer engine hosts' addresses (set by preflight.contexts in ``extra``)."""
    return ctx.extra.get("peers", "").split()


def script(addresses: Iterable[str]) -> str:
    parts = []
    for a in addresses:
        q = shlex.quote(a)
        # a name is resolved on the host, as UCX would; `ip route get` takes addresses
        parts.append(
            f"a={q}; case $a in *[!0-9a-fA-F.:]*) "
            "a=$(getent ahosts \"$a\" | awk 'NR==1{print $1}');; esac; "
            f'echo "peer={a}"; ip -o route get "$a" 2>&1'
        )
    return "; ".join(parts) + "; true"


def commands(ctx: HostContext) -> list[Command]:
    if not ctx.gpu_host or ctx.rdma_mode == "on" or not peers(ctx):
        return []
    return [Command("route", script(peers(ctx)), "network")]


@dataclass(frozen=True)
class Route:
    peer: str
    dev: str  # "" when the kernel found no route
    local: bool  # the address is this host's own (a colocated peer)
    text: str


_DEV = re.compile(r"\bdev (\S+)")


def parse(text: str) -> list[Route]:
    out: list[Route] = []
    peer: str | None = None
    for ln in text.splitlines():
        if ln.startswith("peer="):
            peer = ln[len("peer=") :].strip()
        elif peer is not None and ln.strip():
            m = _DEV.search(ln)
            out.append(Route(peer, m.group(1) if m else "", ln.startswith("local "), ln.strip()))
            peer = None
    return out


def verdict(routes: list[Route], explicit: str | None) -> CheckResult | None:
    remote = [r for r in routes if not r.local]
    if not remote:
        return None  # every peer engine is on this host: no network hop
    bad = [r for r in remote if r.dev in BAD or not r.dev]
    if bad:
        r = bad[0]
        how = f"through {r.dev}" if r.dev else f"not at all ({r.text[:120]})"
        return CheckResult(
            CHECK_ID,
            "fail",
            f"the peer engine host {r.peer} is reached {how}: UCX's TCP transport "
            "would not reach it",
            "give the hosts addresses on the network that joins them (hosts.<name>.address "
            "or net_interface), or set kv_transfer.ucx.net_devices to that interface",
        )
    devs = list(dict.fromkeys(r.dev for r in remote))
    via = ", ".join(f"{r.peer} via {r.dev}" for r in remote)
    if explicit:
        return CheckResult(
            CHECK_ID, "pass", f"{via}; kv_transfer.ucx.net_devices={explicit} is used as set"
        )
    return CheckResult(CHECK_ID, "pass", f"{PREFIX}{','.join(devs)} ({via})")


def evaluate(
    ctx: HostContext, s: Mapping[str, Section], rdma_present: bool | None
) -> list[CheckResult]:
    """Judged where KV goes over TCP: rdma off, or auto without usable RDMA."""
    sec = s.get("route")
    if sec is None or sec.rc is None or rdma_present:
        return []
    res = verdict(parse(sec.output), ctx.ucx_net_devices)
    return [res] if res is not None else []


class _Check(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def message(self) -> str: ...


def ifaces_from(checks: Iterable[_Check]) -> list[str]:
    """The interfaces a passed network.ucx_iface check chose (none when set explicitly)."""
    for c in checks:
        if c.id == CHECK_ID and c.status == "pass" and c.message.startswith(PREFIX):
            return c.message[len(PREFIX) :].split(" ", 1)[0].split(",")
    return []
