"""Benchmark: time to ready of a first `pdboot up` with the weights staged once per host
(weights.stage: true, the default) against today's download-at-start (weights.stage: false:
every engine fetches the model itself when it starts), measured in the same run.

The testbed's hub (tests/testbed/hub.py) caps each host's download rate (--mbps, a token
bucket per client address, shared by all of that host's connections) to stand for a WAN
link; the REAL huggingface_hub client (2.4.0, in the engine image) downloads in both
variants: the staging container in one, the stand-in engines' loader in the other. Two
rtx6000x8 hosts, 1 prefill engine on g1 and --engines decode engines on g2, router on g1.
Images are pulled before the timed runs; every run gets a new deployment name and an
empty HF cache directory, so every run downloads the whole repository. Variants alternate
(A B B A ...). Printed: each run's `up` seconds (pdboot's own Done event) and the bytes
the hub sent, the medians, and the ratio download-at-start / staged.

    python bench/weights.py [--runs 2] [--mbps 2] [--engines 4]   (root; own testbed)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.testbed import hub  # noqa: E402
from tests.testbed.harness import HostSpec, Testbed  # noqa: E402
from tests.testbed.inventory import inventory_dict  # noqa: E402


def write(tb: Testbed, path: Path, name: str, staged: bool, engines: int,
          seed: bool = False) -> Path:
    inv = inventory_dict(tb, name=name, prefill=["g1"], decode=["g2"], router="g1")
    env = {"STANDIN_LOAD_SECONDS": "0.5"}
    inv["model"] = hub.PUBLIC_REPO
    inv["prefill"] = {"hosts": ["g1"], "gpus": [[0]], "env": env}
    inv["decode"] = {"hosts": ["g2"], "gpus": [[g] for g in range(engines)], "env": env}
    inv["router"] = {"host": "g1", "prefill_policy": "round_robin",
                     "decode_policy": "round_robin"}
    inv["kv_transfer"] = {"rdma": "auto"}
    inv["weights"] = {"stage": staged, "endpoint": tb.hub, "allow_plain_http": True,
                      "seed": "first_host" if seed else "none"}
    inv["container"]["hf_cache"] = f"/var/lib/pdboot/hf-bench-{name}"
    inv["timeouts"]["ready_seconds"] = 900
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def pdboot(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pdboot", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=timeout)


def hub_bytes(tb: Testbed) -> int:
    return sum(e["bytes"] for e in hub.read_log(tb.hub_log) if "/resolve/" in e["path"])


def one_run(tb: Testbed, work: Path, name: str, staged: bool, engines: int,
            seed: bool = False) -> dict[str, Any]:
    inv = write(tb, work / f"{name}.yaml", name, staged, engines, seed)
    ev = work / f"{name}.jsonl"
    sent0 = hub_bytes(tb)
    # --skip-preflight in both variants: the same steps, the difference is the weights
    res = pdboot("up", str(inv), "--skip-preflight", "--no-speed", "--events", str(ev))
    events = [json.loads(line) for line in ev.read_text().splitlines() if line.strip()]
    done = next(e for e in events if e["event"] == "done")
    sent = hub_bytes(tb) - sent0
    down = pdboot("down", str(inv))
    if res.returncode != 0 or down.returncode != 0:
        raise SystemExit(f"{name}: up rc={res.returncode} down rc={down.returncode}\n"
                         f"{(res.stdout + res.stderr)[-4000:]}")
    return {"seconds": float(done["seconds"]), "hub_bytes": sent}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2, help="runs per variant")
    ap.add_argument("--mbps", type=float, default=2.0, help="hub cap per host, MB/s")
    ap.add_argument("--engines", type=int, default=4, help="decode engines on g2 (<= 8)")
    ap.add_argument("--seed", action="store_true",
                    help="also time weights.seed: first_host (g2 copies from g1)")
    args = ap.parse_args()
    tb = Testbed.start([HostSpec("g1", profile="rtx6000x8"),
                        HostSpec("g2", profile="rtx6000x8")])
    try:
        for h in tb.hosts.values():
            h.pull(tb.image)
        tb.hosts["g1"].pull(tb.router_image)
        tb.hub_control("rate", bps=str(int(args.mbps * 1e6)))
        work = Path(tempfile.mkdtemp(prefix="pdboot-bench-weights-"))
        order = [bool((i // 2 + i) % 2 == 0) for i in range(2 * args.runs)]  # A B B A ...
        results: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
        for i, staged in enumerate(order):
            name = f"bw{'s' if staged else 'd'}{i}"
            r = one_run(tb, work, name, staged, args.engines)
            results[staged].append(r)
            what = "staged" if staged else "at-start"
            print(f"run {i + 1}: {what:<9} up {r['seconds']:6.1f} s, hub sent "
                  f"{r['hub_bytes'] / 1e6:6.1f} MB", flush=True)
        size = sum(len(b) for b in hub.model_files(1).values())
        med = {k: statistics.median(r["seconds"] for r in v) for k, v in results.items()}
        print(f"\nrepository {size / 1e6:.1f} MB; hub cap {args.mbps} MB/s per host; "
              f"1 prefill on g1 + {args.engines} decode engines on g2")
        for k, label in ((True, "staged once per host"), (False, "download at engine start")):
            sent = statistics.median(r["hub_bytes"] for r in results[k])
            print(f"  {label:<25} median up {med[k]:6.1f} s, hub sent {sent / 1e6:5.1f} MB")
        print(f"ratio download-at-start / staged: {med[False] / med[True]:.2f}x")
        if args.seed:  # after the others: g2 fetches from g1, the hub sends to g1 only
            seeded = [one_run(tb, work, f"bwe{i}", True, args.engines, seed=True)
                      for i in range(args.runs)]
            m = statistics.median(r["seconds"] for r in seeded)
            sent = statistics.median(r["hub_bytes"] for r in seeded)
            print(f"  {'seeded from g1':<25} median up {m:6.1f} s, hub sent {sent / 1e6:5.1f} MB")
            print(f"ratio staged / seeded: {med[True] / m:.2f}x")
    finally:
        tb.stop()


if __name__ == "__main__":
    main()
