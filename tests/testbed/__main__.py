"""Command line for the testbed (root, Linux):

    python -m tests.testbed up [--dir .testbed] [--host NAME[:PROFILE]]... [--no-images]
                               [--engine standin|vllm]
    python -m tests.testbed status
    python -m tests.testbed down [--dir .testbed | --k K | --all]
    python -m tests.testbed profiles
    python -m tests.testbed images [--real-vllm] [--pdboot]  # build the test images into the cache

`up` starts a detached testbed (default hosts: decode, prefill, ingress; profile rtx6000x2)
that outlives the command, and writes into --dir: inventory.yaml (a pdboot inventory for it),
env (shell variables: PDT_SSH, PDT_<HOST>_ADDRESS, PDT_REGISTRY, ...) and instance (its
number, for `down`). Everything stays on the testbed's own addresses (10.77.<k>.0/24).
`--engine vllm`: the registry also holds the REAL vLLM CPU image (built once, minutes), the
hosts see the tiny model, the inventory runs real vLLM (`device: cpu`; default host profile
cpu-only: no emulated GPUs, the engines compute on this machine's cores).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from tests.testbed import harness, procs, profiles
from tests.testbed.harness import STATE_ROOT, HostSpec, Testbed, TestbedError


def _up(args: argparse.Namespace) -> int:
    specs = []
    real = args.engine == "vllm"
    for item in args.host or ["decode", "prefill", "ingress"]:
        name, _, profile = item.partition(":")
        specs.append(HostSpec(name, profile=profile or ("cpu-only" if real else "rtx6000x2")))
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        tb = Testbed.start(specs, images_needed=not args.no_images, detached=True, real_vllm=real)
    except TestbedError as e:
        print(f"testbed: {e}", file=sys.stderr)
        return 1
    inv = tb.inventory(out / "inventory.yaml", engine=args.engine)
    env = tb.env()
    env["PDT_SSH"] = " ".join(shlex.quote(a) for a in tb.ssh_argv(next(iter(tb.hosts)))[:-1])
    env["PDT_INVENTORY"] = str(inv.resolve())
    (out / "env").write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()))
    (out / "instance").write_text(f"{tb.k}\n")
    print(f"testbed {tb.k} up in {tb.startup_seconds:.1f}s (registry {tb.registry})")
    for h in tb.hosts.values():
        print(
            f"  {h.name:<10} {h.address:<14} {h.profile['profile']:<22} "
            f"root@{h.address} (ssh: $PDT_SSH root@{h.address})"
        )
    print(f"inventory: {inv}\nenv:       {out / 'env'}  (source it)")
    return 0


def _images(args: argparse.Namespace) -> int:
    """Build (or find cached) every test image, on a throw-away one-host testbed: set-up
    runs this so that the first test run does not pay for the builds."""
    import time

    t0 = time.monotonic()
    try:
        tb = Testbed.start([HostSpec("builder", profile="cpu-only")], real_vllm=args.real_vllm)
    except TestbedError as e:
        print(f"testbed: {e}", file=sys.stderr)
        return 1
    try:
        if args.pdboot:
            tb.pdboot_image()
    finally:
        tb.stop()
    extras = [
        x
        for x, on in (
            ("the real vLLM CPU image and model", args.real_vllm),
            ("this checkout's pdboot image", args.pdboot),
        )
        if on
    ]
    print(
        f"testbed images ready in {time.monotonic() - t0:.0f}s"
        f"{' (with ' + ' and '.join(extras) + ')' if extras else ''}"
    )
    return 0


def _down(args: argparse.Namespace) -> int:
    if args.all:
        done = harness.down(None)
    else:
        k = args.k
        if k is None:
            marker = Path(args.dir) / "instance"
            if not marker.exists():
                print(f"testbed: no {marker}; give --k K or --all", file=sys.stderr)
                return 1
            k = int(marker.read_text())
        done = harness.down(k)
        (Path(args.dir) / "instance").unlink(missing_ok=True)
    print(f"testbed: removed {', '.join(map(str, done)) or 'nothing'}")
    return 0


def _status(args: argparse.Namespace) -> int:
    dirs = sorted(STATE_ROOT.glob("tb*")) if STATE_ROOT.exists() else []
    if not dirs:
        print("testbed: none running")
    for d in dirs:
        state = harness.read_state(d)
        if state is None:
            print(f"{d}: (no state)")
            continue
        kind = "detached" if state.get("detached") else f"owned by pid {state['owner']['pid']}"
        print(f"testbed {state['k']} ({kind}), registry {state['registry']}, {d}")
        for h in state["hosts"].values():
            alive = [n for n, p in h["procs"].items() if procs.alive(procs.Proc.from_json(p))]
            print(f"  {h['name']:<10} {h['address']:<14} running: {', '.join(alive) or '-'}")
    return 0


def _profiles(args: argparse.Namespace) -> int:
    for name, p in profiles.PROFILES.items():
        print(f"{name:<22} {p['description']}")
    if args.json:
        print(json.dumps(profiles.PROFILES, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.testbed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a detached testbed")
    up.add_argument("--dir", default=".testbed")
    up.add_argument("--host", action="append", help="NAME or NAME:PROFILE (repeat)")
    up.add_argument("--no-images", action="store_true", help="skip building/pushing images")
    up.add_argument(
        "--engine",
        choices=("standin", "vllm"),
        default="standin",
        help="the engine the inventory runs: the EMULATED stand-in or real vLLM on CPU",
    )
    down = sub.add_parser("down", help="tear a testbed down")
    down.add_argument("--dir", default=".testbed")
    down.add_argument("--k", type=int)
    down.add_argument("--all", action="store_true", help="every testbed on this machine")
    sub.add_parser("status", help="list testbeds on this machine")
    img = sub.add_parser("images", help="build the test images into the cache (set-up)")
    img.add_argument(
        "--pdboot",
        action="store_true",
        help="also this checkout's pdboot image (the watch service's tests run it)",
    )
    img.add_argument(
        "--real-vllm",
        action="store_true",
        help="also the real vLLM CPU image and its tiny model (minutes, once)",
    )
    prof = sub.add_parser("profiles", help="list host profiles")
    prof.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    return {"up": _up, "down": _down, "status": _status, "profiles": _profiles, "images": _images}[
        args.cmd
    ](args)


if __name__ == "__main__":
    sys.exit(main())
