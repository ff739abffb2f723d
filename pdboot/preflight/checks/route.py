"""Without RDMA, KV moves over UCX's TCP transport: on which interface?

UCX picks every interface it finds unless ``UCX_NET_DEVICES`` names some, and a host with
Docker has ``docker0`` (and ``lo``): an endpoint built on one of those never reaches the
peer host (UCX endpoint timeouts at the first request). The kernel says which interface
reaches each peer engine host: ``ip -o route get ADDRESS``. That interface must not be
``docker0`` or ``lo``; pdboot then sets ``UCX_NET_DEVICES`` to it (an explicit
``kv_transfer.ucx.net_devices`` wins). Pure parser and verdict; the interfaces found stay
on the host's facts (``RouteFacts.ifaces``), which preflight/findings.py reads for the plan.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdboot.preflight.checks import CheckResult, Command, HostContext, Section

if TYPE_CHECKING:
    from pdboot.preflight.checks.facts import HostFacts

CHECK_ID = "network.ucx_iface"
BAD = ("docker0", "lo")
PREFIX = "UCX_NET_DEVICES="


def peers(ctx: HostContext) -> list[str]:
    """The peer engine hosts' addresses (set by preflight.contexts)."""
    return list(ctx.peers)


def script(addresses: Iterable[str]) -> str:
    parts = []
    for a in addresses:
        q = shlex.quote(a)
        # a name is resolved on the host, as UCX would; `ip route get` takes addresses
        parts.append(
            f"a={q}; case $a in *[!0-9a-fA-F.:]*) "
            "a=$(getent ahosts \"$a\" | awk 'NR==1{print $1}');; esac; "
            f"printf 'peer=%s\\n' {q}; ip -o route get \"$a\" 2>&1"
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


@dataclass(frozen=True)
class RouteFacts:
    routes: tuple[Route, ...]

    @property
    def remote(self) -> list[Route]:
        return [r for r in self.routes if not r.local]

    @property
    def bad(self) -> list[Route]:
        """Peers reached through docker0/lo, or not at all."""
        return [r for r in self.remote if r.dev in BAD or not r.dev]

    def ifaces(self) -> list[str]:
        """The interfaces reaching the remote peers; none when any peer is reached badly
        (preflight fails there) or every peer is on this host."""
        if self.bad:
            return []
        return list(dict.fromkeys(r.dev for r in self.remote))


_DEV = re.compile(r"\bdev (\S+)")


def parse_text(text: str) -> list[Route]:
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


def verdict(facts: RouteFacts, explicit: str | None) -> CheckResult | None:
    remote = facts.remote
    if not remote:
        return None  # every peer engine is on this host: no network hop
    bad = facts.bad
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
    via = ", ".join(f"{r.peer} via {r.dev}" for r in remote)
    if explicit:
        return CheckResult(
            CHECK_ID, "pass", f"{via}; kv_transfer.ucx.net_devices={explicit} is used as set"
        )
    return CheckResult(CHECK_ID, "pass", f"{PREFIX}{','.join(facts.ifaces())} ({via})")


def parse(ctx: HostContext, s: Mapping[str, Section]) -> RouteFacts | None:
    """None where the command did not run (RDMA on, no peer, deselected, cut off)."""
    sec = s.get("route")
    if sec is None or sec.rc is None:
        return None
    return RouteFacts(tuple(parse_text(sec.output)))


def evaluate(ctx: HostContext, facts: HostFacts) -> list[CheckResult]:
    """Judged where KV goes over TCP: rdma off, or auto without usable RDMA (read from
    the RDMA area's facts)."""
    if facts.route is None:
        return []
    r = facts.rdma
    if ctx.rdma_mode == "auto" and r is not None and r.checked and r.usable:
        return []
    res = verdict(facts.route, ctx.ucx_net_devices)
    return [res] if res is not None else []
