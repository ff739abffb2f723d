"""Where `pdboot preflight`'s time goes, per host and in total, on a testbed of N hosts:

1. imports: `python -X importtime -m pdboot preflight INV --json`, self time summed per
   package (pdboot's by subpackage), and whether the docker SDK, requests or rich loaded;
2. the run in this process, phase by phase (`run_preflight` with timers around its steps):
   contexts, each host's connect and batch (one SSH exec each: the count of execs per host
   is printed, so an extra round trip shows), the wait for the registry lookups, reading
   and judging on this machine;
3. the batch: commands per host, of which cross-host probes, and each command's own time
   when run alone one after another on the first and the last host (the batch runs them
   concurrently, so a host costs about its slowest command plus the CPU they share).

    python bench/preflight_profile.py [--hosts 8] [--runs 3] [--dockerd-max 8]

Needs root (the testbed). A profile, not a benchmark: bench/preflight.py compares tools.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pdboot.inventory.load import load_inventory  # noqa: E402
from pdboot.preflight import run as pf  # noqa: E402
from pdboot.preflight.contexts import contexts  # noqa: E402
from pdboot.transport import ssh  # noqa: E402
from tests.testbed.harness import Testbed  # noqa: E402

HEAVY = ("docker", "requests", "urllib3", "rich", "fabric", "invoke", "paramiko", "pydantic")


def imports(inv: Path, runs: int) -> None:
    per_run: list[collections.Counter[str]] = []
    for _ in range(runs):
        p = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "pdboot", "preflight", str(inv), "--json"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=600,
        )
        agg: collections.Counter[str] = collections.Counter()
        for line in p.stderr.splitlines():
            m = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", line)
            if m:
                parts = m.group(2).split(".")
                agg[".".join(parts[:2]) if parts[0] == "pdboot" else parts[0]] += int(m.group(1))
        per_run.append(agg)
    keys = set().union(*per_run)
    med = {k: statistics.median(r.get(k, 0) for r in per_run) / 1000 for k in keys}
    total = statistics.median(sum(r.values()) for r in per_run) / 1000
    print(f"imports of `pdboot preflight --json` (median of {runs}): {total:.0f} ms in all")
    for k, v in sorted(med.items(), key=lambda kv: -kv[1])[:14]:
        print(f"  {v:7.1f} ms  {k}")
    print("  loaded: " + ", ".join(f"{h} {'yes' if h in keys else 'no'}" for h in HEAVY))


class Timers:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.spans: dict[str, list[tuple[float, float, str]]] = collections.defaultdict(list)
        self.lock = threading.Lock()

    def wrap(
        self, owner: Any, name: str, label: str, who: Callable[..., str] | None = None
    ) -> None:
        orig = getattr(owner, name)

        def timed(*a: Any, **k: Any) -> Any:
            start = time.monotonic()
            try:
                return orig(*a, **k)
            finally:
                with self.lock:
                    tag = who(*a, **k) if who else ""
                    self.spans[label].append((start - self.t0, time.monotonic() - self.t0, tag))

        setattr(owner, name, timed)


def phases(inv_path: Path) -> None:
    inv = load_inventory(inv_path)
    t = Timers()
    t.wrap(pf, "contexts", "contexts (inventory -> per-host checks)")
    t.wrap(ssh, "connect", "connect (TCP, kex, host key, auth)", lambda name, *a, **k: name)
    t.wrap(ssh.SSHConnection, "_exec_open", "batch (one SSH exec)", lambda self, *a, **k: self.name)
    t.wrap(pf.ImageLookups, "wait", "wait for the registry lookups")
    t.wrap(pf, "read_reports", "parse every host's output")
    t.wrap(pf, "judge_reports", "judge (incl. the converge plan)")
    t.t0 = time.monotonic()
    pf.run_preflight(inv)
    total = time.monotonic() - t.t0
    print(f"run_preflight in this process: {total:.2f} s (after imports)")
    print(f"  {'phase':42s} {'n':>3s} {'starts':>11s} {'ends':>11s} {'median':>7s} {'max':>6s}")
    for label, spans in t.spans.items():
        d = [b - a for a, b, _ in spans]
        print(
            f"  {label:42s} {len(spans):3d} {min(a for a, _, _ in spans):5.2f}-"
            f"{max(a for a, _, _ in spans):<5.2f} {min(b for _, b, _ in spans):5.2f}-"
            f"{max(b for _, b, _ in spans):<5.2f} {statistics.median(d):7.2f} {max(d):6.2f}"
        )
    execs = collections.Counter(tag for _, _, tag in t.spans["batch (one SSH exec)"])
    print(f"  SSH execs per host: {sorted(set(execs.values()))} (1 = one round trip batch)")


def per_command(tb: Testbed, inv_path: Path) -> None:
    inv = load_inventory(inv_path)
    ctxs, args = contexts(inv), pf.ArgsProbes.of(inv, True)
    cmds = {h: pf.host_commands(c) + args.batch_commands(h) for h, c in ctxs.items()}
    probes = {h: len(c.probes) for h, c in ctxs.items()}
    with_probes = {
        h: sum(1 for c in cs if c.area == "network" and "/dev/tcp/" in c.line)
        for h, cs in cmds.items()
    }
    print(
        f"batch: {min(len(c) for c in cmds.values())}-{max(len(c) for c in cmds.values())} "
        f"commands per host; cross-host probes per host {min(probes.values())}-"
        f"{max(probes.values())} ({sum(probes.values())} in all), in "
        f"{max(with_probes.values())} command(s) per host"
    )
    for h in dict.fromkeys([next(iter(cmds)), list(cmds)[-1]]):
        lines = [
            f"s=$(date +%s%N); {{ timeout 20 bash -c {shlex.quote(c.line)}; }} >/dev/null 2>&1 "
            f'</dev/null; e=$(date +%s%N); echo "$(( (e - s) / 1000000 )) {c.key}"'
            for c in cmds[h]
        ]
        out = tb.ssh(h, "bash -c " + shlex.quote("\n".join(lines)), timeout=300).stdout
        pairs = (ln.split(maxsplit=1) for ln in out.splitlines())  # keys may hold spaces
        rows = sorted(((int(a), b) for a, b in pairs), reverse=True)
        top = ", ".join(f"{k} {ms}" for ms, k in rows[:8])
        alone = sum(ms for ms, _ in rows)
        print(f"  {h}: alone, one after another: {alone} ms; slowest (ms): {top}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dockerd-max", type=int, default=8, help="more hosts: sshd only")
    args = ap.parse_args()
    from bench.preflight import bytecode, host_spec, roles

    bytecode(ROOT, True)  # as installed: the imports below are not compiles

    specs = [host_spec(f"h{i}", args.hosts <= args.dockerd_max) for i in range(args.hosts)]
    tb = Testbed.start(specs, images_needed=False)
    try:
        work = Path(tempfile.mkdtemp(prefix="pdb-prof-", dir=tb.dir))
        inv = tb.inventory(work / "inv.yaml", **roles(list(tb.hosts)))
        print(f"{args.hosts} hosts; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        imports(inv, args.runs)
        for _ in range(args.runs):
            phases(inv)
        per_command(tb, inv)
    finally:
        tb.stop()


if __name__ == "__main__":
    main()
