"""`pdboot up/status/logs/down` end to end: the real CLI (a subprocess) against testbed hosts
with real sshd, dockerd, Compose v2, registry and vllm-router; stand-in vLLM engines.

Under CI=true a testbed that cannot start fails these tests; elsewhere they skip.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli import Cli, output
from tests.testbed.inventory import ssh_settings
from tests.testbed.router_admin import router_json
from tests.testbed.scrape import metric

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

TOKEN = "hf_e2eSECRETtoken0123456789abcdef"  # a fake token the tests hunt for
TOKEN_ENV = "PDBOOT_E2E_HF_TOKEN"


def token_cli(cli: Cli) -> Cli:
    """The fake token in the environment, and `up` without preflight: preflight has its own
    e2e tests; here it runs where a test asks (the 1P1D test, to show `up` gates on it, and
    re-runs of `up` on a live deployment, which must pass their own preflight: issue 22), and
    is skipped elsewhere to keep the suite short on 2 cores."""
    return cli.with_(env={TOKEN_ENV: TOKEN}, skip_preflight=True)


@pytest.fixture(scope="module")
def cli(cli: Cli) -> Cli:
    return token_cli(cli)


@pytest.fixture
def tb3(testbed_clean: Any) -> Any:
    """The session's shared 3-host testbed (decode, prefill, ingress), cleaned around each
    test (conftest: fails under CI=true when it cannot start, skips elsewhere)."""
    return testbed_clean


def write_inventory(
    tb: Any,
    path: Path,
    *,
    name: str,
    prefill: list[str] | None = None,
    decode: list[str] | None = None,
    router: str = "ingress",
    image: str | None = None,
    prefill_env: dict[str, str] | None = None,
    decode_env: dict[str, str] | None = None,
    decode_args: list[str] | None = None,
    ready_seconds: float = 60,
    hf_token: bool = True,
) -> Path:
    prefill = prefill or ["prefill"]
    decode = decode or ["decode"]
    used = list(dict.fromkeys(prefill + decode + [router]))
    inv: dict[str, Any] = {
        "name": name,
        "model": "Qwen/Qwen3-0.6B",
        "image": image or tb.image,
        "router_image": tb.router_image,
        "ssh": ssh_settings(tb),
        "hosts": {h: {"address": tb.hosts[h].address} for h in used},
        "prefill": {
            "hosts": prefill,
            "env": {"STANDIN_LOAD_SECONDS": "0.5", **(prefill_env or {})},
        },
        "decode": {
            "hosts": decode,
            "env": {"STANDIN_LOAD_SECONDS": "0.5", **(decode_env or {})},
            "extra_args": decode_args or [],
        },
        "router": {"host": router, "proxy_image": tb.proxy_image},
        # the testbed's root lacks CAP_SYS_RESOURCE: lowered limits (testbed recipe)
        "container": {"ulimits": {"memlock": 8388608, "nofile": 20000}, "shm_size": "1g"},
        "requirements": {"min_free_disk_gb": 1},  # the machine's disk is shared by all hosts
        "weights": {
            "stage": False
        },  # a name only: no hub serves it (tests/e2e/test_weights_staged_once_per_host.py)
        "timeouts": {
            "ready_seconds": ready_seconds,
            "router_ready_seconds": 60,
            "poll_interval_seconds": 0.2,
            "pull_seconds": 300,
        },
    }
    if hf_token:
        inv["secrets"] = {"hf_token": f"env:{TOKEN_ENV}"}
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def follow_every_service(cli: Cli, inv: Path, services: set[str]) -> None:
    """`logs -f -t --tail 1` with no service: the last line of each, which a follow that read
    one stream after the other would never get past the first; then Ctrl-C ends it, exit 0."""
    from pdboot.timestamps import parse_rfc3339

    p = cli.popen(
        "logs", str(inv), "-f", "-t", "--tail", "1",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    stuck = threading.Timer(90, p.kill)  # a readline that never returns fails, not hangs
    stuck.start()
    seen: dict[str, str] = {}
    try:
        assert p.stdout is not None
        while set(seen) != services:
            line = p.stdout.readline()
            assert line, f"the follow ended with {sorted(seen)} only"
            name, text = line.split(" | ", 1)
            seen[name.strip()] = text
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
    finally:
        stuck.cancel()
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    for name, text in seen.items():
        assert parse_rfc3339(text.split(" ", 1)[0]) is not None, (name, text)


def containers(tb: Any, host: str, deployment: str | None = None) -> list[dict[str, Any]]:
    args = ["ps", "-a", "--no-trunc", "--format", "{{json .}}"]
    if deployment:
        args += ["--filter", f"label=io.pdboot.deployment={deployment}"]
    res = tb.hosts[host].docker(*args)
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


def ids(tb: Any, deployment: str) -> dict[str, str]:
    """service key -> container id, over all hosts."""
    out = {}
    for h in tb.hosts:
        for c in containers(tb, h, deployment):
            labels = dict(kv.split("=", 1) for kv in c["Labels"].split(",") if "=" in kv)
            out[f"{labels['io.pdboot.role']}@{labels['io.pdboot.host']}"] = c["ID"]
    return out


def started_at(tb: Any, deployment: str, role: str) -> str:
    """The State.StartedAt of this deployment's one container of ``role``."""
    for h in tb.hosts:
        for c in containers(tb, h, deployment):
            if f"io.pdboot.role={role}" in c["Labels"]:
                res = tb.hosts[h].docker("inspect", "--format", "{{.State.StartedAt}}", c["ID"])
                return str(res.stdout.strip())
    raise AssertionError(f"no {role} container of {deployment}")


def http_json(url: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def down_clean(cli: Cli, tb: Any, inv: Path, deployment: str) -> None:
    res = cli("down", str(inv))
    assert res.returncode == 0, output(res)
    for h in tb.hosts:
        assert containers(tb, h, deployment) == [], h


# --------------------------------------------------------------------------- happy paths


def test_1p1d_up_chat_status_idempotent_down(cli: Cli, tb3: Any, tmp_path: Path) -> None:
    inv = write_inventory(
        tb3,
        tmp_path / "inv.yaml",
        name="e2e1",
    )
    res = cli("up", str(inv), preflight=True)
    out = output(res)
    assert res.returncode == 0, out
    assert "preflight skipped" not in out and "PASS: 3 host(s)" in out  # the gate ran ...
    for h in ("decode", "prefill", "ingress"):  # ... compactly: a line per host, no tables
        assert re.search(rf"^{h}: \d+ passed", out, re.M), h
    assert "docker.compose" not in out
    router = f"http://{tb3.hosts['ingress'].address}:8000"
    assert f"{router}/v1" in out and "curl " in out
    assert "decode pulled the KV cache from a prefill engine" in out

    # a chat completion through the router, decoded after a cross-host KV pull
    decode_metrics = f"http://{tb3.hosts['decode'].address}:8201/metrics"
    pulls = metric(decode_metrics, "vllm:nixl_xfer_time_seconds_count")
    reply = http_json(
        f"{router}/v1/chat/completions",
        {
            "model": "Qwen/Qwen3-0.6B",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
        },
    )
    assert reply["choices"][0]["message"]["content"].strip()
    assert reply["usage"]["completion_tokens"] == 4
    assert metric(decode_metrics, "vllm:nixl_xfer_time_seconds_count") == pulls + 1
    # one local prefill: the correctness gate's request sent straight to the decode; every
    # request through the router pulled its KV
    assert metric(decode_metrics, "standin_local_prefills_total") == 1

    st = cli("status", str(inv), "--json")
    assert st.returncode == 0, output(st)
    doc = json.loads(st.stdout)
    assert doc["healthy"] is True
    assert {s["service"] for s in doc["services"]} == {
        "decode@decode",
        "prefill@prefill",
        "router@ingress",
        "proxy@ingress",
    }
    # the router's health read over the SSH channel to its loopback port, the proxy's at the
    # public endpoint
    assert all(s["matches_inventory"] and s["health"] == "ok" for s in doc["services"])

    before = ids(tb3, "e2e1")
    again = cli("up", str(inv), preflight=True)  # its own ports and GPUs pass (issue 22)
    assert again.returncode == 0, output(again)
    for key in ("decode@decode", "prefill@prefill", "router@ingress", "proxy@ingress"):
        assert any(key in line and "unchanged" in line for line in again.stdout.splitlines()), key
    assert ids(tb3, "e2e1") == before

    lg = cli("logs", str(inv), "decode@decode", "--tail", "5")
    assert lg.returncode == 0 and len(lg.stdout.strip().splitlines()) == 5, output(lg)
    bad = cli("logs", str(inv), "gateway")
    assert bad.returncode == 2 and "unknown role" in output(bad)
    every = cli("logs", str(inv), "--tail", "2")  # no service: each one's tail, named
    lines = every.stdout.strip().splitlines()
    assert every.returncode == 0, output(every)
    named = [line.split(" | ", 1)[0].strip() for line in lines]
    # the proxy logs each client request (at least the chat above); the others have more
    assert set(named) == {"decode@decode", "prefill@prefill", "router@ingress", "proxy@ingress"}
    assert all(named.count(s) == 2 for s in ("decode@decode", "prefill@prefill", "router@ingress"))
    later = cli("logs", str(inv), "decode@decode", "--since", "2099-01-01T00:00:00Z")
    assert later.returncode == 0 and later.stdout.strip() == "", output(later)
    # `docker compose logs -f -t`: every service's stream open at once, Docker's time first
    follow_every_service(
        cli, inv, {"decode@decode", "prefill@prefill", "router@ingress", "proxy@ingress"}
    )

    # secrets: the token file is 0600 in a 0700 dir, and the value is nowhere else
    for h in ("decode", "prefill"):
        st_ = tb3.hosts[h].exec(
            "stat -c '%a' /var/lib/pdboot/e2e1 /var/lib/pdboot/e2e1/secrets.env"
        )
        assert st_.stdout.split() == ["700", "600"], st_
        compose = tb3.hosts[h].exec("cat /var/lib/pdboot/e2e1/compose.yaml").stdout
        assert "secrets.env" in compose and TOKEN not in compose
        ps = tb3.hosts[h].exec("ps -eo args").stdout
        assert TOKEN not in ps
        cid = ids(tb3, "e2e1")[f"{'decode' if h == 'decode' else 'prefill'}@{h}"]
        assert TOKEN not in tb3.hosts[h].docker("logs", cid).stdout
        assert TOKEN not in tb3.hosts[h].docker("inspect", "--format", "{{json .Args}}", cid).stdout
        # vLLM's abort on SIGTERM replaced by drain_seconds (120), Docker's grace beyond it
        fmt = "{{json .Args}} {{.Config.StopTimeout}}"
        args, grace = tb3.hosts[h].docker("inspect", "--format", fmt, cid).stdout.rsplit(" ", 1)
        assert '"--shutdown-timeout","120"' in args and grace.strip() == "150", (args, grace)
    for r in (res, st, again, lg):
        assert TOKEN not in output(r)

    # a container pdboot did not start, even one labelled like another deployment's
    foreign = (
        tb3.hosts["decode"]
        .docker(
            "run",
            "-d",
            "--network",
            "none",
            "--label",
            "io.pdboot.deployment=someone-else",
            "--entrypoint",
            "python3",
            tb3.image,
            "-c",
            "import time; time.sleep(600)",
        )
        .stdout.strip()
    )
    down_clean(cli, tb3, inv, "e2e1")
    assert [c["ID"] for c in containers(tb3, "decode")] == [foreign]
    tb3.hosts["decode"].docker("rm", "-f", foreign)
    # the token file went with the containers; the project and preflight's RDMA record stay
    left = tb3.hosts["decode"].exec("ls /var/lib/pdboot/e2e1").stdout.split()
    assert left == ["compose.yaml", "rdma.json"]
    nothing = cli("down", str(inv))
    assert nothing.returncode == 0 and "nothing" in output(nothing)
    st2 = cli("status", str(inv))
    assert st2.returncode == 1


def test_2p2d_five_hosts_router_workers(cli: Cli, make_testbed: Any, tmp_path: Path) -> None:
    tb = make_testbed(["decode", "d2", "prefill", "p2", "ingress"])
    inv = write_inventory(
        tb,
        tmp_path / "inv.yaml",
        name="e2e2",
        prefill=["prefill", "p2"],
        decode=["decode", "d2"],
        router="ingress",
    )
    res = cli("up", str(inv))
    assert res.returncode == 0, output(res)
    # fresh hosts: every host pulled its image, with a progress line of its own
    for h in tb.hosts:
        img = tb.router_image if h == "ingress" else tb.image
        assert f"{h}: {img}" in res.stdout, h
    workers = router_json(tb.hosts["ingress"])  # the router's loopback, from its host
    got = {(w["worker_type"], w["url"]) for w in workers["workers"]}
    want = {("prefill", f"http://{tb.hosts[h].address}:8200") for h in ("prefill", "p2")}
    want |= {("decode", f"http://{tb.hosts[h].address}:8201") for h in ("decode", "d2")}
    assert got == want
    assert all(w["is_healthy"] for w in workers["workers"])
    st = cli("status", str(inv), "--json")
    assert st.returncode == 0 and len(json.loads(st.stdout)["services"]) == 6  # + the proxy
    # --purge: containers, shipped files and pulled images go
    res = cli("down", str(inv), "--purge")
    assert res.returncode == 0, output(res)
    for h in tb.hosts:
        assert containers(tb, h, "e2e2") == []
        # the project dir goes; the model cache (hf-cache) stays: weights are costly
        assert "e2e2" not in tb.hosts[h].exec("ls /var/lib/pdboot").stdout.split(), h
        images = tb.hosts[h].docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout
        assert tb.image not in images and tb.router_image not in images, h


def test_purge_keeps_a_side_loaded_image(cli: Cli, tb3: Any, tmp_path: Path) -> None:
    """Issue 32, item 1: an image that was on a host before `up` (here pulled by hand, the
    way an operator side-loads one on an air-gapped host) is not pdboot's: `down --purge`
    leaves it, and removes the images `up` pulled."""
    images = (tb3.image, tb3.router_image)

    def present(h: str) -> set[str]:
        out = tb3.hosts[h].docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout
        return {i for i in images if i in out.split()}

    for h in tb3.hosts:
        tb3.hosts[h].docker("rmi", "-f", *images, check=False)
    tb3.hosts["decode"].pull(tb3.image)  # side-loaded before pdboot came
    inv = write_inventory(tb3, tmp_path / "inv.yaml", name="e2epurge")
    res = cli("up", str(inv))
    assert res.returncode == 0, output(res)
    record = tb3.hosts["prefill"].exec("cat /var/lib/pdboot/e2epurge/.pdboot-pulled").stdout
    assert record.startswith(f"{tb3.image} sha256:"), record
    res = cli("down", str(inv), "--purge")
    assert res.returncode == 0, output(res)
    assert present("decode") == {tb3.image}, output(res)
    assert present("prefill") == set() and present("ingress") == set(), output(res)
    assert "decode: kept" in output(res) and "not pulled by pdboot" in output(res)


# --------------------------------------------------------------------------- faults


def test_prefill_crash_at_start_then_rollback(cli: Cli, tb3: Any, tmp_path: Path) -> None:
    inv = write_inventory(
        tb3,
        tmp_path / "inv.yaml",
        name="e2ecrash",
        prefill_env={"STANDIN_CRASH_AT_START": "oom"},
    )
    t0 = time.monotonic()
    res = cli("up", str(inv))
    out = output(res)
    assert res.returncode == 1, out
    assert "CUDA out of memory" in out  # the engine's own log lines are shown
    assert "cause (prefill@prefill): the GPU ran out of memory" in out
    assert time.monotonic() - t0 < 60  # stopped on the exit, not at ready_seconds (60)
    left = ids(tb3, "e2ecrash")
    assert "decode@decode" in left and "router@ingress" not in left  # decode left as is
    state = tb3.hosts["decode"].docker(
        "inspect", "--format", "{{.State.Status}}", left["decode@decode"]
    )
    assert state.stdout.strip() == "running"

    rb = cli("up", str(inv), "--rollback")
    assert rb.returncode == 1, output(rb)
    assert ids(tb3, "e2ecrash") == {}
    assert "secrets.env" not in tb3.hosts["decode"].exec("ls /var/lib/pdboot/e2ecrash").stdout
    down_clean(cli, tb3, inv, "e2ecrash")


def test_never_healthy_honours_the_deadline(cli: Cli, tb3: Any, tmp_path: Path) -> None:
    inv = write_inventory(
        tb3,
        tmp_path / "inv.yaml",
        name="e2enever",
        ready_seconds=4,
        decode_env={"STANDIN_NEVER_HEALTHY": "1"},
    )
    res = cli("up", str(inv))
    out = output(res)
    assert res.returncode == 1, out
    assert "decode@decode: no /health 200 within 4s" in out
    # both engine tiers start together (README: start order); the router never started
    assert set(ids(tb3, "e2enever")) == {"decode@decode", "prefill@prefill"}
    down_clean(cli, tb3, inv, "e2enever")


def test_nonexistent_image_tag(cli: Cli, tb3: Any, tmp_path: Path) -> None:
    bad = tb3.image.rsplit(":", 1)[0] + ":v0.0.0-nope"
    inv = write_inventory(
        tb3,
        tmp_path / "inv.yaml",
        name="e2etag",
        image=bad,
    )
    res = cli("up", str(inv))
    out = output(res)
    assert res.returncode == 1, out
    assert "pull failed on decode" in out and "no such image or tag" in out and bad in out
    assert ids(tb3, "e2etag") == {}


def test_host_unreachable_during_down(cli: Cli, tb3: Any, tmp_path: Path) -> None:
    inv = write_inventory(
        tb3,
        tmp_path / "inv.yaml",
        name="e2eunreach",
    )
    assert cli("up", str(inv)).returncode == 0
    tb3.hosts["prefill"].stop_sshd()
    try:
        res = cli("down", str(inv))
        out = output(res)
        assert res.returncode == 1, out
        assert "cannot reach" in out and "prefill" in out
        assert containers(tb3, "decode", "e2eunreach") == []
        assert containers(tb3, "ingress", "e2eunreach") == []
        assert len(containers(tb3, "prefill", "e2eunreach")) == 1  # untouched, unreachable
        st = cli("status", str(inv), "--json")
        assert st.returncode == 1
        rows = {r["service"]: r["state"] for r in json.loads(st.stdout)["services"]}
        assert rows["prefill@prefill"] == "unreachable" and rows["decode@decode"] == "absent"
    finally:
        tb3.hosts["prefill"].start_sshd()
        tb3.hosts["prefill"].wait_sshd(time.monotonic() + 20)
        tb3.save()
    down_clean(cli, tb3, inv, "e2eunreach")


def test_inventory_change_touching_only_decode(cli: Cli, tb3: Any, tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    inv = write_inventory(tb3, path, name="e2echange")
    # with preflight like the re-runs below: its findings (RDMA auto) are part of the hashes
    assert cli("up", str(inv), preflight=True).returncode == 0
    before = ids(tb3, "e2echange")
    write_inventory(
        tb3,
        path,
        name="e2echange",
        decode_args=["--max-model-len", "4096"],
    )
    # a tier of one engine cannot roll: `up` replaces it through degraded mode (the prefill
    # serves alone meanwhile), nothing asked
    res = cli("up", str(path), preflight=True)
    out = res.stdout
    assert res.returncode == 0, output(res)
    assert "upgrade path: through degraded mode" in out and "--yes" not in out, out
    assert "degraded upgrade phase 4: P/D again" in out, out
    lines = out.splitlines()
    assert any("decode@decode" in ln and "recreate" in ln for ln in lines), out
    assert any("prefill@prefill" in ln and "unchanged" in ln for ln in lines), out
    # live workers: the router stays; the decode was deregistered and registered again
    assert any("router@ingress" in ln and "unchanged" in ln for ln in lines), out
    after = ids(tb3, "e2echange")
    assert after["prefill@prefill"] == before["prefill@prefill"]
    assert after["decode@decode"] != before["decode@decode"]
    assert after["router@ingress"] == before["router@ingress"]
    # now only prefill changes: the decode that held NIXL state for it is restarted after
    # the prefill is ready (its StartedAt changes); a request still flows
    started_before = started_at(tb3, "e2echange", "decode")
    write_inventory(
        tb3,
        path,
        name="e2echange",
        decode_args=["--max-model-len", "4096"],
        prefill_env={"PDBOOT_E2E": "1"},
    )
    res = cli("up", str(path), preflight=True)
    assert res.returncode == 0, output(res)
    assert "degraded upgrade phase 6: P/D again" in res.stdout, res.stdout
    lines = res.stdout.splitlines()
    decode_line = next(ln for ln in lines if "decode@decode" in ln and "recreate" in ln)
    assert "prefill@prefill" in decode_line and "NIXL" in decode_line, res.stdout
    assert any("prefill@prefill" in ln and "recreate" in ln for ln in lines), res.stdout
    assert ids(tb3, "e2echange")["decode@decode"] != after["decode@decode"]
    assert started_at(tb3, "e2echange", "decode") != started_before
    assert "correctness gate: the P/D answer equals" in res.stdout, res.stdout
    down_clean(cli, tb3, path, "e2echange")


def test_interrupt_up_then_down(cli: Cli, tb3: Any, tmp_path: Path) -> None:
    inv = write_inventory(
        tb3,
        tmp_path / "inv.yaml",
        name="e2eint",
        decode_env={"STANDIN_LOAD_SECONDS": "120"},
    )
    p = cli.popen(
        "up",
        str(inv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not containers(tb3, "decode", "e2eint"):
            assert p.poll() is None, p.communicate()[0]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(1.0)  # now it is waiting for /health
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, out
    assert "interrupted" in out and "decode@decode" in out
    down_clean(cli, tb3, inv, "e2eint")


def test_registry_unreachable_names_host_and_cause(cli: Cli, tb3: Any, tmp_path: Path) -> None:
    repo_path = tb3.image.split("/", 1)[1]
    gone = f"{tb3.registry.rsplit(':', 1)[0]}:5999/{repo_path}"  # nothing listens there
    inv = write_inventory(tb3, tmp_path / "inv.yaml", name="e2ereg", image=gone)
    res = cli("up", str(inv))
    out = output(res)
    assert res.returncode == 1, out
    assert "pull failed on decode" in out and "registry unreachable" in out
    assert ids(tb3, "e2ereg") == {}


def test_disk_full_during_pull(cli: Cli, make_testbed: Any, tmp_path: Path) -> None:
    from tests.testbed.harness import HostSpec

    tb = make_testbed([HostSpec("decode", overrides={"disk_mb": 24}), "prefill", "ingress"])
    inv = write_inventory(tb, tmp_path / "inv.yaml", name="e2edisk")
    res = cli("up", str(inv))
    out = output(res)
    assert res.returncode == 1, out
    assert "pull failed on decode" in out and "disk full" in out
    assert "pull failed on prefill" not in out


def test_missing_token_source_is_a_usage_error(cli: Cli, tb3: Any, tmp_path: Path) -> None:
    inv = write_inventory(tb3, tmp_path / "inv.yaml", name="e2etok")
    res = cli("up", str(inv), env={TOKEN_ENV: None}, timeout=120)
    assert res.returncode == 2, output(res)
    assert TOKEN_ENV in output(res) and "not set" in output(res)
    assert ids(tb3, "e2etok") == {}
