"""Re-running `pdboot up` on a live deployment with its preflight (issue 22): the ports and
GPU memory its own engines and router hold pass, with a note naming them; anything else on
the same hosts still fails. The real CLI against testbed hosts (real sshd, dockerd, Compose
v2, registry and vllm-router; stand-in engines; GPUs emulated, with the memory the engines'
containers hold shown by the host's nvidia-smi).

Under CI=true a testbed that cannot start fails these tests; elsewhere they skip.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli import Cli, output
from tests.e2e.test_up_status_down import ids, token_cli, write_inventory
from tests.testbed.router_admin import router_json

pytestmark = [pytest.mark.testbed, pytest.mark.slow]


@pytest.fixture(scope="module")
def cli(cli: Cli) -> Cli:
    return token_cli(cli)


NAME = "rerun"
# the 1P1D deployment's services, as a re-run that changes nothing shows them
UNCHANGED = dict.fromkeys(
    ("decode@decode", "prefill@prefill", "router@ingress", "proxy@ingress"), "unchanged"
)


def edit(path: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    doc = yaml.safe_load(path.read_text())
    change(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def up(cli: Cli, inv: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`pdboot up` with no flags, as an operator re-runs it (``extra``: --events FILE)."""
    return cli("up", str(inv), *extra, preflight=True)


def steps(res: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """service key -> converge step (unchanged / create / recreate / remove) as `up` shows it."""
    out = {}
    for line in res.stdout.splitlines():
        parts = line.split()
        if (
            len(parts) >= 2
            and "@" in parts[0]
            and parts[1] in ("unchanged", "create", "recreate", "remove")
        ):
            out[parts[0]] = parts[1]
    return out


def preflight_json(cli: Cli, inv: Path) -> tuple[int, dict[str, Any]]:
    # the shell `up` runs in (the token set): preflight checks the secret references too
    p = cli("preflight", str(inv), "--json", timeout=180)
    try:
        return p.returncode, json.loads(p.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"not JSON (rc {p.returncode}):\n{p.stdout}\n{p.stderr}")


def check(doc: dict[str, Any], host: str, cid: str) -> dict[str, str]:
    return next(c for c in doc["hosts"][host]["checks"] if c["id"] == cid)


def workers(tb: Any) -> set[tuple[str, str]]:
    got = router_json(tb.hosts["ingress"])  # the router's loopback, from its host
    return {(w["worker_type"], w["url"]) for w in got["workers"]}


def test_up_reruns_converge_with_their_own_preflight(
    cli: Cli, make_testbed: Any, tmp_path: Path
) -> None:
    tb = make_testbed(["decode", "d2", "prefill", "ingress"])
    path = tmp_path / "inv.yaml"
    inv = write_inventory(tb, path, name=NAME)
    first = up(cli, inv)
    assert first.returncode == 0, output(first)

    # `pdboot preflight` on the live deployment: passes, naming what holds each resource
    rc, doc = preflight_json(cli, inv)
    assert rc == 0 and doc["ok"], json.dumps(doc, indent=1)
    for host, key, ports in (
        ("decode", "decode@decode", "8201 (decode HTTP), 5601 (decode NIXL side channel)"),
        ("prefill", "prefill@prefill", "8200 (prefill HTTP), 5600 (prefill NIXL side channel)"),
        ("ingress", "router@ingress", "8081 (router HTTP), 29000 (router metrics)"),
    ):
        c = check(doc, host, "host.ports")
        assert c["status"] == "pass", c
        mine = f"{ports} held by this deployment: {key} (up keeps it)"
        if host == "ingress":  # and the proxy in front of the router; the swap's spare ports
            mine += "; 8000 (proxy HTTP) held by this deployment: proxy@ingress (up keeps it)"
            mine = "ports 8082, 29001 free; " + mine
        else:  # NIXL's exporter port (HTTP + 1000): the stand-in engine runs no NIXL agent
            mine = f"ports {9201 if host == 'decode' else 9200} free; " + mine
        assert c["message"] == mine, c
        assert check(doc, host, "host.deployment")["message"].endswith(f"{key} (up keeps it)")
    for host, key in (("decode", "decode@decode"), ("prefill", "prefill@prefill")):
        mem = check(doc, host, "gpu.memory_free")
        # the emulated engine holds --gpu-memory-utilization (0.9) of each GPU's 97887 MiB
        assert mem["status"] == "pass", mem
        assert f"held by this deployment: {key} (up keeps it) (GPU 0: 88098 MiB" in mem["message"]

    # the same inventory again, no flags: every service unchanged, nothing restarted
    before = ids(tb, NAME)
    events_file = tmp_path / "again.jsonl"
    again = up(cli, inv, "--events", str(events_file))
    assert again.returncode == 0, output(again)
    assert "preflight skipped" not in again.stdout and "PASS: 3 host(s)" in again.stdout
    # up --events carries preflight's checks, those `pdboot preflight --json` reports
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    checks = [e for e in events if e["event"] == "preflight_check"]
    for host, h in doc["hosts"].items():
        assert [c["id"] for c in checks if c["host"] == host] == [c["id"] for c in h["checks"]]
        assert {"id", "status", "message", "fix"} <= set(checks[0])
    assert [e["host"] for e in events if e["event"] == "preflight_host"] == list(doc["hosts"])
    assert steps(again) == UNCHANGED, again.stdout
    assert ids(tb, NAME) == before

    # a host added to the decode tier: it is created, the router re-registers the workers
    edit(
        path,
        lambda d: (
            d["decode"]["hosts"].append("d2"),
            d["hosts"].update(d2={"address": tb.hosts["d2"].address}),
        ),
    )
    grown = up(cli, path)
    assert grown.returncode == 0, output(grown)
    grew = {"decode@d2": "create", "router@ingress": "recreate"}
    assert steps(grown) == {**UNCHANGED, **grew}, grown.stdout
    assert ("decode", f"http://{tb.hosts['d2'].address}:8201") in workers(tb)
    assert ids(tb, NAME)["decode@decode"] == before["decode@decode"]

    # and removed again: the rest stays, the router forgets it
    edit(path, lambda d: (d["decode"]["hosts"].remove("d2"), d["hosts"].pop("d2")))
    shrunk = up(cli, path)
    assert shrunk.returncode == 0, output(shrunk)
    assert steps(shrunk) == {**UNCHANGED, "router@ingress": "recreate"}, shrunk.stdout
    assert ("decode", f"http://{tb.hosts['d2'].address}:8201") not in workers(tb)

    # GPUs regrouped on a host: a prefill engine joins decode's host on GPU 1, which the
    # running decode (all GPUs) holds; decode moves to GPU 0 and is replaced first
    def regroup(d: dict[str, Any]) -> None:
        d["prefill"]["hosts"].append("decode")
        d["prefill"]["gpus"] = [1]
        d["decode"]["gpus"] = [0]

    edit(path, regroup)
    rc, doc = preflight_json(cli, path)
    mem = check(doc, "decode", "gpu.memory_free")
    assert rc == 0 and mem["status"] == "pass", json.dumps(doc["hosts"]["decode"], indent=1)
    assert (
        "decode@decode (up replaces it: configuration changed) (GPU 0: 88098 MiB, GPU 1"
        in (mem["message"])
    )
    # the decode tier has one engine: its replacement is an outage, which up asks to accept
    moved = cli("up", str(path), "--yes", preflight=True)
    assert moved.returncode == 0, output(moved)
    engines = {"decode@decode": "recreate", "prefill@prefill": "recreate"}
    assert steps(moved) == {**UNCHANGED, **engines, "prefill@decode": "create"}, moved.stdout
    # prefill@decode is given GPU 1, which the old decode@decode held: it starts after it
    assert "start after the engines leaving its host" in moved.stdout, moved.stdout
    res = cli("down", str(path))
    assert res.returncode == 0, output(res)


def test_a_foreign_port_on_a_host_of_the_deployment_still_fails(
    cli: Cli, make_testbed: Any, tmp_path: Path
) -> None:
    tb = make_testbed(["decode", "prefill", "ingress"])
    path = tmp_path / "inv.yaml"
    inv = write_inventory(tb, path, name=NAME)
    first = up(cli, inv)
    assert first.returncode == 0, output(first)
    before = ids(tb, NAME)
    # decode's HTTP port moves to one a process outside any container listens on
    squatter = tb.hosts["decode"].occupy_port(8301)
    try:
        edit(path, lambda d: d["decode"].update(port=8301))
        res = up(cli, path)
        out = output(res)
        assert res.returncode == 1, out
        assert f"8301 (decode HTTP) is taken by python3 (pid {squatter.pid})" in out, out
        assert "preflight failed: nothing was pulled or started" in out, out
        assert ids(tb, NAME) == before  # nothing touched
        rc, doc = preflight_json(cli, path)
        c = check(doc, "decode", "host.ports")
        assert rc == 1 and c["status"] == "fail", c
        # the deployment's own side channel on the same host is still told apart
        assert c["message"] == (
            f"8301 (decode HTTP) is taken by python3 (pid {squatter.pid}); 5601 (decode NIXL "
            "side channel) held by this deployment: decode@decode (up replaces it: "
            "configuration changed)"
        ), c
        assert check(doc, "prefill", "host.ports")["status"] == "pass"
    finally:
        tb.hosts["decode"].release_port(8301)
    res = cli("down", str(path))
    assert res.returncode == 0, output(res)
