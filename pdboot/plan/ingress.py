"""The standby ingress (docs/ingress-standby.md): a second proxy and router on
``router.standby``, and keepalived on both ingress hosts moving ``router.virtual_ip`` (pure).

The standby's router and proxy are the router host's, moved: the same command, the same
nginx.conf (plan/proxy.py's ``proxy_files``), the same ports on the other host; `up`
registers every worker on both routers. keepalived runs with host networking and the
capabilities VRRP needs (NET_ADMIN to add the address, NET_RAW for its packets,
NET_BROADCAST for gratuitous ARP), one instance per host with the other as its unicast peer
(no multicast on the LAN). Tried between the testbed's network namespaces on one bridge with
Debian 12's keepalived 2.2.7 (tests/e2e/test_ingress_failover.py):

- both start BACKUP with ``nopreempt``: the router host (higher priority) takes the address
  at start, and once the address moved it stays where it is; a host coming back does not
  pull it back (a second move would cut the requests in flight a second time);
- a host whose link goes down enters FAULT (keepalived tracks the interface's carrier) and
  drops the address, so when the link returns exactly one host holds it;
- the track script asks the local proxy's /health (through the router behind it) every
  second; two misses and the instance faults, so the address also moves when the proxy or
  its router dies on a healthy host. busybox's wget: its ``-T`` crashes busybox 1.35
  (Debian 12), keepalived's script ``timeout`` bounds it instead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import replace

from pdboot.inventory.ingress_rules import ingress_hosts, vrrp_router_id
from pdboot.inventory.rules import advertised_address
from pdboot.inventory.schema import Inventory
from pdboot.plan.model import KEEPALIVED_CONF_FILE, LABEL_HOST, BindMount, Plan, Service

KEEPALIVED_CONF_IN_CONTAINER = "/etc/pdboot-keepalived/keepalived.conf"
KEEPALIVED = "/usr/sbin/keepalived"  # Debian's path
WGET = ("/bin/busybox", "wget")
# VRRP's capabilities (module docstring); nothing else
KEEPALIVED_CAPS = ("NET_ADMIN", "NET_RAW", "NET_BROADCAST")
# the active host's priority above the standby's: which one holds the address at start
PRIORITY_ACTIVE, PRIORITY_STANDBY = 150, 100
ADVERT_SECONDS = 1  # a lost master is taken over after ~3 adverts (3.6 s at priority 100)
CHECK_SECONDS, CHECK_TIMEOUT, CHECK_FALL, CHECK_RISE = 1, 2, 2, 2


def standby_service(svc: Service, inv: Inventory) -> Service:
    """The router host's router or proxy, on the standby host. The router's metrics listen
    on the standby's own address: router.metrics_bind (or its default) is an address of the
    router host, which the standby cannot bind (the router exits: os error 99)."""
    host = inv.router.standby or svc.host
    labels = tuple((k, host if k == LABEL_HOST else v) for k, v in svc.labels)
    own = advertised_address(inv.hosts[host])
    if svc.role != "router":
        return replace(svc, host=host, labels=labels, address=own)
    command = list(svc.command)
    if "--prometheus-host" in command:
        command[command.index("--prometheus-host") + 1] = own
    return replace(svc, host=host, labels=labels, command=tuple(command), metrics_address=own)


def vrrp_interface(
    inv: Inventory, host: str, tcp_ifaces: Mapping[str, Sequence[str]]
) -> str | None:
    """The interface VRRP speaks on: router.vrrp_interface, the host's net_interface, else
    the one preflight found carrying its traffic; None: not known without preflight."""
    named = inv.router.vrrp_interface or inv.hosts[host].net_interface
    if named is not None:
        return named
    found = tcp_ifaces.get(host) or ()
    return found[0] if found else None


def _peer(inv: Inventory, host: str) -> str:
    return next(h for h in ingress_hosts(inv) if h != host)


# The standby's VRRP starts this much later: both start BACKUP with nopreempt, so whichever
# times out first holds the address for good; on a loaded machine the standby's keepalived
# could start first (seen on the testbed at load 200). The router host's then always wins.
STANDBY_STARTUP_DELAY = 5


def _startup_delay(active: bool) -> list[str]:
    if active:
        return []
    return [
        "    # the router host's keepalived takes the address first (plan/ingress.py)",
        f"    vrrp_startup_delay {STANDBY_STARTUP_DELAY}",
    ]


def keepalived_conf_text(inv: Inventory, host: str, iface: str) -> str:
    """keepalived.conf of one ingress host: one VRRP instance, the other ingress host its
    unicast peer, the local proxy's /health its track script."""
    r = inv.router
    me, peer = advertised_address(inv.hosts[host]), advertised_address(inv.hosts[_peer(inv, host)])
    priority = PRIORITY_ACTIVE if host == r.host else PRIORITY_STANDBY
    scheme = "https" if r.tls is not None else "http"
    # no certificate check: the proxy's own certificate names the public host, not loopback
    tls = " --no-check-certificate" if r.tls is not None else ""
    check = f"{' '.join(WGET)} -q -O /dev/null{tls} {scheme}://127.0.0.1:{r.port}/health"
    name = f"pdboot_{inv.name.replace('-', '_')}"
    return "\n".join(
        [
            "# Generated by pdboot; do not edit (`pdboot up` overwrites it).",
            f"# {host}: VRRP for {r.virtual_ip} between {r.host} (active) and {r.standby}.",
            "global_defs {",
            f"    router_id pdboot-{inv.name}-{host}",
            "    enable_script_security",
            "    script_user root",
            "    # 3 gratuitous ARPs on taking the address, 3 more 1 s later (caches learn it)",
            "    vrrp_garp_master_delay 1",
            "    vrrp_garp_master_repeat 3",
            *_startup_delay(host == r.host),
            "}",
            f"vrrp_script {name}_proxy {{",
            f'    script "{check}"',
            f"    interval {CHECK_SECONDS}",
            f"    timeout {CHECK_TIMEOUT}",
            f"    fall {CHECK_FALL}",
            f"    rise {CHECK_RISE}",
            "}",
            f"vrrp_instance {name} {{",
            "    state BACKUP",
            "    nopreempt",
            f"    interface {iface}",
            f"    virtual_router_id {vrrp_router_id(inv)}",
            f"    priority {priority}",
            f"    advert_int {ADVERT_SECONDS}",
            f"    unicast_src_ip {me}",
            "    unicast_peer {",
            f"        {peer}",
            "    }",
            "    virtual_ipaddress {",
            f"        {r.virtual_ip} dev {iface}",
            "    }",
            "    track_script {",
            f"        {name}_proxy",
            "    }",
            "}",
            "",
        ]
    )


def keepalived_service(
    inv: Inventory, host: str, project: str, labels: tuple[tuple[str, str], ...], conf: str
) -> Service:
    """keepalived on one ingress host: host networking, VRRP's capabilities, the shipped
    keepalived.conf read-only; its config hash covers the conf's text (a label)."""
    project_dir = f"{inv.remote_dir.rstrip('/')}/{inv.name}"
    digest = hashlib.sha256(conf.encode()).hexdigest()[:16]
    return Service(
        name="keepalived",
        role="keepalived",
        host=host,
        address=advertised_address(inv.hosts[host]),
        port=inv.router.port,  # not its own (VRRP is IP protocol 112): the proxy's it guards
        project=project,
        image=inv.router.keepalived_image,
        command=("--dont-fork", "--log-console", "--vrrp", "-f", KEEPALIVED_CONF_IN_CONTAINER),
        entrypoint=(KEEPALIVED,),
        environment=(),
        gpus=None,
        rdma=False,
        restart=inv.container.restart,
        labels=(*labels, ("io.pdboot.keepalived-conf", digest)),
        mounts=(
            BindMount(f"{project_dir}/{KEEPALIVED_CONF_FILE}", KEEPALIVED_CONF_IN_CONTAINER, True),
        ),
        cap_add=KEEPALIVED_CAPS,
    )


def keepalived_confs(
    inv: Inventory, tcp_ifaces: Mapping[str, Sequence[str]]
) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """Host -> keepalived.conf for each ingress host whose interface is known, and (host,
    line) for each that needs preflight's facts. Empty without router.virtual_ip."""
    if inv.router.virtual_ip is None or inv.router.standby is None:
        return {}, []
    confs: dict[str, str] = {}
    needs: list[tuple[str, str]] = []
    for host in ingress_hosts(inv):
        iface = vrrp_interface(inv, host, tcp_ifaces)
        if iface is None:
            needs.append(
                (
                    host,
                    f"the interface for VRRP on {host} (router.vrrp_interface, "
                    f"hosts.{host}.net_interface, or the one preflight finds)",
                )
            )
            iface = "IFACE"  # a dry run shows where it goes; `up` refuses unresolved plans
        confs[host] = keepalived_conf_text(inv, host, iface)
    return confs, needs


def ingress_plan(
    inv: Inventory, router: Service, proxy: Service, tcp_ifaces: Mapping[str, Sequence[str]]
) -> tuple[tuple[Service, ...], dict[str, str], list[tuple[str, str]]]:
    """(the standby's router and proxy, host -> keepalived.conf, (host, line) for what needs
    preflight's facts). Nothing without router.standby."""
    if inv.router.standby is None:
        return (), {}, []
    standby = (standby_service(router, inv), standby_service(proxy, inv))
    confs, needs = keepalived_confs(inv, tcp_ifaces)
    return standby, confs, needs


def ingress_summary(plan: Plan) -> list[str]:
    """render's and `up --plan`'s lines about the standby ingress; none without one."""
    router, proxy = plan.standby_router, plan.standby_proxy
    if router is None or proxy is None:
        return []
    lines = [
        f"Standby ingress: {router.key} and {proxy.key} (the router host's settings; "
        "`up` registers every engine on both routers)"
    ]
    if plan.keepalived:
        hosts = ", ".join(s.host for s in plan.keepalived)
        lines.append(
            f"Virtual IP: {plan.virtual_ip} held by one of {hosts} (keepalived, VRRP); "
            f"it moves when the holder's link or proxy is lost"
        )
    return lines
