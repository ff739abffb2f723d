"""EMULATED ibv_devinfo (rdma-core) for pdboot's testbed hosts: ConnectX-7 ports from the
host's profile ($PDT_PROFILE), printed with the real tool's layout (libibverbs/examples/
devinfo.c: tabs, state names and numbers, exit codes). No RDMA hardware is involved.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

STATES = {
    "DOWN": ("PORT_DOWN", 1),
    "INIT": ("PORT_INIT", 2),
    "ARMED": ("PORT_ARMED", 3),
    "ACTIVE": ("PORT_ACTIVE", 4),
}


def hca(dev: dict[str, Any]) -> str:
    state, num = STATES[dev.get("state", "ACTIVE")]
    ib = dev.get("link_layer", "InfiniBand") == "InfiniBand"
    active = num == 4
    mtu = "4096 (5)" if ib else "1024 (3)"
    guid = dev.get("node_guid", "b83f:d203:00c5:a3b0")
    return "".join(
        [
            f"hca_id:\t{dev['name']}\n",
            "\ttransport:\t\t\tInfiniBand (0)\n",
            f"\tfw_ver:\t\t\t\t{dev.get('fw_ver', '28.39.2048')}\n",
            f"\tnode_guid:\t\t\t{guid}\n",
            f"\tsys_image_guid:\t\t\t{guid}\n",
            "\tvendor_id:\t\t\t0x02c9\n",
            f"\tvendor_part_id:\t\t\t{dev.get('vendor_part_id', 4129)}\n",
            "\thw_ver:\t\t\t\t0x0\n",
            f"\tboard_id:\t\t\t{dev.get('board_id', 'MT_0000000838')}\n",
            "\tphys_port_cnt:\t\t\t1\n",
            "\t\tport:\t1\n",
            f"\t\t\tstate:\t\t\t{state} ({num})\n",
            "\t\t\tmax_mtu:\t\t4096 (5)\n",
            f"\t\t\tactive_mtu:\t\t{mtu}\n",
            f"\t\t\tsm_lid:\t\t\t{1 if ib and active else 0}\n",
            f"\t\t\tport_lid:\t\t{dev.get('lid', 12) if ib and active else 0}\n",
            "\t\t\tport_lmc:\t\t0x00\n",
            f"\t\t\tlink_layer:\t\t{'InfiniBand' if ib else 'Ethernet'}\n",
            "\n",
        ]
    )


def main(argv: list[str]) -> int:
    profile = json.loads(Path(os.environ["PDT_PROFILE"]).read_text())
    devices = profile.get("rdma", {}).get("devices", [])
    want = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-l", "--list"):
            sys.stdout.write(f"{len(devices)} HCA{'s' if len(devices) != 1 else ''} found:\n")
            sys.stdout.write("".join(f"\t{d['name']}\n" for d in devices) + "\n")
            return 0
        if a in ("-d", "--ib-dev") and i + 1 < len(argv):
            want = argv[i + 1]
            i += 1
        elif a.startswith("--ib-dev="):
            want = a.split("=", 1)[1]
        elif a in ("-v", "--verbose"):
            pass  # the verbose attributes are not emulated; the port lines are the same
        else:
            sys.stdout.write("Usage: ibv_devinfo             print the ca attributes\n")
            return 255
        i += 1
    if want is not None:
        match = [d for d in devices if d["name"] == want]
        if not match:
            sys.stderr.write(f"IB device '{want}' wasn't found\n")
            return 255
        devices = match
    if not devices:
        sys.stderr.write("No IB devices found\n")
        return 255
    sys.stdout.write("".join(hca(d) for d in devices))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
