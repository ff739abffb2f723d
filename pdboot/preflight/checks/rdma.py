"""RDMA checks on GPU hosts: verbs devices, HCA ports ACTIVE, link layer and rate, and
that the UCX_NET_DEVICES names exist. Without RDMA, UCX silently falls back to TCP:
correct but about 100x slower for KV transfers, hence a warning even when optional.

BlueField DPUs' ports are left out of the facts (never chosen for KV, never counted as
usable RDMA): ``vendor_part_id`` in ibv_devinfo is the HCA's PCI device id, and the PCI ID
database names 15b3:a2d2 / a2d6 / a2dc the BlueField, BlueField-2 and BlueField-3
integrated ConnectX. UCX_NET_DEVICES=all would bind them (and management NICs): a bare
NIXL_ERR_BACKEND at the first transfer.

The management NIC's ports are left out the same way: an HCA whose net device (sysfs:
``/sys/class/infiniband/<hca>/device/net/<netdev>``) carries the default route
(``/proc/net/route``, ``/proc/net/ipv6_route``: an all-zero destination) or the inventory
address (``ip -o addr show``). KV on it competes with SSH and the control plane. Where the
mapping is missing (no sysfs link, a name for an address), nothing is left out: unknown,
never a failure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdboot.preflight.checks import (
    MISSING,
    CheckResult,
    Command,
    HostContext,
    ParseError,
    Section,
    Status,
)

if TYPE_CHECKING:
    from pdboot.preflight.checks.facts import HostFacts

DEVICES = "ls /dev/infiniband"
IBV = "ibv_devinfo"
SYSFS = (
    'for p in /sys/class/infiniband/*/ports/*; do [ -e "$p/state" ] || continue; '
    'echo "$p|$(cat $p/state)|$(cat $p/rate 2>/dev/null)|$(cat $p/link_layer 2>/dev/null)"; '
    "done; ls /sys/class/net | sed 's/^/netdev=/'"
)

# HCA -> net device links, the IPv4 and IPv6 routing tables, every interface's addresses
MGMT = (
    'for n in /sys/class/infiniband/*/device/net/*; do [ -e "$n" ] && echo "ibnet=$n"; done; '
    "cat /proc/net/route /proc/net/ipv6_route 2>/dev/null; ip -o addr show 2>/dev/null; true"
)


def commands(ctx: HostContext) -> list[Command]:
    if not ctx.gpu_host or ctx.rdma_mode == "off":
        return []
    return [
        Command("devices", DEVICES, "rdma"),
        Command("ibv", IBV, "rdma"),
        Command("sysfs", SYSFS, "rdma"),
        Command("mgmt", MGMT, "rdma"),
    ]


@dataclass(frozen=True)
class Port:
    device: str
    port: int
    state: str  # ACTIVE, DOWN, INIT, ... (PORT_ prefix dropped)
    link_layer: str = ""
    rate: str = ""  # "100 Gb/sec (4X EDR)"

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"

    @property
    def gbps(self) -> float | None:
        m = re.match(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec", self.rate)
        return float(m.group(1)) if m else None


def parse_devices(text: str) -> list[str]:
    """Names in /dev/infiniband (uverbs0, rdma_cm, ...); [] when the folder is missing."""
    if "No such file" in text:
        return []
    return [w for w in text.split() if re.fullmatch(r"[A-Za-z0-9_]+", w)]


_HCA_RE = re.compile(r"^hca_id:\s*(\S+)")
_PORT_RE = re.compile(r"^\s+port:\s*(\d+)")
_STATE_RE = re.compile(r"^\s+state:\s*(?:PORT_)?(\w+)")
_LL_RE = re.compile(r"^\s+link_layer:\s*(\S+)")
_PART_RE = re.compile(r"^\s+vendor_part_id:\s*(\d+)")
BLUEFIELD_PARTS = {41682: "BlueField", 41686: "BlueField-2", 41692: "BlueField-3"}


def parse_bluefield(text: str) -> dict[str, str]:
    """HCA -> BlueField generation, for the HCAs ibv_devinfo lists with a BlueField
    vendor_part_id (decimal PCI device id: 0xa2d2, 0xa2d6, 0xa2dc)."""
    out: dict[str, str] = {}
    dev: str | None = None
    for ln in text.splitlines():
        if m := _HCA_RE.match(ln):
            dev = m.group(1)
        elif dev is not None and (m := _PART_RE.match(ln)):
            part = BLUEFIELD_PARTS.get(int(m.group(1)))
            if part is not None:
                out[dev] = part
    return out


def parse_ibv_devinfo(text: str) -> list[Port]:
    """Ports from `ibv_devinfo` (or -v). [] for 'No IB devices found'."""
    if "No IB devices found" in text:
        return []
    ports: list[Port] = []
    dev: str | None = None
    cur: dict[str, str] | None = None

    def flush() -> None:
        if cur is not None and dev is not None:
            ports.append(
                Port(dev, int(cur["port"]), cur.get("state", "UNKNOWN"), cur.get("ll", ""))
            )

    for ln in text.splitlines():
        if m := _HCA_RE.match(ln):
            flush()
            dev, cur = m.group(1), None
        elif (m := _PORT_RE.match(ln)) and dev is not None:
            flush()
            cur = {"port": m.group(1)}
        elif cur is not None and (m := _STATE_RE.match(ln)):
            cur["state"] = m.group(1)
        elif cur is not None and (m := _LL_RE.match(ln)):
            cur["ll"] = m.group(1)
    flush()
    if not ports and dev is None and text.strip():
        raise ParseError("no hca_id blocks")
    return ports


def parse_sysfs(text: str) -> tuple[list[Port], list[str]]:
    """Ports from /sys/class/infiniband (state, rate, link layer) and the net devices."""
    ports, netdevs = [], []
    for ln in text.splitlines():
        if ln.startswith("netdev="):
            netdevs.append(ln[len("netdev=") :].strip())
            continue
        parts = ln.split("|")
        if len(parts) != 4:
            continue
        m = re.search(r"/infiniband/([^/]+)/ports/(\d+)$", parts[0])
        if not m:
            continue
        state = parts[1].split(":")[-1].strip()  # "4: ACTIVE"
        ports.append(Port(m.group(1), int(m.group(2)), state, parts[3].strip(), parts[2].strip()))
    return ports, netdevs


@dataclass(frozen=True)
class NetMap:
    """Which net device each HCA drives, and which net devices are the host's way in."""

    hca_netdevs: tuple[tuple[str, str], ...] = ()  # (HCA, netdev) from sysfs
    default_ifaces: tuple[str, ...] = ()  # carrying a default route (IPv4 or IPv6)
    addrs: tuple[tuple[str, str], ...] = ()  # (netdev, address) from ip -o addr

    def management(self, address: str) -> dict[str, str]:
        """HCA -> why it is the management NIC (its netdev carries the default route or
        ``address``). Empty when the HCA -> netdev mapping is unknown."""
        out: dict[str, str] = {}
        for hca, nd in self.hca_netdevs:
            if nd in self.default_ifaces:
                out.setdefault(hca, f"{nd} carries the default route")
            elif address and (nd, address) in self.addrs:
                out.setdefault(hca, f"{nd} has the host's address {address}")
        return out


_IBNET_RE = re.compile(r"^ibnet=.*/infiniband/([^/]+)/device/net/([^/\s]+)$")
_ADDR_RE = re.compile(r"^\d+:\s+([^\s:@]+)(?:@\S+)?:?\s+inet6?\s+([0-9A-Fa-f.:]+)/\d+")


def _v6_up(flags: str) -> bool:
    try:
        v = int(flags, 16)
    except ValueError:
        return False
    return bool(v & 0x1) and not v & 0x200


def parse_mgmt(text: str) -> NetMap:
    """The MGMT script's output: ``ibnet=`` sysfs paths, /proc/net/route (proc(5): Iface,
    Destination, Gateway, Flags, RefCnt, Use, Metric, Mask, ...; hex, host byte order),
    /proc/net/ipv6_route (destination, prefix length, source, its length, next hop, metric,
    refcnt, use, flags, device) and ``ip -o addr show`` lines (``2: eno1    inet
    10.0.0.5/24 brd ...``). A default route is one with an all-zero destination and mask /
    prefix; IPv6's must be up (RTF_UP 0x1) and not a reject route (RTF_REJECT 0x200, the
    kernel's ``lo`` entries)."""
    links: list[tuple[str, str]] = []
    default: list[str] = []
    addrs: list[tuple[str, str]] = []
    for ln in text.splitlines():
        if m := _IBNET_RE.match(ln.strip()):
            links.append((m.group(1), m.group(2)))
            continue
        if m := _ADDR_RE.match(ln):
            addrs.append((m.group(1), m.group(2)))
            continue
        f = ln.split()  # the header's first field is "Iface"
        if len(f) >= 8 and f[0] != "Iface" and f[1] == "00000000" and f[7] == "00000000":
            default.append(f[0])
        elif len(f) == 10 and f[0] == "0" * 32 and f[1] == "00" and _v6_up(f[8]):
            default.append(f[9])
    return NetMap(tuple(links), tuple(dict.fromkeys(default)), tuple(addrs))


@dataclass(frozen=True)
class RdmaFacts:
    uverbs: list[str]  # /dev/infiniband/uverbs*: what a container needs for verbs
    ports: list[Port]  # every HCA port, with state, link layer and rate
    netdevs: list[str]  # /sys/class/net names (UCX_NET_DEVICES may name them)
    dev_names: tuple[str, ...] = ()  # everything in /dev/infiniband
    checked: bool = True  # the device listing ran to its end (not deselected, not cut off)
    error: str | None = None  # ibv_devinfo's text did not parse: nothing above is known
    ibv: Section = MISSING
    dpus: tuple[tuple[str, str], ...] = ()  # (HCA, BlueField-N): left out of ``ports``
    # (HCA, why): the management NIC's HCAs, left out of ``ports`` too
    mgmt: tuple[tuple[str, str], ...] = ()
    mgmt_netdevs: tuple[str, ...] = ()  # the management NICs' net devices

    @property
    def usable(self) -> bool:
        return self.error is None and bool(self.uverbs) and any(p.active for p in self.ports)

    def active_ports(self) -> list[str]:
        """``device:port`` of every ACTIVE port (what UCX_NET_DEVICES names)."""
        return [f"{p.device}:{p.port}" for p in self.ports if p.active]

    def link_gbps(self) -> float | None:
        rates = [p.gbps for p in self.ports if p.active and p.gbps]
        return max(rates) if rates else None


def facts(s: Mapping[str, Section], address: str = "") -> RdmaFacts:
    devs = parse_devices(s["devices"].output) if s["devices"].rc in (0, 2) else []
    sys_ports, netdevs = parse_sysfs(s["sysfs"].output)
    ibv = s["ibv"]
    ports: list[Port] = []
    if ibv.rc == 0 or "hca_id" in ibv.output:
        ports = parse_ibv_devinfo(ibv.output)
    # sysfs knows the rate; ibv_devinfo (without -v) does not
    rate = {(p.device, p.port): p for p in sys_ports}
    if ports:
        ports = [
            Port(
                p.device,
                p.port,
                p.state,
                p.link_layer or rate.get((p.device, p.port), p).link_layer,
                rate[(p.device, p.port)].rate if (p.device, p.port) in rate else "",
            )
            for p in ports
        ]
    else:
        ports = sys_ports
    dpus = parse_bluefield(ibv.output) if "hca_id" in ibv.output else {}
    ports = [p for p in ports if p.device not in dpus]  # never chosen for KV
    net = parse_mgmt(s.get("mgmt", MISSING).output)
    mgmt = {h: why for h, why in net.management(address).items() if h not in dpus}
    ports = [p for p in ports if p.device not in mgmt]  # nor the management NIC
    return RdmaFacts(
        [d for d in devs if d.startswith("uverbs")],
        ports,
        netdevs,
        tuple(parse_devices(s["devices"].output)),
        s["devices"].rc is not None,
        ibv=ibv,
        dpus=tuple(sorted(dpus.items())),
        mgmt=tuple(sorted(mgmt.items())),
        mgmt_netdevs=tuple(sorted({nd for h, nd in net.hca_netdevs if h in mgmt})),
    )


def parse(ctx: HostContext, s: Mapping[str, Section]) -> RdmaFacts | None:
    if not ctx.gpu_host or ctx.rdma_mode == "off":
        return None
    try:
        return facts(s, ctx.address)
    except ParseError as e:
        ran = s["devices"].rc is not None
        return RdmaFacts([], [], [], checked=ran, error=str(e), ibv=s["ibv"])


def evaluate(ctx: HostContext, facts: HostFacts) -> list[CheckResult]:
    if not ctx.gpu_host:
        return []
    if ctx.rdma_mode == "off":
        return [CheckResult("rdma.devices", "skip", "kv_transfer.rdma is off")]
    f = facts.rdma
    if f is None:
        return []
    if f.error is not None:
        return [
            CheckResult(
                "rdma.ports",
                "fail",
                f"could not parse ibv_devinfo ({f.error}): {f.ibv.first_lines()}",
                "run ibv_devinfo on the host",
            )
        ]
    return [*_devices(ctx, f), *_ports(ctx, f), _ucx(ctx, f)]


SLOW = "KV transfers fall back to TCP (correct but much slower)"


def _devices(ctx: HostContext, f: RdmaFacts) -> list[CheckResult]:
    if f.uverbs:
        msg = ", ".join(f.uverbs)
        if f.dpus:
            msg += "; " + _dpus(f) + " left out: never chosen for KV"
        if f.mgmt:
            msg += "; " + _mgmt(f) + " left out: the management NIC, never chosen for KV"
        return [CheckResult("rdma.devices", "pass", msg)]
    seen = ", ".join(f.dev_names) or "nothing"
    return [
        CheckResult(
            "rdma.devices",
            "fail" if ctx.rdma_required else "warn",
            f"no /dev/infiniband/uverbs* devices (found {seen}): {SLOW}",
            "install the HCA driver (MLNX_OFED / DOCA or rdma-core + mlx5_ib) and load "
            "ib_uverbs; or set kv_transfer.rdma: off",
        )
    ]


def _ports(ctx: HostContext, f: RdmaFacts) -> list[CheckResult]:
    bad: Status = "fail" if ctx.rdma_required else "warn"
    wanted = [d.split(":")[0] for d in ctx.rdma_devices]
    named = [d for d in wanted if d in dict(f.mgmt)]
    if named:
        return [
            CheckResult(
                "rdma.ports",
                "fail",
                f"hosts.{ctx.name}.rdma_devices names {', '.join(named)}, the management "
                f"NIC here ({_mgmt(f)}): KV there competes with SSH and the control plane",
                FIX_MGMT_DEVICES,
            )
        ]
    ports = [p for p in f.ports if not wanted or p.device in wanted]
    missing = [d for d in wanted if d not in {p.device for p in f.ports}]
    if not (f.uverbs or ports or wanted):
        return []
    out: list[CheckResult] = []
    down = [p for p in ports if not p.active]
    active = [p for p in ports if p.active]
    if missing:
        out.append(
            CheckResult(
                "rdma.ports",
                bad,
                f"declared RDMA device(s) {', '.join(missing)} not found "
                f"(present: {', '.join(sorted({p.device for p in f.ports})) or 'none'})",
                "fix hosts.<name>.rdma_devices or the HCA driver",
            )
        )
    elif down:
        desc = ", ".join(f"{p.device} port {p.port}: PORT_{p.state}" for p in down)
        out.append(
            CheckResult(
                "rdma.ports",
                bad if not active else "warn",
                f"{desc}" + ("" if active else f": {SLOW}"),
                "check the cable and the switch port; `ibstat`; an IB fabric needs a "
                "subnet manager (opensm)",
            )
        )
    elif active:
        out.append(
            CheckResult(
                "rdma.ports",
                "pass",
                ", ".join(f"{p.device} port {p.port} ACTIVE" for p in active),
            )
        )
    for p in active:
        out.append(
            CheckResult(
                "rdma.link",
                "pass",
                f"{p.device}:{p.port} {p.link_layer or 'unknown link layer'}"
                f"{', ' + p.rate if p.rate else ''}",
            )
        )
    return out


def _dpus(f: RdmaFacts) -> str:
    return ", ".join(f"{d} ({kind} DPU)" for d, kind in f.dpus)


def _mgmt(f: RdmaFacts) -> str:
    return ", ".join(f"{d} ({why})" for d, why in f.mgmt)


_NOT_MGMT = (
    " (ibv_devinfo; not the one whose netdev carries the default route or the SSH "
    "address), or leave it unset: pdboot never picks the management NIC"
)
FIX_MGMT_UCX = "list a data-path HCA port in kv_transfer.ucx.net_devices" + _NOT_MGMT
FIX_MGMT_DEVICES = "list a data-path HCA in hosts.<name>.rdma_devices" + _NOT_MGMT

FIX_ALL = (
    "leave kv_transfer.ucx.net_devices unset (pdboot then gives each engine its nearest "
    "ACTIVE ports) or list the HCA ports KV is to use (e.g. mlx5_0:1)"
)


def _ucx(ctx: HostContext, f: RdmaFacts) -> CheckResult:
    value = ctx.ucx_net_devices
    if value == "all":
        others = f"; here that includes {_dpus(f)}" if f.dpus else ""
        mgmt = f"; the management NIC here is {_mgmt(f)}" if f.mgmt else ""
        return CheckResult(
            "rdma.ucx_devices",
            "warn",
            "UCX_NET_DEVICES=all lets UCX bind every device, management and BlueField DPU "
            f"ports included{others}{mgmt}: a wrong pick fails as a bare NIXL_ERR_BACKEND",
            FIX_ALL,
        )
    if not value:
        return CheckResult("rdma.ucx_devices", "pass", "UCX_NET_DEVICES=(unset: all)")
    known = {p.device for p in f.ports} | set(f.netdevs)
    names = [n.strip().split(":")[0] for n in value.split(",") if n.strip()]
    dpu = [n for n in names if n in dict(f.dpus)]
    if dpu:
        return CheckResult(
            "rdma.ucx_devices",
            "fail",
            f"UCX_NET_DEVICES={value} names {', '.join(dpu)}: a BlueField DPU port "
            f"({_dpus(f)}), not the host's HCA for KV",
            FIX_ALL,
        )
    on_mgmt = [n for n in names if n in dict(f.mgmt) or n in f.mgmt_netdevs]
    if on_mgmt:
        return CheckResult(
            "rdma.ucx_devices",
            "fail",
            f"UCX_NET_DEVICES={value} names {', '.join(on_mgmt)}, the management NIC "
            f"here ({_mgmt(f)}): not a data-path HCA for KV",
            FIX_MGMT_UCX,
        )
    missing = [n for n in names if n not in known]
    if missing:
        return CheckResult(
            "rdma.ucx_devices",
            "fail",
            f"UCX_NET_DEVICES={value}: {', '.join(missing)} not on this host "
            f"(has {', '.join(sorted(known)) or 'none'})",
            "fix kv_transfer.ucx.net_devices (names as in ibv_devinfo / ip link)",
        )
    return CheckResult("rdma.ucx_devices", "pass", f"UCX_NET_DEVICES={value}: all present")
