"""Benchmark: seconds without an answer when the ingress host is lost, with a standby ingress
and a virtual IP (router.standby + router.virtual_ip, docs/ingress-standby.md) against today's
single ingress, measured in the same run on one testbed.

Three hosts (decode, prefill, ingress), 1P1D stand-in engines. For each shape, alternating
run by run: `pdboot up`, a client loop (one completion at a time, 1 s timeout, 0.1 s apart)
to the endpoint `up` prints, the ingress host's link cut for --cut seconds (its veth down on
the bridge side), then restored, the loop kept --after seconds more, `pdboot down`. The figure
is the longest stretch between two answered requests that spans the cut: for the single
ingress it lasts until the link is back (so it grows with --cut), for the standby until
keepalived moved the address and the client's ARP cache followed.

    python bench/ingress_failover.py [--runs 2] [--cut 20] [--after 15]
                                       (root; starts and stops its own testbed)
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.testbed.harness import Testbed  # noqa: E402
from tests.testbed.inventory import inventory_dict  # noqa: E402

MODEL = "Qwen/Qwen3-0.6B"


def inventory(tb: Testbed, name: str, standby: bool) -> dict[str, Any]:
    inv = inventory_dict(
        tb, name=name, model=MODEL, decode=["decode"], prefill=["prefill"], router="ingress"
    )
    if standby:
        net = ipaddress.ip_interface(f"{tb.hosts['ingress'].address}/24").network
        inv["router"].update(
            {
                "standby": "decode",
                "virtual_ip": f"{net.network_address + 240}/24",
                "vrrp_interface": "eth0",
                "keepalived_image": tb.keepalived_image,
            }
        )
    return inv


def pdboot(*args: str) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "pdboot", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    if res.returncode != 0:
        raise RuntimeError(f"pdboot {args[0]} failed:\n{res.stdout}{res.stderr}")
    return res.stdout + res.stderr


def holds(tb: Testbed, host: str, address: str) -> bool:
    ns = tb.hosts[host].netns
    res = subprocess.run(
        ["ip", "-n", ns, "-4", "-o", "addr", "show", "dev", "eth0"],
        capture_output=True,
        text=True,
        check=True,
    )
    return f" {address}/" in res.stdout


def loop(url: str, stop: threading.Event, answered: list[float]) -> None:
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 4}).encode()
    while not stop.is_set():
        req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=1.0) as r:
                if r.status == 200:
                    answered.append(time.monotonic())
        except Exception:  # a failure is the absence of an answer: that is what is measured
            pass
        time.sleep(0.1)


def one(tb: Testbed, folder: Path, standby: bool, cut_s: float, after_s: float) -> float:
    name = "bhas" if standby else "bhas1"
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(inventory(tb, name, standby), sort_keys=False))
    pdboot("up", str(path), "--skip-preflight")
    try:
        r = inventory(tb, name, standby)["router"]
        host = r["virtual_ip"].split("/")[0] if standby else tb.hosts["ingress"].address
        answered: list[float] = []
        stop = threading.Event()
        t = threading.Thread(
            target=loop, args=(f"http://{host}:8000/v1/completions", stop, answered)
        )
        t.start()
        time.sleep(3)
        if standby and not holds(tb, "ingress", host):
            print("  (the virtual IP was not on the ingress host before the cut)", flush=True)
        cut = time.monotonic()
        tb.hosts["ingress"].cut_link()
        try:
            time.sleep(cut_s)
        finally:
            tb.hosts["ingress"].restore_link()
        time.sleep(after_s)
        stop.set()
        t.join(timeout=5)
        before = max(a for a in answered if a < cut)
        later = [a for a in answered if a > cut]
        return (min(later) if later else time.monotonic()) - before
    finally:
        pdboot("down", str(path))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--cut", type=float, default=20.0, help="seconds the link stays down")
    ap.add_argument("--after", type=float, default=15.0, help="seconds measured after it")
    args = ap.parse_args()
    tb = Testbed.start(["decode", "prefill", "ingress"])
    got: dict[str, list[float]] = {"single ingress": [], "standby + virtual IP": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.runs):
                for standby in (False, True) if i % 2 == 0 else (True, False):
                    key = "standby + virtual IP" if standby else "single ingress"
                    gap = one(tb, Path(tmp), standby, args.cut, args.after)
                    got[key].append(gap)
                    print(f"run {i + 1} {key}: {gap:.1f} s without an answer", flush=True)
    finally:
        tb.stop()
    single, pair = (statistics.median(v) for v in got.values())
    print(f"\nlink cut for {args.cut:g} s, {args.runs} run(s) each, medians:")
    print(f"  single ingress:        {single:6.1f} s without an answer (baseline)")
    print(f"  standby + virtual IP:  {pair:6.1f} s without an answer ({pair / single:.2f}x)")


if __name__ == "__main__":
    main()
