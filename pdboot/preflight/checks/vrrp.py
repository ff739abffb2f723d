"""What keepalived needs on each ingress host (router.virtual_ip, docs/ingress-standby.md):

- ``network.vrrp_interface``: the interface exists (router.vrrp_interface or the host's
  net_interface), or, unnamed, one carries the host's address (the one the plan takes);
- ``network.vrrp_subnet``: the virtual IP is on that interface's subnet (gratuitous ARP
  moves an address only within one segment);
- ``network.vrrp_address``: the address is free: after a packet to it, the neighbour table
  says nothing answered, or it is this host's or the other ingress host's (this deployment's
  keepalived holds it); another machine's MAC is a conflict;
- ``network.vrrp_router_id``: no other VRRP instance sends adverts with this router id
  (3.5 s of listening for IP protocol 112 with python3's raw socket; adverts from the two
  ingress hosts are this deployment's own).

One command: ``ip`` for the addresses, links and neighbours, python3 for the packet and the
listening. Pure parser over its text (tests/unit/fixtures/vrrp/), pure verdicts.
"""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pdboot.preflight.checks import MISSING, CheckResult, Command, HostContext, Section, VrrpAsk

if TYPE_CHECKING:
    from pdboot.preflight.checks.facts import HostFacts

ID_INTERFACE = "network.vrrp_interface"
ID_SUBNET = "network.vrrp_subnet"
ID_ADDRESS = "network.vrrp_address"
ID_ROUTER_ID = "network.vrrp_router_id"
LISTEN_SECONDS = 3.5
_LISTEN = """import socket, sys, time
vip, peer, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, 112)
except OSError as e:
    print("vrrp-listen unavailable", e)
    sys.exit(0)
s.settimeout(0.5)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for to in (vip, peer):  # their neighbour entries: who answers for the address
    try:
        u.sendto(b"", (to, 9))
    except OSError as e:
        print("vrrp-send", to, e)
seen, end = set(), time.time() + seconds
while time.time() < end:
    try:
        d, a = s.recvfrom(2048)
    except OSError:
        continue
    h = (d[0] & 15) * 4
    if len(d) > h + 1:
        seen.add((a[0], d[h + 1]))
for a, v in sorted(seen):
    print("vrrp-advert", a, v)
print("vrrp-listened")
"""
# the batch's section markers hold the command line: one line (checks/__init__.py)
_ONE_LINE = f"exec({_LISTEN!r})"
_FREE = ("FAILED", "INCOMPLETE")


def commands(ctx: HostContext) -> list[Command]:
    ask = ctx.vrrp
    if ask is None:
        return []
    vip, peer = shlex.quote(ask.virtual_ip.split("/")[0]), shlex.quote(ask.peer)
    line = (
        f"ip -o -4 addr show; echo '## link'; ip -o link show; echo '## listen'; "
        f"python3 -c {shlex.quote(_ONE_LINE)} {vip} {peer} {LISTEN_SECONDS:g} 2>&1; "
        f"echo '## neigh'; ip -o neigh show to {vip}; ip -o neigh show to {peer}; true"
    )
    return [Command("vrrp", line, "network")]


@dataclass(frozen=True)
class VrrpFacts:
    addresses: tuple[tuple[str, str], ...]  # (interface, ADDRESS/PREFIX), IPv4
    links: tuple[str, ...]  # interface names
    adverts: tuple[tuple[str, int], ...]  # (source, router id) heard
    listened: bool  # False: no python3, or no raw socket (not root)
    neighbours: tuple[tuple[str, str, str], ...]  # (address, MAC or "", state)
    # the interface carrying the host's address: the plan's VRRP interface when the
    # inventory names none (preflight/findings.py hands it on)
    carrier: str = ""


def parse_output(text: str) -> VrrpFacts:
    part = "addr"
    addrs: list[tuple[str, str]] = []
    links: list[str] = []
    adverts: list[tuple[str, int]] = []
    neigh: list[tuple[str, str, str]] = []
    listened = False
    for line in text.splitlines():
        w = line.split()
        if line.startswith("## "):
            part = line[3:].strip()
        elif part == "addr" and len(w) >= 4 and w[2] == "inet":
            addrs.append((w[1], w[3]))
        elif part == "link" and len(w) >= 2 and w[0].endswith(":"):
            links.append(w[1].rstrip(":").split("@")[0])
        elif part == "listen" and w[:1] == ["vrrp-advert"] and len(w) == 3 and w[2].isdigit():
            adverts.append((w[1], int(w[2])))
        elif part == "listen" and w[:1] == ["vrrp-listened"]:
            listened = True
        elif part == "neigh" and w:
            mac = w[w.index("lladdr") + 1] if "lladdr" in w[:-1] else ""
            neigh.append((w[0], mac, w[-1]))
    return VrrpFacts(tuple(addrs), tuple(links), tuple(adverts), listened, tuple(neigh))


def parse(ctx: HostContext, sections: Mapping[str, Section]) -> VrrpFacts | None:
    if ctx.vrrp is None:
        return None
    s = sections.get("vrrp", MISSING)
    if s.rc is None:
        return None
    f = parse_output(s.output)
    found = [i for i, a in f.addresses if a.split("/")[0] == ctx.vrrp.address]
    return replace(f, carrier=found[0]) if found else f


def _interface(ask: VrrpAsk, f: VrrpFacts) -> tuple[str, str, CheckResult]:
    """(interface, its ADDRESS/PREFIX, the verdict)."""
    names = ", ".join(f.links) or "none"
    named = ask.interface
    if named is not None:
        if named not in f.links:
            fix = f"set router.vrrp_interface to one of this host's interfaces: {names}"
            return "", "", CheckResult(ID_INTERFACE, "fail", f"no interface {named} here", fix)
        mine = [a for i, a in f.addresses if i == named]
        shown = ", ".join(mine) or "no IPv4 address"
        ok = CheckResult(ID_INTERFACE, "pass", f"{named} is here ({shown})")
        return named, (mine[0] if mine else ""), ok
    for iface, cidr in f.addresses:
        if cidr.split("/")[0] == ask.address:
            return iface, cidr, CheckResult(ID_INTERFACE, "pass", f"{iface} carries {cidr}")
    fix = "set router.vrrp_interface (or hosts.<name>.net_interface) to the LAN's interface"
    return "", "", CheckResult(ID_INTERFACE, "fail", f"no interface carries {ask.address}", fix)


def evaluate_facts(ask: VrrpAsk, f: VrrpFacts) -> list[CheckResult]:
    vip_if = ipaddress.IPv4Interface(ask.virtual_ip)
    vip = str(vip_if.ip)
    iface, cidr, verdict = _interface(ask, f)
    out = [verdict]
    if cidr:
        net = ipaddress.IPv4Interface(cidr).network
        ok = vip_if.ip in net
        out.append(
            CheckResult(
                ID_SUBNET,
                "pass" if ok else "fail",
                f"{vip} {'is' if ok else 'is not'} on {iface}'s subnet {net}",
                ""
                if ok
                else f"pick router.virtual_ip inside {net}, or the interface on its subnet",
            )
        )
    out.append(_address(ask.peer, vip, f))
    out.append(_router_id(ask.router_id, (ask.address, ask.peer), f))
    return out


def _address(peer: str, vip: str, f: VrrpFacts) -> CheckResult:
    if any(a.split("/")[0] == vip for _i, a in f.addresses):
        return CheckResult(ID_ADDRESS, "pass", f"{vip} is held by this host (this deployment's)")
    macs = {a: (m, s) for a, m, s in f.neighbours}
    mac, state = macs.get(vip, ("", "none"))
    if not mac or state in _FREE:
        return CheckResult(ID_ADDRESS, "pass", f"{vip} is free: nothing answered for it")
    if mac == macs.get(peer, ("", ""))[0]:
        return CheckResult(ID_ADDRESS, "pass", f"{vip} is held by the other ingress host ({peer})")
    return CheckResult(
        ID_ADDRESS,
        "fail",
        f"{vip} is answered by another machine ({mac}): keepalived would fight it for the address",
        "pick a free address for router.virtual_ip (or free that one)",
    )


def _router_id(vrid: int, ours: tuple[str, str], f: VrrpFacts) -> CheckResult:
    if not f.listened:
        return CheckResult(
            ID_ROUTER_ID, "skip", "could not listen for VRRP (needs python3 and root on the host)"
        )
    others = sorted({a for a, v in f.adverts if v == vrid and a not in ours})
    heard = sorted({v for _a, v in f.adverts})
    if others:
        free = next(i for i in range(1, 256) if i not in heard)
        return CheckResult(
            ID_ROUTER_ID,
            "fail",
            f"another VRRP instance uses router id {vrid}: adverts from {', '.join(others)}",
            f"set router.vrrp_router_id to an unused id (e.g. {free})",
        )
    seen = f"; ids heard: {', '.join(map(str, heard))}" if heard else ""
    return CheckResult(
        ID_ROUTER_ID, "pass", f"no other VRRP instance with id {vrid} in {LISTEN_SECONDS:g} s{seen}"
    )


def evaluate(ctx: HostContext, facts: HostFacts) -> list[CheckResult]:
    if ctx.vrrp is None:
        return []
    if facts.vrrp is None:
        return [CheckResult(ID_INTERFACE, "fail", "the VRRP checks did not run")]
    return evaluate_facts(ctx.vrrp, facts.vrrp)
