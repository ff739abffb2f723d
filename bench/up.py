"""Benchmark: `pdboot up` / `pdboot down` against a hand-written ssh + docker compose script.

On a testbed (images already pulled on every host, stand-in engines that are ready at once)
both do the same steps in the same order, measured in the same run, alternating:
pull (no-op, images present) on every host, ship each host's compose file, start decode and
wait for /health, start prefill and wait, start the router and wait for /health and every
worker in /workers, one chat completion through the router. Teardown: router, prefill,
decode. pdboot additionally inspects digests, checks labels/hashes and proves the KV pull.

Readiness noticed: decode engines that load for a few seconds; a 20 ms poller in this
process records when /health first answers 200, and the time `pdboot up` prints
"ready decode@..." is compared with it.

Time to ready: both tiers load for --load seconds (15 by default); `pdboot up` starts them
together, so it should be ready after about one load time plus a few seconds, not two.

    python bench/up.py [--runs 3] [--load 15] [--only-ready]
                                       (root; starts and stops its own testbed)

Targets: up within 1.5x of the script, readiness noticed within 1 s, down under 1.5x,
time to ready within the slowest tier's load + 5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
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

POLL = 0.2  # the script's curl loop and pdboot's poll_interval_seconds


def write_inventory(tb: Any, path: Path, name: str, prefill: list[str], decode: list[str],
                    load_seconds: float = 0.0, prefill_load: float = 0.0) -> Path:
    env = {"STANDIN_LOAD_SECONDS": str(load_seconds)}
    inv = inventory_dict(
        tb, name=name, prefill=prefill, decode=decode, router="r1",
        overrides={
            "prefill": {"env": {"STANDIN_LOAD_SECONDS": str(prefill_load)}},
            "decode": {"env": env},
            "timeouts": {"poll_interval_seconds": POLL},
        },
    )
    used = set(prefill + decode + ["r1"])
    inv["hosts"] = {h: v for h, v in inv["hosts"].items() if h in used}
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def script_for(tb: Any, inv: dict[str, Any], rendered: Path) -> tuple[str, str]:
    """The hand-written equivalent: (up script, down script) in bash."""
    ssh = (f"ssh -F /dev/null -i {tb.identity_file} -o UserKnownHostsFile={tb.known_hosts} "
           "-o StrictHostKeyChecking=yes -o BatchMode=yes")
    name = inv["name"]
    d = f"/var/lib/pdboot/{name}"
    proj = f"pdboot-{name}"
    addr = {h: v["address"] for h, v in inv["hosts"].items()}
    dec, pre, rtr = inv["decode"]["hosts"], inv["prefill"]["hosts"], inv["router"]["host"]
    compose = f"docker compose -p {proj} -f {d}/compose.yaml"
    lines = ["set -euo pipefail", f"SSH={shlex.quote(ssh)}"]

    def on(host: str, cmd: str) -> str:
        return f"$SSH root@{addr[host]} {shlex.quote(cmd)}"

    def parallel(cmds: list[str]) -> list[str]:
        return [f"{c} &" for c in cmds] + ["wait"]

    def wait_health(url: str) -> str:
        return f"until curl -sf -o /dev/null {url}; do sleep {POLL}; done"

    images = {h: (inv["router_image"] if h == rtr else inv["image"]) for h in addr}
    lines += parallel([on(h, f"docker pull -q {images[h]} >/dev/null") for h in addr])
    lines += parallel([
        f"{on(h, f'mkdir -p -m 700 {d} && cat > {d}/compose.yaml')} < {rendered / h / 'compose.yaml'}"
        for h in addr
    ])
    for tier, hosts, port in (("decode", dec, 8201), ("prefill", pre, 8200)):
        lines += parallel([on(h, f"{compose} up -d {tier}") for h in hosts])
        lines += [wait_health(f"http://{addr[h]}:{port}/health") for h in hosts]
    lines.append(on(rtr, f"{compose} up -d router"))
    r = f"http://{addr[rtr]}:8000"
    lines.append(wait_health(f"{r}/health"))
    n = len(dec) + len(pre)
    lines.append(f"until [ \"$(curl -sf {r}/workers | grep -o '\"is_healthy\":true' | wc -l)\""
                 f" -ge {n} ]; do sleep {POLL}; done")
    body = ('{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"hi"}],'
            '"max_tokens":8}')
    lines.append(f"curl -sf {r}/v1/chat/completions -H 'Content-Type: application/json' "
                 f"-d '{body}' >/dev/null")
    up = "\n".join(lines) + "\n"
    down = ["set -euo pipefail", f"SSH={shlex.quote(ssh)}"]
    for hosts, svc in (([rtr], "router"), (pre, "prefill"), (dec, "decode")):
        down += parallel([on(h, f"{compose} rm -s -f {svc} >/dev/null 2>&1") for h in hosts])
    return up, "\n".join(down) + "\n"


def timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.monotonic()
    res = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    dt = time.monotonic() - t0
    if res.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed rc={res.returncode}:\n{res.stdout}\n{res.stderr}")
    return dt


def pdboot(*args: str) -> list[str]:
    return [sys.executable, "-m", "pdboot", *args]


def readiness_latency(tb: Any, inv: Path, decode_url: str) -> float:
    """Seconds between /health first answering 200 and `pdboot up` saying so."""
    first_ok: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            try:
                with urllib.request.urlopen(decode_url, timeout=0.5) as r:
                    if r.status == 200:
                        first_ok.append(time.monotonic())
                        return
            except OSError:
                pass
            time.sleep(0.02)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    p = subprocess.Popen(pdboot("up", str(inv), "--skip-preflight"), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    noticed = None
    assert p.stdout is not None
    for line in p.stdout:
        if noticed is None and line.startswith("ready decode@"):
            noticed = time.monotonic()
    p.wait()
    stop.set()
    if p.returncode != 0 or noticed is None or not first_ok:
        raise SystemExit("readiness run failed")
    subprocess.run(pdboot("down", str(inv)), capture_output=True, cwd=ROOT)
    return noticed - first_ok[0]


def time_to_ready(tb: Any, work: Path, load: float) -> tuple[float, float, float]:
    """(wall seconds of `pdboot up`, seconds until every engine was ready, seconds the
    router then took) with both tiers loading for ``load`` seconds; from `up --events`."""
    inv = write_inventory(tb, work / "benchttr.yaml", "benchttr", ["p1"], ["d1"], load, load)
    events = work / "benchttr-events.jsonl"
    wall = timed(pdboot("up", str(inv), "--skip-preflight", "--events", str(events)))
    docs = [json.loads(line) for line in events.read_text().splitlines()]
    engines = next(d for d in docs if d["event"] == "tier_ready" and "decode" in d["tiers"])
    router = next(d for d in docs if d["event"] == "tier_ready" and d["tiers"] == ["router"])
    subprocess.run(pdboot("down", str(inv)), capture_output=True, cwd=ROOT)
    return wall, float(engines["seconds"]), float(router["seconds"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--load", type=float, default=15.0, help="model load seconds per tier")
    ap.add_argument("--only-ready", action="store_true", help="only the time-to-ready runs")
    args = ap.parse_args()
    tb = Testbed.start(["d1", "d2", "p1", "p2", "r1"])
    results: dict[str, dict[str, list[float]]] = {}
    lat: list[float] = []
    try:
        for h in tb.hosts.values():
            h.pull(tb.image)
        tb.hosts["r1"].pull(tb.router_image)
        work = Path(tempfile.mkdtemp(prefix="pdboot-bench-"))
        ttr = [time_to_ready(tb, work, args.load) for _ in range(args.runs)]
        for label, pre, dec in () if args.only_ready else (
            ("1P1D", ["p1"], ["d1"]), ("2P2D", ["p1", "p2"], ["d1", "d2"])
        ):
            name = f"bench{label.lower()}"
            inv = write_inventory(tb, work / f"{name}.yaml", name, pre, dec)
            rendered = work / f"{name}-rendered"
            subprocess.run(pdboot("render", str(inv), "--out", str(rendered)), check=True,
                           capture_output=True, cwd=ROOT)
            up_sh, down_sh = script_for(tb, yaml.safe_load(inv.read_text()), rendered)
            (work / f"{name}-up.sh").write_text(up_sh)
            (work / f"{name}-down.sh").write_text(down_sh)
            r: dict[str, list[float]] = {k: [] for k in ("pd_up", "sh_up", "pd_down", "sh_down")}
            for _ in range(args.runs):
                r["sh_up"].append(timed(["bash", str(work / f"{name}-up.sh")]))
                r["sh_down"].append(timed(["bash", str(work / f"{name}-down.sh")]))
                r["pd_up"].append(timed(pdboot("up", str(inv), "--skip-preflight")))
                r["pd_down"].append(timed(pdboot("down", str(inv))))
            results[label] = r
        slow = write_inventory(tb, work / "benchready.yaml", "benchready", ["p1"], ["d1"], 3.0)
        lat = [readiness_latency(tb, slow, f"http://{tb.hosts['d1'].address}:8201/health")
               for _ in range(0 if args.only_ready else args.runs)]
    finally:
        tb.stop()

    walls, engines, routers = ([t[i] for t in ttr] for i in range(3))
    print(f"time to ready, both tiers loading {args.load:g}s (1P1D), median of {args.runs} runs: "
          f"engines ready after {statistics.median(engines):.1f}s (max {max(engines):.1f}s), "
          f"then the router after {statistics.median(routers):.1f}s, "
          f"`pdboot up` {statistics.median(walls):.1f}s in all (max {max(walls):.1f}s); "
          f"one tier after the other would need at least {2 * args.load:g}s for the engines")
    if args.only_ready:
        return

    print(f"pdboot up/down vs ssh+docker compose script, median of {args.runs} runs "
          "(images present, stand-ins ready at once)")
    print(f"{'':6} {'pdboot up':>10} {'script up':>10} {'ratio':>6}   "
          f"{'pdboot down':>11} {'script down':>11} {'ratio':>6}")
    for label, r in results.items():
        m = {k: statistics.median(v) for k, v in r.items()}
        print(f"{label:6} {m['pd_up']:9.2f}s {m['sh_up']:9.2f}s {m['pd_up'] / m['sh_up']:5.2f}x   "
              f"{m['pd_down']:10.2f}s {m['sh_down']:10.2f}s {m['pd_down'] / m['sh_down']:5.2f}x")
    print(f"readiness noticed after /health first answered 200: median "
          f"{statistics.median(lat):.2f}s, max {max(lat):.2f}s (poll interval {POLL}s)")


if __name__ == "__main__":
    main()
