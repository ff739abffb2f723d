"""Benchmark: 1 prefill x 1 decode to a new vLLM build (or, `--change settings`, the decode's
settings changed), through degraded mode against the outage (issue 43, point 2).

On a 2-host testbed (p1: prefill, router and proxy; d1: decode; stand-in engines loading in
0.5 s, each request held 0.3 s on its decode, refusing a NIXL pair whose version strings
differ) a client loop sends a short completion through the endpoint every 50 ms while
`pdboot up` moves the engines between the stand-in image (0.33.0) and its nightly
(0.33.0+nightly.1). Per run, from a fresh deployment, alternately in the same run:

- ``degraded``: `up` as it is now (no flag): each tier serves alone while the other is
  replaced, then P/D again;
- ``outage``: today's behaviour before issue 43 point 2, asked for: `up --no-rolling --yes`
  (every engine replaced at once, the recreate path);
- ``baseline`` (with ``--baseline PATH``): another checkout's `up --yes` (say main before
  this change, whose tier of one took the outage path by itself).

With ``--change settings`` the change keeps NIXL compatibility: the decode's environment
flips between two values, so only the decode is replaced; ``baseline`` is then the checkout
whose roll took the tier of one down (main before the change that sends it through degraded
mode, asked with --yes).

Printed per case: failed/sent requests, seconds between the first and the last failed
request, seconds served degraded (what `up` reports), the `up` exit code and seconds. Nothing
timed is asserted anywhere; compare the modes within one run.

    python bench/tier_upgrade.py [--runs 1] [--change build|settings] [--baseline PATH]
                                 [--json FILE]   (root; starts and stops its own testbed)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.testbed.harness import Testbed  # noqa: E402
from tests.testbed.images import STANDIN_NIGHTLY_TAG  # noqa: E402
from tests.testbed.inventory import TEST_MODEL  # noqa: E402
from tests.testbed.rolling_load import (  # noqa: E402
    CHECKOUT,
    ClientLoop,
    Counts,
    checkout_cli,
    inventory,
)

HOSTS = ["p1", "d1"]
DEGRADED = re.compile(r"P/D again after ([0-9.]+) s degraded")


@dataclass
class TimedCounts(Counts):
    """Counts, with when each failed request ended (monotonic seconds)."""

    failed_at: list[float] = field(default_factory=list)

    def add(self, ok: bool, why: str = "") -> None:
        super().add(ok, why)
        if not ok:
            with self.lock:
                self.failed_at.append(time.monotonic())


@dataclass
class Case:
    mode: str  # degraded | outage | baseline
    to: str  # the build moved to
    rc: int
    up_s: float
    sent: int
    failed: int
    failing_s: float  # first to last failed request (0: none failed)
    degraded_s: float | None  # what `up` reported (None: no degraded phase)
    errors: dict[str, int]


def under_load(tb: Any, mode: str, inv: Path, extra: list[str], to: str) -> Case:
    endpoint = f"http://{tb.hosts['p1'].address}:8000"
    loop = ClientLoop(endpoint, TEST_MODEL)
    loop.counts = TimedCounts()
    with loop:
        time.sleep(1.0)
        t0 = time.monotonic()
        res = checkout_cli()("up", str(inv), "--no-speed", *extra)
        took = time.monotonic() - t0
        time.sleep(1.0)
    c = loop.counts
    assert isinstance(c, TimedCounts)
    out = res.stdout + res.stderr
    m = DEGRADED.search(out)
    failing = max(c.failed_at) - min(c.failed_at) if c.failed_at else 0.0
    if res.returncode != 0:
        print(f"--- {mode}: up exited {res.returncode}\n{out[-3000:]}", flush=True)
    return Case(
        mode,
        to,
        res.returncode,
        took,
        c.served + c.failed,
        c.failed,
        failing,
        float(m.group(1)) if m else None,
        dict(c.errors),
    )


def one_run(
    tb: Any, work: Path, modes: list[tuple[str, Path, list[str]]], change: str = "build"
) -> list[Case]:
    """A fresh 1P1D deployment, then each mode in turn, the build (or the decode's settings)
    flipping each time."""
    base = inventory(tb, work / "inv.yaml", prefill=["p1"], decode=["d1"])
    if change == "settings":
        other = inventory(
            tb, work / "b.yaml", prefill=["p1"], decode=["d1"], decode_env={"PDBOOT_BENCH": "b"}
        )
        targets = [(other, "decode env b"), (base, "decode env a")]
    else:
        nightly = inventory(
            tb, work / "nightly.yaml", tag=STANDIN_NIGHTLY_TAG, prefill=["p1"], decode=["d1"]
        )
        targets = [(nightly, "0.33.0+nightly.1"), (base, "0.33.0")]
    res = checkout_cli()("up", str(base), "--skip-preflight", "--no-speed")
    if res.returncode != 0:
        raise RuntimeError(f"base up failed:\n{res.stdout}\n{res.stderr}")
    out: list[Case] = []
    for i, (mode, checkout, extra) in enumerate(modes):
        inv, to = targets[i % 2]
        CHECKOUT["root"] = checkout
        try:
            out.append(under_load(tb, mode, inv, extra, to))
        finally:
            CHECKOUT["root"] = ROOT
        print(f"... {mode} to {to} done", flush=True)
    down = checkout_cli()("down", str(base))
    if down.returncode != 0:
        raise RuntimeError(f"down failed:\n{down.stdout}\n{down.stderr}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--baseline", type=Path, default=None, help="a pdboot checkout to compare")
    ap.add_argument("--json", type=Path, default=None, help="write every case here")
    ap.add_argument("--change", choices=("build", "settings"), default="build")
    args = ap.parse_args()
    modes = [("degraded", ROOT, []), ("outage", ROOT, ["--no-rolling", "--yes"])]
    if args.baseline is not None:
        modes.append(("baseline", args.baseline.resolve(), ["--yes"]))
    cases: list[Case] = []
    with Testbed.start(HOSTS) as tb:
        work = tb.dir / "bench-tier-upgrade"
        work.mkdir(parents=True, exist_ok=True)
        for _ in range(args.runs):
            cases += one_run(tb, work, modes, args.change)
    print(
        f"\n{'mode':<9} {'to':<17} {'failed/sent':>12} {'failing s':>9} {'degraded s':>10} "
        f"{'up s':>6} {'rc':>3}  errors"
    )
    for c in cases:
        deg = "-" if c.degraded_s is None else f"{c.degraded_s:.1f}"
        print(
            f"{c.mode:<9} {c.to:<17} {f'{c.failed}/{c.sent}':>12} {c.failing_s:9.1f} "
            f"{deg:>10} {c.up_s:6.1f} {c.rc:>3}  {c.errors or ''}"
        )
    for mode, _, _ in modes:
        of = [c for c in cases if c.mode == mode]
        print(f"{mode}: {sum(c.failed for c in of)}/{sum(c.sent for c in of)} failed/sent")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(c) for c in cases], indent=2))


if __name__ == "__main__":
    main()
