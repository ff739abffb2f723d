"""`pdboot export slurm` on a real Slurm (Debian's slurmctld/slurmd/munge, 22.05) whose nodes are
two testbed hosts (their own addresses, sshd, dockerd): the exported script is submitted with
`sbatch`; the weights step stages the gated model at the pinned commit from the testbed's hub
on each node (the token from the node's secrets file), the stand-in engines load it from
there offline on the nodes the allocation gives (prefill, the router and the proxy on the
first, decode on the second), a completion with the API key goes through the proxy and the
router with the KV cache pulled across hosts over the side channel, the worker API is out of
reach from the other node, and `scancel` leaves nothing running.

The same deployment exported with --pyxis then runs through tests/testbed/pyxis_srun.sh, an
EMULATION of pyxis (the testbed has no pyxis/enroot): `srun` on the first node turns the
pyxis options into `docker run`, so the script's order, waits and teardown run for real.

Under CI=true a testbed that cannot start fails this test; elsewhere it skips.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.testbed import hub
from tests.testbed.harness import HostSpec, Testbed
from tests.testbed.scrape import metric
from tests.testbed.slurm import SlurmCluster, missing

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
MODEL = hub.GATED_REPO  # the testbed hub answers it only with its token
TOKEN = hub.TOKEN  # the test hunts for it in the exported files
TOKEN_ENV = "PDBOOT_E2E_SLURM_HF_TOKEN"
KEY = "sk-slurm-SECRET-key-0123456789"
KEY_ENV = "PDBOOT_E2E_SLURM_API_KEY"
PYXIS_SRUN = Path(__file__).resolve().parents[1] / "testbed" / "pyxis_srun.sh"


def _chat(endpoint: str, key: str | None = KEY) -> dict[str, Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(f"{endpoint}/chat/completions", json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=60) as r:
        doc: dict[str, Any] = json.loads(r.read())
    return doc


def _status(url: str, key: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _head(tb: Testbed, repo: str) -> str:
    req = urllib.request.Request(
        f"{tb.hub}/api/models/{repo}/revision/main", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return str(json.loads(r.read())["sha"])


def _export(inv: Path, out: Path, *extra: str) -> Path:
    res = subprocess.run(
        [sys.executable, "-m", "pdboot", "export", "slurm", str(inv), "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=dict(os.environ, **{TOKEN_ENV: TOKEN, KEY_ENV: KEY}),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    script = next(out.glob("*.sbatch"))
    assert TOKEN not in script.read_text() and KEY not in script.read_text()
    return script


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
    commit = _head(tb, MODEL)
    env = {"STANDIN_LOAD_SECONDS": "0.5"}
    inv = tb.inventory(
        name=name,
        model=MODEL,
        prefill=["n1"],
        decode=["n2"],
        router="n1",
        overrides={
            "model_revision": commit,
            "prefill": {"env": env},
            "decode": {"env": env},
            "secrets": {"hf_token": f"env:{TOKEN_ENV}", "api_key": f"env:{KEY_ENV}"},
            "timeouts": {"ready_seconds": 90, "router_ready_seconds": 60},
            # the testbed hub is plain http (named); staging runs in pdboot's staging image
            "weights": {
                "stage": True,
                "endpoint": tb.hub,
                "allow_plain_http": True,
                "image": tb.stage_image,
            },
        },
    )
    # the secrets live on the nodes, where `up` would write them (0600), never in the script
    lines = "".join(
        f"{k}={v}\\n"
        for k, v in (
            ("HF_TOKEN", TOKEN),
            ("HUGGING_FACE_HUB_TOKEN", TOKEN),
            ("VLLM_API_KEY", KEY),
            ("OPENAI_API_KEY", KEY),
        )
    )
    for h in tb.hosts.values():
        h.exec(
            f"mkdir -p /var/lib/pdboot/{name} && umask 077 && "
            f"printf '{lines}' > /var/lib/pdboot/{name}/secrets.env",
            check=True,
        )
    n1, n2 = tb.hosts["n1"], tb.hosts["n2"]

    # --- Docker: a fresh node's engines load what the weights step staged
    out = tb.dir / "export"
    job = slurm.submit(_export(inv, out))
    endpoint, logs, batch_log = _until_ready(slurm, out, name, job)
    try:
        # the router's host (n1) takes the first node; nodes n1, n2 sort as the hosts do
        assert slurm.roles(batch_log) == {h: (h, tb.hosts[h].address) for h in ("n1", "n2")}
        assert endpoint == f"http://{n1.address}:8000/v1"
        got = hub.downloads(tb.hub_log, MODEL)
        files = sorted(hub.model_files(1))
        for h in (n1, n2):  # each file once per node, by the staging step there
            assert {f: got.get((h.address, f), 0) for f in files} == dict.fromkeys(files, 1)
            stage_log = (logs / f"stage@{h.name}.log").read_text()
            assert f'"kind": "done", "commit": "{commit}"' in stage_log, stage_log[-2000:]
        # every engine, the router and the proxy on the node that plays its host, with
        # render's side channel host rewritten to that node's address, the token and the key
        # from the node's file; the staging containers are gone
        running = slurm.containers(job)
        assert len(running["n1"]) == 3 and len(running["n2"]) == 1, running
        decode_doc = json.loads(n2.docker("inspect", running["n2"][0]).stdout)[0]
        decode_env = dict(e.split("=", 1) for e in decode_doc["Config"]["Env"])
        assert decode_env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == n2.address
        assert decode_env["HF_TOKEN"] == TOKEN and decode_env["HF_HUB_OFFLINE"] == "1"
        assert "kv_consumer" in " ".join(decode_doc["Args"])
        docs = [json.loads(n1.docker("inspect", c).stdout)[0] for c in running["n1"]]
        prefill_doc = next(d for d in docs if "kv_producer" in " ".join(d["Args"]))
        prefill_env = dict(e.split("=", 1) for e in prefill_doc["Config"]["Env"])
        assert prefill_env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == n1.address
        for h, cid in ((n1, prefill_doc["Id"]), (n2, decode_doc["Id"])):
            engine_log = h.docker("logs", cid).stdout + h.docker("logs", cid).stderr
            assert f"at {commit} (offline=True)" in engine_log, engine_log[-2000:]

        _serves_through_the_proxy_only(endpoint, n1, n2)
        metrics = f"http://{n2.address}:8201/metrics"
        pulls = metric(metrics, "vllm:nixl_xfer_time_seconds_count")
        doc = _chat(endpoint)
        assert doc["usage"]["completion_tokens"] == 3
        # decode on n2 pulled the KV from prefill's side channel on n1
        assert metric(metrics, "vllm:nixl_xfer_time_seconds_count") == pulls + 1
        with urllib.request.urlopen(metrics, timeout=10) as r:
            assert any(
                ln.startswith("vllm:prompt_tokens_by_source_total{")
                and 'source="external_kv_transfer"' in ln
                and float(ln.rsplit(" ", 1)[1]) > 0
                for ln in r.read().decode().splitlines()
            )
        # a log per step
        assert {p.name for p in logs.glob("*.log")} == {
            "stage@n1.log",
            "stage@n2.log",
            "prefill@n1.log",
            "decode@n2.log",
            "router@n1.log",
            "proxy@n1.log",
        }
        assert (logs / "decode@n2.log").stat().st_size > 0
    finally:
        cancel = slurm.run(None, f"scancel {job}")
    assert cancel.returncode == 0, cancel.stderr
    _torn_down(slurm, job, batch_log, n1)

    # --- pyxis, through the srun EMULATION on the first node (the batch script's)
    pyxis_out = tb.dir / "export-pyxis"
    script = _export(inv, pyxis_out, "--pyxis", "--account", "root")
    assert "--no-container-entrypoint" in script.read_text()
    n1.exec(f"install -m 0755 {PYXIS_SRUN} /usr/local/sbin/srun", check=True)
    try:
        job = slurm.submit(script)
        endpoint, logs, batch_log = _until_ready(slurm, pyxis_out, name, job)
        try:
            log = batch_log.read_text()
            # the order the script keeps: staged, engines ready, router, workers, proxy
            marks = [
                "the weights are on the node",
                "prefill@n1 ready",
                "router ready",
                "router ready: 2 workers healthy",
                "proxy ready",
            ]
            assert all(m in log for m in marks), log[-3000:]
            assert [log.index(m) for m in marks] == sorted(log.index(m) for m in marks)
            running = slurm.containers(job)
            assert len(running["n1"]) == 3 and len(running["n2"]) == 1, running
            stage_log = (logs / "stage@n2.log").read_text()
            assert f'"kind": "cached", "commit": "{commit}"' in stage_log, stage_log[-2000:]
            _serves_through_the_proxy_only(endpoint, n1, n2)
            assert _chat(endpoint)["usage"]["completion_tokens"] == 3
        finally:
            cancel = slurm.run(None, f"scancel {job}")
        assert cancel.returncode == 0, cancel.stderr
        _torn_down(slurm, job, batch_log, n1)
    finally:
        n1.exec("rm -f /usr/local/sbin/srun")


def _until_ready(slurm: SlurmCluster, out: Path, name: str, job: str) -> tuple[str, Path, Path]:
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
            240,
            why,
        )
    except AssertionError:
        slurm.run(None, f"scancel {job}")
        raise
    return str(endpoint), logs, batch_log


def _serves_through_the_proxy_only(endpoint: str, n1: Any, n2: Any) -> None:
    """The key is checked at the proxy; the worker API is out of reach from another node:
    404 through the proxy, nothing listening on the router's port but the loopback."""
    base = endpoint.removesuffix("/v1")
    assert _status(f"{base}/health") == 200
    assert _status(f"{endpoint}/models") == 401
    assert _status(f"{endpoint}/models", KEY) == 200
    assert _status(f"{base}/workers", KEY) == 404
    curl = "curl -s -o /dev/null -w '%{http_code}' --max-time 5"
    from_n2 = n2.exec(
        f"{curl} http://{n1.address}:8000/workers; echo; "
        f"{curl} http://{n1.address}:8081/workers; echo rc=$?"
    )
    assert from_n2.stdout.split() == ["404", "000rc=7"], from_n2.stdout


def _torn_down(slurm: SlurmCluster, job: str, batch_log: Path, n1: Any) -> None:
    _wait(
        "the job is still in the queue",
        lambda: slurm.run(None, f"squeue -h -j {job}").stdout.strip() == "",
        60,
    )
    _wait(
        "containers outlived the job",
        lambda: not any(slurm.containers(job).values()),
        30,
        lambda: str(slurm.containers(job)),
    )
    # no step shell, step daemon or docker client still runs: a slurmstepd ends a moment
    # after its job leaves the queue (longer on a busy machine), so it gets a while to go
    _wait(
        "processes of the job still run",
        lambda: slurm.leftovers(job) == [],
        60,
        lambda: str(slurm.leftovers(job)),
    )
    assert "torn down" in batch_log.read_text()
    # the proxy's folder (nginx.conf, the key's include) went with the job
    assert n1.exec("ls /tmp | grep -c pdboot-proxy || true").stdout.strip() == "0"
