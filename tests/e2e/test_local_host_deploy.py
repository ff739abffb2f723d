"""A host whose address is `local`: pdboot itself runs ON a testbed host (entered with the
harness's `host.exec`, i.e. that host's network and mount namespaces, its DOCKER_HOST and
PATH) and deploys there without SSH: local bash, the local Docker engine from DOCKER_HOST,
the local project dir. The real CLI: up (prefill on GPU 0, decode on GPU 1, router beside
them), a chat completion through the router from outside, status, down.

Under CI=true a testbed that cannot start fails this test; elsewhere it skips.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.testbed.harness import HostSpec

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "hf_e2eLOCALtoken0123456789abcdef"
TOKEN_ENV = "PDBOOT_E2E_HF_TOKEN"


def pdboot_on(host: Any, *args: str, timeout: float = 300, setup: str = "") -> Any:
    """The real CLI inside the testbed host (its /tmp is its own: the inventory lives in
    the host's state folder, which both sides see). The token travels in the environment;
    ``setup``: shell lines before (e.g. another way to name the Docker engine)."""
    line = (
        f"{setup}\ncd {shlex.quote(str(ROOT))} && COLUMNS=200 TERM=dumb "
        f"PYTHONPATH={shlex.quote(str(ROOT))} "
        + shlex.join([sys.executable, "-m", "pdboot", *args])
    )
    return host.exec(["/bin/bash", "-c", line], timeout=timeout)


def out(res: Any) -> str:
    return str(res.stdout) + str(res.stderr)


def local_inventory(tb: Any, path: Path, name: str) -> Path:
    inv: dict[str, Any] = {
        "name": name,
        "model": "Qwen/Qwen3-0.6B",
        "image": tb.image,
        "router_image": tb.router_image,
        "hosts": {"me": {"address": "local"}},
        "prefill": {"hosts": ["me"], "gpus": [0], "env": {"STANDIN_LOAD_SECONDS": "0.5"}},
        "decode": {"hosts": ["me"], "gpus": [1], "env": {"STANDIN_LOAD_SECONDS": "0.5"}},
        "router": {"host": "me", "proxy_image": tb.proxy_image},
        "secrets": {"hf_token": f"env:{TOKEN_ENV}"},
        # the testbed's root lacks CAP_SYS_RESOURCE: lowered limits (testbed recipe)
        "container": {"ulimits": {"memlock": 8388608, "nofile": 20000}, "shm_size": "1g"},
        "requirements": {"min_free_disk_gb": 1},
        "weights": {
            "stage": False
        },  # a name only: no hub serves it (tests/e2e/test_weights_staged_once_per_host.py)
        "timeouts": {
            "ready_seconds": 60,
            "router_ready_seconds": 60,
            "poll_interval_seconds": 0.2,
            "pull_seconds": 300,
        },
    }
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def test_local_host_up_status_down_inside_a_testbed_host(
    make_testbed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tb = make_testbed([HostSpec("solo", profile="rtx6000x2")])
    solo = tb.hosts["solo"]
    monkeypatch.setenv(TOKEN_ENV, TOKEN)  # host.exec passes our environment on
    inv = local_inventory(tb, solo.dir / "local.yaml", "localdep")
    solo.stop_sshd()  # proof that nothing goes through SSH
    # ... and that the engine is the one DOCKER_HOST names (host.exec sets it), not a guess
    solo.exec("rm /run/docker.sock", check=True)

    up = pdboot_on(solo, "up", str(inv))
    assert up.returncode == 0, out(up)
    assert "preflight skipped" not in up.stdout and "PASS: " in up.stdout  # ran, locally
    assert re.search(r"^\S+: \d+ passed", up.stdout, re.M)
    assert "http://127.0.0.1:8000/v1" in up.stdout
    assert "decode pulled the KV cache from a prefill engine" in up.stdout
    assert TOKEN not in out(up)

    # the containers run on that host's own engine, each on its GPU
    ps = solo.docker("ps", "--format", "{{.Names}}").stdout.split()
    assert sorted(ps) == [
        "pdboot-localdep-decode",
        "pdboot-localdep-prefill",
        "pdboot-localdep-proxy",  # the endpoint, in front of the router (on its loopback)
        "pdboot-localdep-router",
    ]
    for svc, gpu in (("prefill", "0"), ("decode", "1")):
        doc = json.loads(solo.docker("inspect", f"pdboot-localdep-{svc}").stdout)[0]
        reqs = doc["HostConfig"]["DeviceRequests"]
        assert [r["DeviceIDs"] for r in reqs] == [[gpu]], svc
    # the project dir and the token file on that host, with their modes
    modes = solo.exec(
        "stat -c '%a %n' /var/lib/pdboot/localdep /var/lib/pdboot/localdep/secrets.env "
        "/var/lib/pdboot/localdep/compose.yaml"
    )
    assert modes.stdout.split("\n")[:3] == [
        "700 /var/lib/pdboot/localdep",
        "600 /var/lib/pdboot/localdep/secrets.env",
        "644 /var/lib/pdboot/localdep/compose.yaml",
    ], modes.stdout + modes.stderr

    # a request from outside, through the router the host serves on its address
    body = {
        "model": "Qwen/Qwen3-0.6B",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
    }
    req = urllib.request.Request(
        f"http://{solo.address}:8000/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        reply = json.loads(r.read())
    assert reply["usage"]["completion_tokens"] == 3

    st = pdboot_on(solo, "status", str(inv), "--json")
    assert st.returncode == 0, out(st)
    doc = json.loads(st.stdout)
    assert doc["healthy"] is True
    assert {s["service"]: s["matches_inventory"] for s in doc["services"]} == {
        "decode@me": True,
        "prefill@me": True,
        "router@me": True,
        "proxy@me": True,
    }
    again = pdboot_on(solo, "up", str(inv))  # its preflight passes its own ports
    assert again.returncode == 0, out(again)
    assert sum("unchanged" in ln for ln in again.stdout.splitlines()) == 4, again.stdout

    down = pdboot_on(solo, "down", str(inv))
    assert down.returncode == 0, out(down)
    assert solo.docker("ps", "-aq").stdout.split() == []
    # the token file went with the containers; the project and preflight's RDMA record stay
    left = solo.exec("ls -A /var/lib/pdboot/localdep").stdout.split()
    # + up's marker and the proxy's nginx.conf (its key file, had there been one, is gone)
    # .pdboot-pulled: what up pulled, so that down --purge removes only that
    assert left == [
        ".pdboot-deployment",
        ".pdboot-pulled",
        "compose.yaml",
        "proxy-nginx.conf",
        "rdma.json",
    ]
    purge = pdboot_on(solo, "down", str(inv), "--purge")
    assert purge.returncode == 0, out(purge)
    assert solo.exec("ls -A /var/lib/pdboot").stdout.split() == ["hf-cache"]  # kept


def test_mixed_local_and_ssh_hosts_with_a_docker_context(make_testbed: Any) -> None:
    """pdboot on host `a` (address local, advertise_address for the peer; its engine named
    only by a docker context, as on a workstation) deploys prefill + router there and decode
    on `b` over SSH; the KV cache crosses hosts."""
    tb = make_testbed([HostSpec("a", profile="rtx6000x2"), HostSpec("b", profile="rtx6000x2")])
    a = tb.hosts["a"]
    inv = tb.inventory(
        a.dir / "mixed.yaml",
        name="mixed",
        prefill=["a"],
        decode=["b"],
        router="a",
        overrides={
            "hosts": {"a": {"address": "local", "advertise_address": a.address}},
            "prefill": {"env": {"STANDIN_LOAD_SECONDS": "0.5"}},
            "decode": {"env": {"STANDIN_LOAD_SECONDS": "0.5"}},
        },
    )
    cfg = a.dir / "docker-config"
    a.exec("rm /run/docker.sock", check=True)
    make_ctx = (
        f"export DOCKER_CONFIG={shlex.quote(str(cfg))}; "
        f"docker context create pdt --docker host={shlex.quote(a.docker_host)} >/dev/null; "
        "docker context use pdt >/dev/null"
    )
    setup = f"unset DOCKER_HOST; export DOCKER_CONFIG={shlex.quote(str(cfg))}"
    assert a.exec(["/bin/bash", "-c", f"unset DOCKER_HOST; {make_ctx}"]).returncode == 0

    up = pdboot_on(a, "up", str(inv), setup=setup)
    assert up.returncode == 0, out(up)
    assert f"http://{a.address}:8000/v1" in up.stdout
    assert "decode pulled the KV cache from a prefill engine" in up.stdout
    assert sorted(a.docker("ps", "--format", "{{.Names}}").stdout.split()) == [
        "pdboot-mixed-prefill",
        "pdboot-mixed-proxy",
        "pdboot-mixed-router",
    ]
    assert tb.hosts["b"].docker("ps", "--format", "{{.Names}}").stdout.split() == [
        "pdboot-mixed-decode"
    ]
    # the side channel the peer is told is a's routable address, not loopback
    env = json.loads(a.docker("inspect", "pdboot-mixed-prefill").stdout)[0]["Config"]["Env"]
    assert f"VLLM_NIXL_SIDE_CHANNEL_HOST={a.address}" in env

    st = pdboot_on(a, "status", str(inv), "--json", setup=setup)
    assert st.returncode == 0, out(st)
    assert all(s["matches_inventory"] for s in json.loads(st.stdout)["services"]), st.stdout

    down = pdboot_on(a, "down", str(inv), setup=setup)
    assert down.returncode == 0, out(down)
    for h in tb.hosts.values():
        assert h.docker("ps", "-aq").stdout.split() == [], h.name
