"""Data-parallel tiers end to end (issue 10): a decode tier of DP 4 across two hosts (2 ranks
each, expert parallel) and a prefill tier of DP 2 on a third host. Real CLI (a subprocess),
real sshd, dockerd, Compose v2, registry and vllm-router; stand-in vLLM engines that do
vLLM's multi-node DP (head + headless followers, per-rank side channels and engine ids).

Checked: `up` starts heads and followers together and is ready on the heads' /health; a chat
completion through the router; KV pulled from the serving prefill rank's side channel (the
prefill rank in the head's metrics, the pulling decode rank's nixl_xfer_time_seconds_count,
and a pull aimed at one rank on the follower host); status per rank; a decode env change
recreates the whole decode tier (and the router) but not prefill; logs of a follower; down.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.cli import Cli, output
from tests.testbed.harness import HostSpec, Testbed

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

RANK = "X-data-parallel-rank"
KEY_ENV = "PDBOOT_E2E_DP_KEY"
KEY = "sk-dpE2Esecret0123456789abcdef"


@pytest.fixture(scope="module")
def cli(cli: Cli) -> Cli:
    return cli.with_(timeout=400, env={KEY_ENV: KEY, "COLUMNS": "220"})


AUTH = {"Authorization": f"Bearer {KEY}"}


def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def by_engine(url: str, name: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    got: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(rf'^{re.escape(name)}\{{[^}}]*engine="(\d+)"[^}}]*\}} (\S+)$', line)
        if m:
            got[m.group(1)] = got.get(m.group(1), 0.0) + float(m.group(2))
    return got


def labels_of(tb: Testbed, host: str, deployment: str) -> dict[str, dict[str, str]]:
    res = tb.hosts[host].docker(
        "ps",
        "-a",
        "--no-trunc",
        "--filter",
        f"label=io.pdboot.deployment={deployment}",
        "--format",
        "{{json .}}",
    )
    rows = [json.loads(x) for x in res.stdout.splitlines() if x.strip()]
    return {
        r["ID"]: dict(kv.split("=", 1) for kv in r["Labels"].split(",") if "=" in kv) for r in rows
    }


def checks(doc: dict[str, Any], host: str, cid: str) -> list[dict[str, str]]:
    return [c for c in doc["hosts"][host]["checks"] if c["id"] == cid]


def preflight(cli: Cli, inv: Path, *only: str) -> dict[str, Any]:
    args = [x for o in only for x in ("--only", o)]
    res = cli("preflight", str(inv), "--json", *args, timeout=200)
    try:
        return dict(json.loads(res.stdout))
    except json.JSONDecodeError:
        pytest.fail(f"not JSON (rc {res.returncode}):\n{output(res)}")


def check_preflight(cli: Cli, tb: Testbed, inv: Path, tmp_path: Path) -> None:
    """The DP checks before anything runs: the follower reaches the head's RPC port, every
    rank's side channel is free and reachable, the GPUs cover local size x TP."""
    doc = preflight(cli, inv, "network", "host.ports", "gpu.count")
    a = tb.hosts["dec-a"].address
    rpc = checks(doc, "dec-b", "network.dp_rpc")
    assert [c["status"] for c in rpc] == ["pass"], rpc
    assert f"dec-b -> dec-a {a}:13346 (decode DP head's RPC port): reachable" in rpc[0]["message"]
    assert not checks(doc, "dec-a", "network.dp_rpc")
    ports = checks(doc, "dec-a", "host.ports")
    assert ports[0]["status"] == "pass" and "8201, 5601, 5602, 9201, 13346" in ports[0]["message"]
    assert "5603, 5604" in checks(doc, "dec-b", "host.ports")[0]["message"]
    side = checks(doc, "dec-b", "network.side_channel")
    assert sorted(c["message"].split(" (")[0].rsplit(":", 1)[1] for c in side) == ["5600", "5601"]
    assert all(c["status"] == "pass" for c in side), side
    assert checks(doc, "dec-b", "gpu.count")[0]["status"] == "pass"
    # 4 ranks of TP 1 on a 2-GPU host: refused, naming the ranks
    big = tb.inventory(
        tmp_path / "big.yaml",
        name="dpbig",
        decode=["dec-a", "dec-b"],
        prefill=["pre"],
        router="pre",
        overrides={"decode": {"data_parallel": {"size": 8, "size_local": 4}}},
    )
    count = checks(preflight(cli, big, "gpu.count"), "dec-b", "gpu.count")
    assert count[0]["status"] == "fail", count
    assert "ranks 4-7 of 8 (headless), TP 1 each) selects GPU(s) [2, 3]" in count[0]["message"]


def dp_inventory(tb: Any, path: Path, dp_decode: dict[str, Any], standin: dict[str, str]) -> Path:
    """dpe2e: ``dp_decode`` on dec-a and dec-b, a DP prefill of 2 on pre, DP-aware routing,
    the workers' key through secrets.env only."""
    return tb.inventory(
        path,
        name="dpe2e",
        decode=["dec-a", "dec-b"],
        prefill=["pre"],
        router="pre",
        overrides={
            "decode": dp_decode,
            "prefill": {"data_parallel": {"size": 2}, "env": standin},
            "router": {"dp_aware": True},
            "secrets": {"api_key": f"env:{KEY_ENV}"},
        },
    )


def test_dp_tiers_up_request_status_change_down(
    cli: Cli, make_testbed: Any, tmp_path: Path
) -> None:
    tb = make_testbed([HostSpec("dec-a"), HostSpec("dec-b"), HostSpec("pre")])
    standin = {"STANDIN_LOAD_SECONDS": "0.5", "STANDIN_DP_HANDSHAKE_TIMEOUT_S": "60"}
    dp_decode = {
        "hosts": ["dec-a", "dec-b"],
        "data_parallel": {"size": 4, "size_local": 2, "expert_parallel": True},
        "env": standin,
    }
    inv = dp_inventory(tb, tmp_path / "inv.yaml", dp_decode, standin)
    a, _b, p = (tb.hosts[h].address for h in ("dec-a", "dec-b", "pre"))
    check_preflight(cli, tb, inv, tmp_path)
    # with preflight, like the re-run below: its findings (RDMA auto) are in the hashes
    res = cli("up", str(inv))
    try:
        assert res.returncode == 0, output(res)
        text = output(res)
        assert "decode@dec-b" in text and "prefill@pre" in text, text

        # the follower runs headless: its compose command carries the start rank
        cmd = (
            tb.hosts["dec-b"]
            .docker("inspect", "pdboot-dpe2e-decode", "--format", "{{json .Config.Cmd}}")
            .stdout
        )
        args = json.loads(cmd)
        assert "--headless" in args and args[args.index("--data-parallel-start-rank") + 1] == "2"
        assert args[args.index("--data-parallel-address") + 1] == a
        assert "--enable-expert-parallel" in args and "--port" not in args
        rcmd = json.loads(
            tb.hosts["pre"]
            .docker("inspect", "pdboot-dpe2e-router", "--format", "{{json .Config.Cmd}}")
            .stdout
        )
        assert rcmd[rcmd.index("--intra-node-data-parallel-size") + 1] == "4"
        assert KEY not in json.dumps(rcmd) and "--api-key" not in rcmd

        # a chat completion through the router: served by one prefill rank, pulled by one
        # decode rank
        pm0 = by_engine(f"http://{p}:8200/metrics", "vllm:request_success_total")
        dx0 = by_engine(f"http://{a}:8201/metrics", "vllm:nixl_xfer_time_seconds_count")
        assert sorted(pm0) == ["0", "1"] and sorted(dx0) == ["0", "1", "2", "3"], (pm0, dx0)
        chat = post(
            f"http://{p}:8000/v1/chat/completions",
            {
                "model": "Qwen/Qwen3-0.6B",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "hello there"}],
            },
            AUTH,
        )
        assert chat["choices"][0]["message"]["content"]
        pm1 = by_engine(f"http://{p}:8200/metrics", "vllm:request_success_total")
        dx1 = by_engine(f"http://{a}:8201/metrics", "vllm:nixl_xfer_time_seconds_count")
        served = [r for r in pm1 if pm1[r] > pm0.get(r, 0)]
        pulled = [r for r in dx1 if dx1[r] > dx0.get(r, 0)]
        assert len(served) == 1 and len(pulled) == 1, (pm0, pm1, dx0, dx1)

        # KV from the right rank's side channel: prefill rank 1 advertises base + 1 and its
        # engine id _dp1; decode rank 3 (on the follower host dec-b) pulls exactly that
        pre = post(
            f"http://{p}:8200/v1/completions",
            {
                "model": "Qwen/Qwen3-0.6B",
                "prompt": "one two three",
                "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
            },
            {RANK: "1", **AUTH},
        )
        kvp = pre["kv_transfer_params"]
        assert (kvp["remote_host"], kvp["remote_port"]) == (p, 5601), kvp
        assert kvp["remote_engine_id"].endswith("_dp1"), kvp
        before = by_engine(f"http://{a}:8201/metrics", "vllm:nixl_xfer_time_seconds_count")
        post(
            f"http://{a}:8201/v1/completions",
            {
                "model": "Qwen/Qwen3-0.6B",
                "prompt": "one two three",
                "max_tokens": 2,
                "kv_transfer_params": kvp,
            },
            {RANK: "3", **AUTH},
        )
        after = by_engine(f"http://{a}:8201/metrics", "vllm:nixl_xfer_time_seconds_count")
        assert after["3"] == before["3"] + 1 and after["2"] == before["2"], (before, after)

        # status per rank
        rows = {r["service"]: r for r in cli.status_json(inv)["services"]}
        assert rows["decode@dec-a"]["ranks"].startswith("ranks 0-1 of 4 (head)")
        assert rows["decode@dec-a"]["ranks"].endswith("/metrics engines 0,1,2,3")
        assert rows["decode@dec-b"]["ranks"] == "ranks 2-3 of 4 (headless)"
        assert rows["decode@dec-b"]["health"] == "ok"
        assert rows["prefill@pre"]["ranks"].endswith("/metrics engines 0,1")
        human = cli("status", str(inv))
        assert "Data-parallel ranks:" in output(human), output(human)

        # logs of a follower, by its key
        lg = cli("logs", str(inv), "decode@dec-b", "--tail", "50")
        assert lg.returncode == 0 and "headless mode" in output(lg), output(lg)

        # a decode env change recreates the whole decode tier and the router, not prefill
        ids0 = {h: labels_of(tb, h, "dpe2e") for h in ("dec-a", "dec-b", "pre")}
        dp_decode["env"] = {**standin, "STANDIN_LOAD_SECONDS": "0.6"}
        inv2 = dp_inventory(tb, tmp_path / "inv.yaml", dp_decode, standin)
        res2 = cli("up", str(inv2))  # preflight passes the tier it replaces
        assert res2.returncode == 0, output(res2)
        ids1 = {h: labels_of(tb, h, "dpe2e") for h in ("dec-a", "dec-b", "pre")}
        assert not set(ids0["dec-a"]) & set(ids1["dec-a"])
        assert not set(ids0["dec-b"]) & set(ids1["dec-b"])
        pre_ids = {i for i, lab in ids1["pre"].items() if lab["io.pdboot.role"] == "prefill"}
        assert pre_ids <= set(ids0["pre"]), "prefill was recreated"
        assert {lab.get("io.pdboot.dp-ranks") for lab in ids1["dec-b"].values()} == {"2-3/4"}
    finally:
        down = cli("down", str(inv))
    assert down.returncode == 0, output(down)
    for h in ("dec-a", "dec-b", "pre"):
        assert labels_of(tb, h, "dpe2e") == {}


def test_a_follower_that_cannot_reach_its_head_fails_up(
    cli: Cli, make_testbed: Any, tmp_path: Path
) -> None:
    """vLLM's follower gives up after its handshake timeout (5 min; the stand-in's knob
    shortens it) and exits 0; `up` must fail on the follower, not wait for the head (which
    waits for its ranks forever)."""
    tb = make_testbed([HostSpec("dec-a"), HostSpec("dec-b")])
    inv = tb.inventory(
        tmp_path / "inv.yaml",
        name="dpfail",
        decode=["dec-a", "dec-b"],
        prefill=["dec-a"],
        router="dec-a",
        overrides={
            "decode": {
                "gpus": [0],
                "data_parallel": {"size": 2},
                "env": {"STANDIN_LOAD_SECONDS": "0.5", "STANDIN_DP_HANDSHAKE_TIMEOUT_S": "3"},
            },
            "prefill": {"gpus": [1], "env": {"STANDIN_LOAD_SECONDS": "0.5"}},
            "timeouts": {"ready_seconds": 90},
        },
    )
    a = tb.hosts["dec-a"].address
    # the follower's host cannot reach the head's RPC port (a firewall in its namespace)
    tb.hosts["dec-b"].exec(
        ["iptables", "-A", "OUTPUT", "-p", "tcp", "-d", a, "--dport", "13346", "-j", "DROP"]
    )
    try:
        res = cli("up", str(inv), "--skip-preflight")
        text = output(res)
        assert res.returncode == 1, text
        assert "decode@dec-b" in text and "exited" in text, text
        assert "Did not receive response from front-end process within 5 minutes" in text, text
        assert "router@dec-a" not in [
            ln.split()[0] for ln in text.splitlines() if ln.startswith("ready ")
        ]
    finally:
        tb.hosts["dec-b"].exec(
            ["iptables", "-D", "OUTPUT", "-p", "tcp", "-d", a, "--dport", "13346", "-j", "DROP"]
        )
        cli("down", str(inv))
