"""Benchmark: time to ready of a first `pdboot up` (nothing on the hosts: no engine image,
no weights) with the weights staged from pdboot's small staging image WHILE the engine image
pulls (weights.stage: true with weights.image), against download-at-engine-start
(weights.stage: false: every engine fetches the model itself once the image is pulled and it
starts), and against the best a first `up` can do: max(image pull, weights) + the rest (the
same `up` with the image present and the weights cached: start, load, router, gate).
All measured in one run.

Links: the testbed's hub caps each host's download (--mbps, a token bucket per client
address shared by that host's connections: a WAN link to the hub); the registry's traffic to
each host is shaped by tc (an HTB class on the host's bridge-side veth matching the
registry's source port) so that the engine image's pull takes --pull-ratio times as long as
the weights: separate bottlenecks, as a registry and the HF CDN are separate sources.

Why --pull-ratio 0.6 by default: an 8B model in bf16 is ~16 GB and vLLM's CUDA image
~10 GB compressed, so the pull takes about 0.6x the weights' time at equal throughput: the
case where doing them one after the other costs the most relative to doing them together
(for a 70B model, ~140 GB, the weights dominate and the pull is ~0.07x; ratios near 1 are
reached with smaller models or a slower registry).

The REAL huggingface_hub client (2.4.0) downloads in every variant: the staging container
(the staging image) or the stand-in engines' loader. Two rtx6000x8 hosts, 1 prefill engine
on g1 and --engines decode engines on g2, router on g1 (its image pulled beforehand). Every
timed run gets a new deployment name and an empty HF cache, and the engine image is removed
from the hosts before it. The staging image stays pulled (each host pulls it once, at the
first staging): it is a few tens of MB against the engine image's 10-20 GB, a pull of ~0.3%
of the engine's; on the testbed both images are ~28 MB (the stand-in engine is no heavier
than huggingface_hub), so pulling it through the registry's shaped link would cost as much
as the engine image's pull, which no real host sees. Variants alternate (A B B A ...).

    python bench/weights.py [--runs 2] [--mbps 0.5] [--pull-ratio 0.6] [--engines 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.testbed import hub, images  # noqa: E402
from tests.testbed.harness import HostSpec, Testbed  # noqa: E402
from tests.testbed.inventory import inventory_dict  # noqa: E402

REGISTRY_PORT = 5000


def write(tb: Testbed, path: Path, name: str, staged: bool, engines: int) -> Path:
    inv = inventory_dict(tb, name=name, prefill=["g1"], decode=["g2"], router="g1")
    env = {"STANDIN_LOAD_SECONDS": "0.5"}
    inv["model"] = hub.PUBLIC_REPO
    inv["prefill"] = {"hosts": ["g1"], "gpus": [[0]], "env": env}
    inv["decode"] = {"hosts": ["g2"], "gpus": [[g] for g in range(engines)], "env": env}
    inv["router"] = {"host": "g1", "prefill_policy": "round_robin", "decode_policy": "round_robin"}
    inv["kv_transfer"] = {"rdma": "auto"}
    inv["weights"] = {
        "stage": staged,
        "endpoint": tb.hub,
        "allow_plain_http": True,
        "image": tb.stage_image,
    }
    inv["container"]["hf_cache"] = f"/var/lib/pdboot/hf-bench-{name}"
    inv["timeouts"]["ready_seconds"] = 900
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def pdboot(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pdboot", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
    )


def up(inv: Path, ev: Path) -> list[dict[str, Any]]:
    # --skip-preflight in every variant: the same steps, the difference is the weights
    res = pdboot("up", str(inv), "--skip-preflight", "--no-speed", "--events", str(ev))
    if res.returncode != 0:
        raise SystemExit(f"{inv.stem}: up rc={res.returncode}\n{(res.stdout + res.stderr)[-4000:]}")
    return [json.loads(line) for line in ev.read_text().splitlines() if line.strip()]


def down(inv: Path) -> None:
    res = pdboot("down", str(inv))
    if res.returncode != 0:
        raise SystemExit(f"{inv.stem}: down rc={res.returncode}\n{res.stdout + res.stderr}")


def image_bytes(tb: Testbed, repo: str, tag: str) -> int:
    """The compressed size of an image's layers in the testbed registry (what a pull moves)."""
    req = urllib.request.Request(
        f"http://{tb.registry}/v2/{repo}/manifests/{tag}",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return sum(int(layer["size"]) for layer in json.loads(r.read())["layers"])


def shape_registry(tb: Testbed, bytes_per_s: float) -> None:
    """The registry's traffic to each host through an HTB class of its own (tc on the
    bridge-side veth: the host's downlink), everything else unshaped."""
    kbit = max(8, int(bytes_per_s * 8 / 1000))
    for h in tb.hosts.values():
        dev = h.veth
        subprocess.run(["tc", "qdisc", "del", "dev", dev, "root"], capture_output=True)
        for cmd in (
            f"qdisc add dev {dev} root handle 1: htb default 30",
            f"class add dev {dev} parent 1: classid 1:10 htb rate {kbit}kbit ceil {kbit}kbit",
            f"class add dev {dev} parent 1: classid 1:30 htb rate 10gbit",
            f"filter add dev {dev} protocol ip parent 1: prio 1 u32 match ip sport "
            f"{REGISTRY_PORT} 0xffff flowid 1:10",
        ):
            subprocess.run(["tc", *cmd.split()], check=True)


def unshape(tb: Testbed) -> None:
    for h in tb.hosts.values():
        subprocess.run(["tc", "qdisc", "del", "dev", h.veth, "root"], capture_output=True)


def fresh_hosts(tb: Testbed) -> None:
    for h in tb.hosts.values():
        h.docker("rmi", "-f", tb.image, check=False)


def one_run(tb: Testbed, work: Path, name: str, staged: bool, engines: int) -> dict[str, Any]:
    inv = write(tb, work / f"{name}.yaml", name, staged, engines)
    fresh_hosts(tb)
    evs = up(inv, work / f"{name}.jsonl")
    total = float(next(e for e in evs if e["event"] == "done")["seconds"])
    pull = max(e["seconds"] for e in evs if e["event"] == "pull_done" and e["image"] == tb.image)
    weights = max((e["seconds"] for e in evs if e["event"] == "weights_done"), default=0.0)
    down(inv)
    # the rest: the same up with the image present and the weights cached
    warm = up(inv, work / f"{name}-warm.jsonl")
    rest = float(next(e for e in warm if e["event"] == "done")["seconds"])
    down(inv)
    return {"up": total, "pull": pull, "weights": weights, "rest": rest}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2, help="runs per variant")
    ap.add_argument("--mbps", type=float, default=0.5, help="hub cap per host, MB/s")
    ap.add_argument(
        "--pull-ratio",
        type=float,
        default=0.6,
        help="image pull time / weights time (sets the registry's rate)",
    )
    ap.add_argument("--engines", type=int, default=4, help="decode engines on g2 (<= 8)")
    args = ap.parse_args()
    tb = Testbed.start([HostSpec("g1", profile="rtx6000x8"), HostSpec("g2", profile="rtx6000x8")])
    try:
        tb.hosts["g1"].pull(tb.router_image)
        for h in tb.hosts.values():
            h.pull(tb.stage_image)
        tb.hub_control("rate", bps=str(int(args.mbps * 1e6)))
        weights_b = sum(len(b) for b in hub.model_files(1).values())
        img_b = image_bytes(tb, images.ENGINE_REPO, images.ENGINE_TAG)
        stage_b = image_bytes(tb, images.STAGE_REPO, images.STAGE_TAG)
        weights_s = weights_b / (args.mbps * 1e6)
        reg_rate = img_b / (args.pull_ratio * weights_s)
        shape_registry(tb, reg_rate)
        work = Path(tempfile.mkdtemp(prefix="pdboot-bench-weights-"))
        order = [bool((i // 2 + i) % 2 == 0) for i in range(2 * args.runs)]  # A B B A ...
        results: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
        for i, staged in enumerate(order):
            r = one_run(tb, work, f"bw{'s' if staged else 'd'}{i}", staged, args.engines)
            results[staged].append(r)
            what = "staged" if staged else "at-start"
            print(
                f"run {i + 1}: {what:<9} up {r['up']:6.1f} s (pull {r['pull']:5.1f} s, "
                f"weights {r['weights']:5.1f} s, rest {r['rest']:5.1f} s)",
                flush=True,
            )

        def med(k: bool, f: str) -> float:
            return statistics.median(r[f] for r in results[k])

        print(
            f"\nrepository {weights_b / 1e6:.1f} MB at {args.mbps} MB/s per host "
            f"(~{weights_s:.1f} s); engine image {img_b / 1e6:.1f} MB, staging image "
            f"{stage_b / 1e6:.1f} MB, registry shaped to {reg_rate / 1e6:.2f} MB/s per host "
            f"(pull ~{args.pull_ratio:.2f}x the weights); 1 prefill on g1 + {args.engines} "
            "decode engines on g2"
        )
        s_up, d_up = med(True, "up"), med(False, "up")
        ideal = max(med(True, "pull"), med(True, "weights")) + med(True, "rest")
        serial = med(True, "pull") + med(True, "weights") + med(True, "rest")
        print(f"  staged (overlapping the pull) median up {s_up:6.1f} s")
        print(f"  download at engine start      median up {d_up:6.1f} s")
        print(
            f"  max(pull, weights) + rest     {ideal:6.1f} s  (pull + weights + rest "
            f"{serial:.1f} s)"
        )
        print(f"ratio download-at-start / staged: {d_up / s_up:.2f}x")
        print(f"ratio staged / (max(pull, weights) + rest): {s_up / ideal:.2f}x")
    finally:
        unshape(tb)
        tb.stop()


if __name__ == "__main__":
    main()
