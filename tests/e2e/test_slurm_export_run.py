"""`pdboot export slurm` on a real Slurm (Debian's slurmctld/slurmd/munge, 22.05) whose nodes are
two testbed hosts (their own addresses, sshd, dockerd): the exported script is submitted with
`sbatch`, the stand-in engines start on the nodes the allocation gives (prefill and the router
on the first, decode on the second), a completion goes through the router with the KV cache
pulled across hosts over the side channel, and `scancel` leaves nothing running.

Under CI=true a testbed that cannot start fails this test; elsewhere it skips.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.testbed.harness import HostSpec, Testbed
from tests.testbed.slurm import SlurmCluster, missing

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
MODEL = "Qwen/Qwen3-0.6B"
TOKEN = "hf_slurmSECRETtoken0123456789abcdef"  # a fake token the test hunts for
TOKEN_ENV = "PDBOOT_E2E_SLURM_HF_TOKEN"


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return sum(
        float(ln.rsplit(" ", 1)[1])
        for ln in text.splitlines()
        if ln.startswith(name + "{") or ln.startswith(name + " ")
    )


def _chat(endpoint: str) -> dict[str, Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    req = urllib.request.Request(
        f"{endpoint}/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        doc: dict[str, Any] = json.loads(r.read())
    return doc


def _wait(what: str, check: Any, timeout: float, why: Any = lambda: "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} after {timeout:.0f}s: {why()}")
        time.sleep(0.5)


def test_exported_script_runs_on_real_slurm(make_testbed: Any) -> None:
    lacking = missing()
    if lacking:
        message = f"Slurm is not installed here ({', '.join(lacking)}; .ci/setup installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    tb: Testbed = make_testbed([HostSpec("n1"), HostSpec("n2")], images_needed=True)
    slurm = SlurmCluster(tb)
    slurm.start()
    name = "slurmpd"
    env = {"STANDIN_LOAD_SECONDS": "0.5"}
    inv = tb.inventory(
        name=name,
        prefill=["n1"],
        decode=["n2"],
        router="n1",
        overrides={
            "prefill": {"env": env},
            "decode": {"env": env},
            "secrets": {"hf_token": f"env:{TOKEN_ENV}"},
            "timeouts": {"ready_seconds": 90, "router_ready_seconds": 60},
        },
    )
    out = tb.dir / "export"
    res = subprocess.run(
        [sys.executable, "-m", "pdboot", "export", "slurm", str(inv), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=dict(os.environ, **{TOKEN_ENV: TOKEN}),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    script = out / f"pdboot-{name}.sbatch"
    assert TOKEN not in script.read_text()
    # the secret lives on the nodes, where `up` would write it (0600), never in the script
    for h in tb.hosts.values():
        h.exec(
            f"mkdir -p /var/lib/pdboot/{name} && umask 077 && "
            f"printf 'HF_TOKEN=%s\\n' {TOKEN} > /var/lib/pdboot/{name}/secrets.env",
            check=True,
        )

    job = slurm.submit(script)
    logs = out / "pdboot-logs" / job
    batch_log = out / f"slurm-pdboot-{name}-{job}.out"

    def why() -> str:
        parts = [batch_log.read_text(errors="replace")[-3000:] if batch_log.exists() else ""]
        parts += [slurm.run(None, "squeue; sinfo -N").stdout]
        for p in sorted(logs.glob("*.log")) if logs.exists() else []:
            parts.append(f"--- {p.name}\n" + p.read_text(errors="replace")[-1500:])
        return "\n".join(parts)

    try:
        endpoint = _wait(
            "the job did not report its endpoint",
            lambda: (logs / "endpoint").exists() and (logs / "endpoint").read_text().strip(),
            150,
            why,
        )
        # the router's host (n1) takes the first node; nodes n1, n2 sort as the hosts do
        assert slurm.roles(batch_log) == {h: (h, tb.hosts[h].address) for h in ("n1", "n2")}
        n1, n2 = tb.hosts["n1"], tb.hosts["n2"]
        assert endpoint == f"http://{n1.address}:8000/v1"
        # every engine and the router on the node that plays its host, with render's side
        # channel host rewritten to that node's address, and its token from the node's file
        running = slurm.containers(job)
        assert len(running["n1"]) == 2 and len(running["n2"]) == 1, running
        decode_doc = json.loads(n2.docker("inspect", running["n2"][0]).stdout)[0]
        decode_env = dict(e.split("=", 1) for e in decode_doc["Config"]["Env"])
        assert decode_env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == n2.address
        assert decode_env["HF_TOKEN"] == TOKEN
        assert "kv_consumer" in " ".join(decode_doc["Args"])
        prefill_doc = next(
            d
            for d in (json.loads(n1.docker("inspect", c).stdout)[0] for c in running["n1"])
            if "kv_producer" in " ".join(d["Args"])
        )
        prefill_env = dict(e.split("=", 1) for e in prefill_doc["Config"]["Env"])
        assert prefill_env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == n1.address

        metrics = f"http://{n2.address}:8201/metrics"
        pulls = _metric(metrics, "vllm:nixl_xfer_time_seconds_count")
        doc = _chat(endpoint)
        assert doc["usage"]["completion_tokens"] == 3
        # decode on n2 pulled the KV from prefill's side channel on n1
        assert _metric(metrics, "vllm:nixl_xfer_time_seconds_count") == pulls + 1
        with urllib.request.urlopen(metrics, timeout=10) as r:
            assert any(
                ln.startswith("vllm:prompt_tokens_by_source_total{")
                and 'source="external_kv_transfer"' in ln
                and float(ln.rsplit(" ", 1)[1]) > 0
                for ln in r.read().decode().splitlines()
            )
        # a log per engine (and the router's)
        assert {p.name for p in logs.glob("*.log")} == {
            "prefill@n1.log",
            "decode@n2.log",
            "router@n1.log",
        }
        assert (logs / "decode@n2.log").stat().st_size > 0
    finally:
        cancel = slurm.run(None, f"scancel {job}")
    assert cancel.returncode == 0, cancel.stderr
    _wait(
        "the job is still in the queue",
        lambda: slurm.run(None, f"squeue -h -j {job}").stdout.strip() == "",
        60,
        why,
    )
    _wait(
        "containers outlived the job",
        lambda: not any(slurm.containers(job).values()),
        30,
        lambda: str(slurm.containers(job)),
    )
    # no step shell, step daemon or docker client still runs
    leftovers = slurm.leftovers(job)
    assert leftovers == [], leftovers
    assert "torn down" in batch_log.read_text()
