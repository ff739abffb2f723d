"""The testbed's network: one bridge per testbed instance, one namespace + veth per host.

Names carry the instance number k (pdt<k>br, pdt<k>-<host>, pdt<k>b<i>) so several testbeds
(a session one, fresh ones, a CLI one) coexist. Hosts get no default route: nothing outside
the instance's /24 is reachable from a test host, by construction.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

NETNS_DIR = Path("/run/netns")


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(argv), capture_output=True, text=True)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: rc={res.returncode}: {res.stderr.strip()}")
    return res


def link_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def bridge_name(k: int) -> str:
    return f"pdt{k}br"


def netns_name(k: int, host: str) -> str:
    return f"pdt{k}-{host}"


def veth_name(k: int, i: int) -> str:
    return f"pdt{k}b{i}"  # the bridge side; the host side is renamed eth0


def subnet(k: int) -> str:
    return f"10.77.{k}"


def create_bridge(k: int) -> str:
    br = bridge_name(k)
    run("ip", "link", "add", br, "type", "bridge")
    run("ip", "addr", "add", f"{subnet(k)}.1/24", "dev", br)
    run("ip", "link", "set", br, "up")
    return br


def iptables_rule(k: int) -> list[str]:
    br = bridge_name(k)
    # why: a dockerd with iptables in the machine's namespace sets FORWARD to DROP, and
    # bridged traffic between our namespaces passes FORWARD (bridge-nf-call-iptables=1)
    return [
        "FORWARD",
        "-i",
        br,
        "-o",
        br,
        "-j",
        "ACCEPT",
        "-m",
        "comment",
        "--comment",
        f"pdboot-testbed-{k}",
    ]


def add_forward_rule(k: int) -> bool:
    if shutil.which("iptables") is None:
        return False
    res = run("iptables", "-I", *iptables_rule(k), check=False)
    return res.returncode == 0


def del_forward_rule(k: int) -> None:
    if shutil.which("iptables") is None:
        return
    for _ in range(5):  # delete every copy, should one have been added twice
        if run("iptables", "-D", *iptables_rule(k), check=False).returncode != 0:
            break


def create_host_net(k: int, host: str, i: int, address: str) -> tuple[str, str]:
    ns, veth = netns_name(k, host), veth_name(k, i)
    run("ip", "netns", "add", ns)
    tmp = f"pdt{k}h{i}"
    run("ip", "link", "add", tmp, "type", "veth", "peer", "name", veth)
    run("ip", "link", "set", tmp, "netns", ns)
    run("ip", "link", "set", veth, "master", bridge_name(k), "up")
    run("ip", "-n", ns, "link", "set", tmp, "name", "eth0")
    run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
    run("ip", "-n", ns, "link", "set", "eth0", "up")
    run("ip", "-n", ns, "link", "set", "lo", "up")
    return ns, veth


def set_link(veth: str, up: bool) -> None:
    """A host's cable cut (or plugged back in): the bridge side of its veth goes down.
    Nothing is reset: both ends just stop hearing each other, as when a switch port or a
    cable fails, so TCP peers see silence, never an RST."""
    run("ip", "link", "set", veth, "up" if up else "down")


def link_up(veth: str) -> bool:
    flags = Path(f"/sys/class/net/{veth}/flags").read_text().strip()
    return bool(int(flags, 16) & 0x1)  # IFF_UP


def delete_host_net(ns: str, veth: str) -> None:
    if link_exists(veth):
        run("ip", "link", "del", veth, check=False)
    if (NETNS_DIR / ns).exists():
        run("ip", "netns", "del", ns, check=False)


def delete_bridge(k: int) -> None:
    if link_exists(bridge_name(k)):
        run("ip", "link", "del", bridge_name(k), check=False)


def netns_inode(ns: str) -> int | None:
    try:
        return os.stat(NETNS_DIR / ns).st_ino
    except OSError:
        return None
