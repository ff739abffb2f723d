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

Several engines per host ("2x4E"): two rtx6000x8 hosts (8 emulated GPUs each), 4 prefill
engines on g1 and 4 decode engines on g2 (TP 1), the router on r1; the script starts a host's
engines with one `docker compose up -d decode decode-1 ...` and waits for each /health.
After pdboot's runs, the engines' StartedAt timestamps show a host's engines started
together (their spread), not one after another.

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
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pdboot.inventory.load import parse_inventory  # noqa: E402
from pdboot.plan.build import build_plan  # noqa: E402
from tests.testbed.harness import HostSpec, Testbed  # noqa: E402
from tests.testbed.inventory import inventory_dict  # noqa: E402

POLL = 0.2  # the script's curl loop and pdboot's poll_interval_seconds


# several engines per host: 4 prefill engines on g1, 4 decode engines on g2 (TP 1)
ENGINES = {
    "prefill": {"engines_per_host": 4, "gpus": [0, 1, 2, 3]},
    "decode": {"engines_per_host": 4, "gpus": [4, 5, 6, 7]},
}


def write_inventory(
    tb: Any,
    path: Path,
    name: str,
    prefill: list[str],
    decode: list[str],
    load_seconds: float = 0.0,
    prefill_load: float = 0.0,
    tiers: dict[str, dict[str, Any]] | None = None,
) -> Path:
    env = {"STANDIN_LOAD_SECONDS": str(load_seconds)}
    extra = tiers or {}
    inv = inventory_dict(
        tb,
        name=name,
        prefill=prefill,
        decode=decode,
        router="r1",
        overrides={
            "prefill": {
                "env": {"STANDIN_LOAD_SECONDS": str(prefill_load)},
                **extra.get("prefill", {}),
            },
            "decode": {"env": env, **extra.get("decode", {})},
            "timeouts": {"poll_interval_seconds": POLL},
        },
    )
    used = set(prefill + decode + ["r1"])
    inv["hosts"] = {h: v for h, v in inv["hosts"].items() if h in used}
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def script_for(tb: Any, inv: dict[str, Any], rendered: Path) -> tuple[str, str]:
    """The hand-written equivalent: (up script, down script) in bash."""
    ssh = (
        f"ssh -F /dev/null -i {tb.identity_file} -o UserKnownHostsFile={tb.known_hosts} "
        "-o StrictHostKeyChecking=yes -o BatchMode=yes"
    )
    name = inv["name"]
    d = f"/var/lib/pdboot/{name}"
    proj = f"pdboot-{name}"
    addr = {h: v["address"] for h, v in inv["hosts"].items()}
    dec, pre, rtr = inv["decode"]["hosts"], inv["prefill"]["hosts"], inv["router"]["host"]
    plan = build_plan(parse_inventory(yaml.safe_dump(inv)))
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
    ship = f"mkdir -p -m 700 {d} && cat > {d}/compose.yaml"
    lines += parallel([f"{on(h, ship)} < {rendered / h / 'compose.yaml'}" for h in addr])
    for tier, hosts in (("decode", dec), ("prefill", pre)):
        svcs = {h: [s for s in plan.hosts[h].services if s.role == tier] for h in hosts}
        lines += parallel(
            [on(h, f"{compose} up -d {' '.join(s.name for s in svcs[h])}") for h in hosts]
        )
        lines += [wait_health(s.health_url) for h in hosts for s in svcs[h]]
    lines.append(on(rtr, f"{compose} up -d router"))
    # the router listens on its host's loopback (pdboot puts a proxy in front, which the
    # manual way skips): its checks run on that host
    r = "http://127.0.0.1:8081"
    lines.append(on(rtr, wait_health(f"{r}/health")))
    n = len([s for s in plan.services() if s.is_engine])
    lines.append(
        on(
            rtr,
            f'until [ "$(curl -sf {r}/workers | grep -o \'"is_healthy":true\' '
            f'| wc -l)" -ge {n} ]; do sleep {POLL}; done',
        )
    )
    body = '{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"hi"}],"max_tokens":8}'
    lines.append(
        on(
            rtr,
            f"curl -sf {r}/v1/chat/completions -H 'Content-Type: application/json' "
            f"-d '{body}' >/dev/null",
        )
    )
    up = "\n".join(lines) + "\n"
    down = ["set -euo pipefail", f"SSH={shlex.quote(ssh)}"]
    for hosts, role in (([rtr], "router"), (pre, "prefill"), (dec, "decode")):
        names = {
            h: " ".join(s.name for s in plan.hosts[h].services if s.role == role) for h in hosts
        }
        down += parallel([on(h, f"{compose} rm -s -f {names[h]} >/dev/null 2>&1") for h in hosts])
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
    p = subprocess.Popen(
        pdboot("up", str(inv), "--skip-preflight"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
    )
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


def start_spread(tb: Any, host: str, deployment: str, role: str) -> tuple[int, float]:
    """(how many, seconds between the first and the last StartedAt) of a role's
    containers on a host: the engines of a host start together when this is small."""
    h = tb.hosts[host]
    ids = h.docker(
        "ps",
        "-q",
        "--filter",
        f"label=io.pdboot.deployment={deployment}",
        "--filter",
        f"label=io.pdboot.role={role}",
    ).stdout.split()
    stamps = h.docker("inspect", "--format", "{{.State.StartedAt}}", *ids).stdout.split()
    ts = sorted(datetime.fromisoformat(s[:26]) for s in stamps)
    return len(ts), (ts[-1] - ts[0]).total_seconds()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--load", type=float, default=15.0, help="model load seconds per tier")
    ap.add_argument("--only-ready", action="store_true", help="only the time-to-ready runs")
    ap.add_argument(
        "--only-engines",
        action="store_true",
        help="only the 2 hosts x 4 engines per tier comparison",
    )
    args = ap.parse_args()
    eight = [HostSpec("g1", profile="rtx6000x8"), HostSpec("g2", profile="rtx6000x8")]
    names: list[Any] = (
        ["r1", *eight]
        if args.only_engines
        else ["d1", "d2", "p1", "p2", "r1", *([] if args.only_ready else eight)]
    )
    tb = Testbed.start(names)
    spreads: list[tuple[str, int, float]] = []
    results: dict[str, dict[str, list[float]]] = {}
    lat: list[float] = []
    try:
        for h in tb.hosts.values():
            h.pull(tb.image)
        tb.hosts["r1"].pull(tb.router_image)
        work = Path(tempfile.mkdtemp(prefix="pdboot-bench-"))
        ttr = (
            []
            if args.only_engines
            else [time_to_ready(tb, work, args.load) for _ in range(args.runs)]
        )
        cases: list[tuple[str, list[str], list[str], dict[str, Any] | None]] = []
        if not args.only_ready and not args.only_engines:
            cases += [("1P1D", ["p1"], ["d1"], None), ("2P2D", ["p1", "p2"], ["d1", "d2"], None)]
        if not args.only_ready:
            cases.append(("2x4E", ["g1"], ["g2"], ENGINES))
        for label, pre, dec, tiers in cases:
            name = f"bench{label.lower()}"
            inv = write_inventory(tb, work / f"{name}.yaml", name, pre, dec, tiers=tiers)
            rendered = work / f"{name}-rendered"
            subprocess.run(
                pdboot("render", str(inv), "--out", str(rendered)),
                check=True,
                capture_output=True,
                cwd=ROOT,
            )
            up_sh, down_sh = script_for(tb, yaml.safe_load(inv.read_text()), rendered)
            (work / f"{name}-up.sh").write_text(up_sh)
            (work / f"{name}-down.sh").write_text(down_sh)
            r: dict[str, list[float]] = {k: [] for k in ("pd_up", "sh_up", "pd_down", "sh_down")}
            for _ in range(args.runs):
                r["sh_up"].append(timed(["bash", str(work / f"{name}-up.sh")]))
                r["sh_down"].append(timed(["bash", str(work / f"{name}-down.sh")]))
                r["pd_up"].append(timed(pdboot("up", str(inv), "--skip-preflight")))
                if tiers is not None:
                    for host, role in (("g1", "prefill"), ("g2", "decode")):
                        spreads.append((f"{role} on {host}", *start_spread(tb, host, name, role)))
                r["pd_down"].append(timed(pdboot("down", str(inv))))
            results[label] = r
        slow = write_inventory(tb, work / "benchready.yaml", "benchready", ["p1"], ["d1"], 3.0)
        lat = [
            readiness_latency(tb, slow, f"http://{tb.hosts['d1'].address}:8201/health")
            for _ in range(0 if args.only_ready or args.only_engines else args.runs)
        ]
    finally:
        tb.stop()
    report(args, ttr, results, lat, spreads)


def report(
    args: Any,
    ttr: list[tuple[float, float, float]],
    results: dict[str, dict[str, list[float]]],
    lat: list[float],
    spreads: list[tuple[str, int, float]],
) -> None:
    if not ttr:
        table(args, results)
        show_spreads(spreads)
        return

    walls, engines, routers = ([t[i] for t in ttr] for i in range(3))
    print(
        f"time to ready, both tiers loading {args.load:g}s (1P1D), median of {args.runs} runs: "
        f"engines ready after {statistics.median(engines):.1f}s (max {max(engines):.1f}s), "
        f"then the router after {statistics.median(routers):.1f}s, "
        f"`pdboot up` {statistics.median(walls):.1f}s in all (max {max(walls):.1f}s); "
        f"one tier after the other would need at least {2 * args.load:g}s for the engines"
    )
    if args.only_ready:
        return
    table(args, results)
    show_spreads(spreads)
    print(
        f"readiness noticed after /health first answered 200: median "
        f"{statistics.median(lat):.2f}s, max {max(lat):.2f}s (poll interval {POLL}s)"
    )


def show_spreads(spreads: list[tuple[str, int, float]]) -> None:
    for what, n, spread in spreads:
        print(f"2x4E: {n} {what} started within {spread:.2f}s of each other (StartedAt)")


def table(args: Any, results: dict[str, dict[str, list[float]]]) -> None:
    print(
        f"pdboot up/down vs ssh+docker compose script, median of {args.runs} runs "
        "(images present, stand-ins ready at once)"
    )
    print(
        f"{'':6} {'pdboot up':>10} {'script up':>10} {'ratio':>6}   "
        f"{'pdboot down':>11} {'script down':>11} {'ratio':>6}"
    )
    for label, r in results.items():
        m = {k: statistics.median(v) for k, v in r.items()}
        print(
            f"{label:6} {m['pd_up']:9.2f}s {m['sh_up']:9.2f}s {m['pd_up'] / m['sh_up']:5.2f}x   "
            f"{m['pd_down']:10.2f}s {m['sh_down']:10.2f}s {m['pd_down'] / m['sh_down']:5.2f}x"
        )


if __name__ == "__main__":
    main()
