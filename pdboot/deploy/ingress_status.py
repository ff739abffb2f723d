"""`status` of the standby ingress (docs/ingress-standby.md): which ingress host holds the
virtual IP (``ip -o -4 addr show`` on each, read by a pure parser), and whether the standby's
router lists the same workers as the inventory (its worker API through the standby host's
SSH channel: an router_admin.AdminFetch given that router, which the caller opens once per run)."""

from __future__ import annotations

from dataclasses import dataclass

from pdboot.deploy.router_api import WorkerDiff, worker_diff
from pdboot.events import Level
from pdboot.plan.model import Plan
from pdboot.transport.hosts import Hosts
from pdboot.transport.http import HttpFn

ADDR_COMMAND = ["ip", "-o", "-4", "addr", "show"]


def holds_address(ip_output: str, address: str) -> bool:
    """Does ``ip -o -4 addr show``'s output list ``address`` (no prefix) on some interface?
    Its lines read ``2: eth0    inet 10.0.0.100/24 scope global secondary eth0 ...``."""
    for line in ip_output.splitlines():
        words = line.split()
        for i, w in enumerate(words[:-1]):
            if w == "inet" and words[i + 1].split("/")[0] == address:
                return True
    return False


@dataclass(frozen=True)
class IngressState:
    holders: tuple[str, ...] = ()  # the ingress hosts that hold the virtual IP
    unread: tuple[str, ...] = ()  # ingress hosts whose addresses could not be read
    standby: WorkerDiff | None = None  # the standby router's workers against the plan

    def lines(self, plan: Plan) -> list[tuple[str, Level]]:
        """(text, level) for status: info when all is well, else warn."""
        out: list[tuple[str, Level]] = []
        if plan.virtual_ip:
            vip = plan.virtual_ip.split("/")[0]
            if len(self.holders) == 1:
                role = "the router host" if self.holders[0] == plan.router.host else "standby"
                out.append((f"virtual IP {vip}: held by {self.holders[0]} ({role})", "info"))
            elif self.holders:
                both = " and ".join(self.holders)
                out.append((f"virtual IP {vip}: held by {both} at once (split LAN?)", "warn"))
            elif not self.unread:
                out.append((f"virtual IP {vip}: held by no ingress host", "warn"))
            for h in self.unread:
                out.append((f"virtual IP {vip}: cannot read {h}'s addresses", "warn"))
        router = plan.standby_router
        if router is not None and self.standby is not None:
            d = self.standby
            if d.error:
                out.append((f"standby {router.key}: workers not read: {d.error}", "warn"))
            elif d.missing or d.foreign:
                what = [f"missing {', '.join(d.missing)}"] if d.missing else []
                what += [f"not in the inventory {', '.join(d.foreign)}"] if d.foreign else []
                out.append((f"standby {router.key}: out of step: {'; '.join(what)}", "warn"))
            else:
                out.append((f"standby {router.key}: in step (every engine registered)", "info"))
        return out

    @property
    def ok(self) -> bool:
        diff = self.standby
        in_step = diff is None or not (diff.error or diff.missing or diff.foreign)
        return in_step and not self.unread and len(self.holders) <= 1


def ingress_state(plan: Plan, hosts: Hosts, standby: HttpFn, vip_hosts: list[str]) -> IngressState:
    """``vip_hosts``: the reachable ingress hosts to read the address on; ``standby``: the
    standby router's admin channel (an AdminFetch given that router), opened by the caller
    for its whole run."""
    if plan.standby_router is None:
        return IngressState()
    holders, unread = vip_holders(plan, hosts, vip_hosts)
    return IngressState(holders, unread, worker_diff(plan, standby))


def vip_holders(
    plan: Plan, hosts: Hosts, vip_hosts: list[str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the hosts of ``vip_hosts`` holding the virtual IP, those whose addresses could not
    be read); both empty without ``router.virtual_ip``."""
    holders: list[str] = []
    unread: list[str] = []
    if plan.virtual_ip:
        vip = plan.virtual_ip.split("/")[0]
        for h in vip_hosts:
            link = hosts.links.get(h)
            try:
                if link is None:
                    raise LookupError("no connection")
                res = link.conn.run(ADDR_COMMAND, timeout=10.0)
                if not res.ok:
                    raise OSError(res.stderr.strip()[-200:])
            except Exception:  # one host's failure is reported, the others still read
                unread.append(h)
                continue
            if holds_address(res.stdout, vip):
                holders.append(h)
    return tuple(holders), tuple(unread)
