"""The standby ingress's single values (issue 44, docs/ingress-standby.md): ``router.standby``,
``router.virtual_ip``, ``router.keepalived_image``, ``router.vrrp_interface``,
``router.vrrp_router_id``. Pure checks; the rules across fields are ``ingress_rules``.
"""

from __future__ import annotations

import hashlib
import ipaddress

from pydantic import field_validator

from pdboot.inventory.imageref import IMAGE_CHARS_RE, check_image_reference
from pdboot.inventory.safety import check_safe_token
from pdboot.inventory.strict import Strict

# Debian 12's keepalived 2.2.7 and busybox (the health check's wget) in one image, built by
# containers/keepalived.Dockerfile: no upstream keepalived image is published.
DEFAULT_KEEPALIVED_IMAGE = "pdboot/keepalived:2.2.7"
# VRRP's virtual router ids on one LAN segment: 1-255 (RFC 5798 VRID)
VRID_MIN, VRID_MAX = 1, 255
_IFACE_RE = r"[A-Za-z0-9_.:@-]{1,15}"  # IFNAMSIZ - 1, as hosts.<name>.net_interface


def check_virtual_ip(value: str) -> str:
    """``ADDRESS/PREFIX``, IPv4 (VRRP v2, announced by gratuitous ARP), a host address of
    its network: normalised to its canonical spelling."""
    v = value.strip()
    if "/" not in v:
        raise ValueError(
            f"{v!r} has no prefix length; write ADDRESS/PREFIX as on the hosts' interface "
            "(e.g. 10.0.0.100/24)"
        )
    try:
        iface = ipaddress.ip_interface(v)
    except ValueError:
        raise ValueError(f"{v!r} is not an IPv4 ADDRESS/PREFIX (e.g. 10.0.0.100/24)") from None
    if not isinstance(iface, ipaddress.IPv4Interface):
        raise ValueError(
            f"{v!r} is IPv6; pdboot's VRRP instance moves an IPv4 address (gratuitous ARP)"
        )
    ip, net = iface.ip, iface.network
    if ip.is_loopback or ip.is_multicast or ip.is_unspecified or ip.is_link_local:
        raise ValueError(f"{ip} cannot be a shared endpoint (loopback, multicast or link-local)")
    if net.prefixlen < 32 and ip in (net.network_address, net.broadcast_address):
        raise ValueError(f"{ip} is the network or broadcast address of {net}")
    return str(iface)


def default_router_id(deployment: str) -> int:
    """A VRRP router id from the deployment's name (1-255): two pdboot deployments on one
    LAN rarely pick the same one, and preflight catches the rest (another instance with
    this id answering on the segment)."""
    digest = hashlib.sha256(deployment.encode()).digest()
    return VRID_MIN + int.from_bytes(digest[:2], "big") % (VRID_MAX - VRID_MIN + 1)


class IngressChecks(Strict):
    """The router section's validators of these keys (its fields stay in schema.Router, in
    the order the reference lists them)."""

    @field_validator("virtual_ip", check_fields=False)
    @classmethod
    def _virtual_ip(cls, v: str | None) -> str | None:
        return None if v is None else check_virtual_ip(v)

    @field_validator("vrrp_interface", check_fields=False)
    @classmethod
    def _vrrp_iface(cls, v: str | None) -> str | None:
        return None if v is None else check_safe_token(v, "interface name", _IFACE_RE)

    @field_validator("keepalived_image", check_fields=False)
    @classmethod
    def _keepalived_image(cls, v: str) -> str:
        check_safe_token(v, "image reference (registry/repo:tag)", IMAGE_CHARS_RE)
        return check_image_reference(v)
