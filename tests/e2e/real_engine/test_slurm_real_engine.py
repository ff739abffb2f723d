"""`pdboot export slurm` with the REAL vLLM CPU engine (`device: cpu`) on a real Slurm (Debian's
22.05, tests/testbed/slurm.py) whose nodes are the package's testbed hosts: the script submitted
with sbatch starts real engines on the allocated nodes (the router's host first), a completion
through the router makes the decode pull the prefill's KV across hosts over NIXL (vLLM's own
counters), and scancel leaves no container or step. Runs after test_real_failures.py (file
names sort so), on the testbed it left clean.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.real_engine.conftest import ROOT, http_json, metric
from tests.testbed.harness import Testbed
from tests.testbed.inventory import REAL_SERVED_NAME
from tests.testbed.slurm import SlurmCluster, missing

pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.real_vllm]
NAME = "slurmreal"


@pytest.fixture
def slurm(real_tb: Testbed) -> Iterator[SlurmCluster]:
    lacking = missing()
    if lacking:
        pytest.fail(f"Slurm is not installed here ({', '.join(lacking)}; .ci/setup installs it)")
    real_tb.reset()
    # the router's host first: it takes the allocation's first node
    cluster = SlurmCluster(real_tb, ["ingress", "prefill", "decode"])
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        real_tb.reset()


def _until(what: str, check: Callable[[], object], seconds: float, why: Callable[[], str]) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} after {seconds:.0f}s:\n{why()}")
        time.sleep(2)


def test_real_engines_run_from_the_exported_script(real_tb: Testbed, slurm: SlurmCluster) -> None:
    tb = real_tb
    inv = tb.inventory(tb.dir / f"{NAME}.yaml", name=NAME, engine="vllm")
    out = tb.dir / f"{NAME}-export"
    res = subprocess.run(
        [sys.executable, "-m", "pdboot", "export", "slurm", str(inv), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    t0 = time.monotonic()
    job = slurm.submit(out / f"pdboot-{NAME}.sbatch")
    logs = out / "pdboot-logs" / job
    batch = out / f"slurm-pdboot-{NAME}-{job}.out"

    def why() -> str:
        parts = [batch.read_text(errors="replace")[-3000:] if batch.exists() else "no batch log"]
        parts += [f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in _logs(logs)]
        return "\n".join(parts)

    try:
        _until("no endpoint", (logs / "endpoint").exists, 900, why)
        print(f"\n[real-engine] sbatch -> ready: {time.monotonic() - t0:.0f}s", file=sys.stderr)
        # the nodes play the inventory's hosts in the order Slurm lists them (by name)
        roles = slurm.roles(batch)
        assert set(roles) == {"ingress", "prefill", "decode"}
        assert roles["ingress"][0] == slurm.run(None, "sinfo -h -N -o %N").stdout.split()[0]
        router = f"http://{roles['ingress'][1]}:8000"
        assert (logs / "endpoint").read_text().strip() == f"{router}/v1"
        decode = f"http://{roles['decode'][1]}:8201/metrics"
        assert roles["decode"][1] != roles["prefill"][1]
        pulls = metric(decode, "vllm:nixl_xfer_time_seconds_count")
        body = {"model": REAL_SERVED_NAME, "prompt": "one two three four", "max_tokens": 4}
        reply = http_json(f"{router}/v1/completions", body, timeout=300)
        assert reply["usage"]["completion_tokens"] == 4, reply
        # the real decode on its node pulled the KV from the real prefill on another node
        assert metric(decode, "vllm:nixl_xfer_time_seconds_count") == pulls + 1
        assert metric(decode, "vllm:nixl_num_failed_transfers_total") == 0
    finally:
        cancel = slurm.run(None, f"scancel {job}")
    assert cancel.returncode == 0, cancel.stderr
    _until(
        "still queued", lambda: not slurm.run(None, f"squeue -h -j {job}").stdout.strip(), 90, why
    )
    _until("containers left", lambda: not any(slurm.containers(job).values()), 60, why)
    # a slurmstepd ends a moment after its job leaves the queue (longer on a busy machine)
    _until("processes of the job still run", lambda: not slurm.leftovers(job), 60, why)


def _logs(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.log")) if folder.exists() else []
