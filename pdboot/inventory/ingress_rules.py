"""The standby ingress's rules across fields (docs/ingress-standby.md), and the queries other
layers ask of a valid inventory: which hosts are ingress hosts, the VRRP router id.

With a virtual IP, keepalived on both ingress hosts names the other as its unicast peer by
address (keepalived takes IP literals only there) and holds the address on the segment both
share: so both hosts' addresses are IPv4 literals inside the virtual IP's network, and the
virtual IP is neither of them. What the inventory cannot say (the address free on the LAN,
the interface present, another VRRP instance with the same router id) preflight checks.
"""

from __future__ import annotations

import ipaddress

from pdboot.inventory.ingress_schema import default_router_id
from pdboot.inventory.schema import LOCAL, Host, Inventory

Rule = tuple[tuple[str | int, ...], str]

# keys that mean something only with router.virtual_ip (keepalived's settings)
_VRRP_ONLY = ("vrrp_interface", "vrrp_router_id", "keepalived_image")


def ingress_hosts(inv: Inventory) -> list[str]:
    """The hosts that run a proxy and a router: the router host, then the standby."""
    r = inv.router
    return [r.host] + ([r.standby] if r.standby is not None else [])


def vrrp_router_id(inv: Inventory) -> int:
    """router.vrrp_router_id, else one derived from the deployment's name."""
    r = inv.router
    return r.vrrp_router_id if r.vrrp_router_id is not None else default_router_id(inv.name)


def _vrrp_address(host: Host) -> str:
    return (host.advertise_address or "") if host.address == LOCAL else host.address


def ingress_rules(inv: Inventory) -> list[Rule]:
    r = inv.router
    out: list[Rule] = []
    if r.standby is not None:
        if r.standby not in inv.hosts:
            known = ", ".join(sorted(inv.hosts))
            out.append(
                (("router", "standby"), f"host {r.standby!r} is not defined under hosts ({known})")
            )
        elif r.standby == r.host:
            out.append(
                (
                    ("router", "standby"),
                    f"the standby must be another host than router.host ({r.host!r}): "
                    "one host lost would take both ingresses",
                )
            )
    if r.virtual_ip is None:
        out += [
            (("router", key), f"router.{key} configures keepalived: set router.virtual_ip too")
            for key in _VRRP_ONLY
            if key in r.model_fields_set
        ]
        return out
    if r.standby is None:
        out.append(
            (
                ("router", "virtual_ip"),
                "the address moves between two ingress hosts: set router.standby too",
            )
        )
        return out
    return out + _address_rules(inv, ipaddress.IPv4Interface(r.virtual_ip))


def _address_rules(inv: Inventory, vip: ipaddress.IPv4Interface) -> list[Rule]:
    """Both ingress hosts' addresses: IPv4 literals inside the virtual IP's network, other
    than the virtual IP."""
    out: list[Rule] = []
    for name in ingress_hosts(inv):
        host = inv.hosts.get(name)
        if host is None:
            continue  # reported above (or by the topology rules)
        addr = _vrrp_address(host)
        key = "advertise_address" if host.address == LOCAL else "address"
        try:
            ip = ipaddress.ip_address(addr)
        except ValueError:
            out.append(
                (
                    ("hosts", name, key),
                    f"ingress host {name!r} needs an IPv4 address here, not {addr!r}: "
                    "keepalived's unicast peers are IP addresses",
                )
            )
            continue
        if ip == vip.ip:
            out.append(
                (
                    ("router", "virtual_ip"),
                    f"{vip.ip} is the address of host {name!r}; the virtual IP must be a free one",
                )
            )
        elif ip not in vip.network:
            out.append(
                (
                    ("router", "virtual_ip"),
                    f"{vip} is not on the subnet of ingress host {name!r} ({ip} is outside "
                    f"{vip.network}): gratuitous ARP moves it only within one segment",
                )
            )
    return out
