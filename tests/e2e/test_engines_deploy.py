"""Several engines per host, end to end: the real CLI (a subprocess) against two rtx6000x8
testbed hosts (8 emulated RTX PRO 6000 each, four HCAs with mlx5_3 PORT_DOWN, a real-format
`nvidia-smi topo -m`), real sshd, dockerd, Compose v2 and vllm-router; stand-in engines.

2 hosts x 4 engines per tier at TP 1 (prefill on gpu-a, decode on gpu-b), and a colocated
variant (4 + 4 on one host). A burst through the router reaches every decode engine and
each pulls its KV (vLLM's own counter, vllm:nixl_xfer_time_seconds_count, on each decode);
each engine is granted only its GPU and gets its nearest NIC as UCX_NET_DEVICES; status
lists every engine; a change to one group recreates only that engine, rolled through the
running router; down.
"""

from __future__ import annotations

import json
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli import Cli, output
from tests.conftest import RTX_PAIR, module_testbed
from tests.testbed.harness import Testbed
from tests.testbed.inventory import rtx_pair_dict
from tests.testbed.router_admin import router_json
from tests.testbed.scrape import metric

pytestmark = [pytest.mark.testbed, pytest.mark.slow]


@pytest.fixture(scope="module")
def cli(cli: Cli) -> Cli:
    return cli.with_(timeout=400)


MODEL = "Qwen/Qwen3-0.6B"
# prefill on gpu-a, GPUs 0-3; decode on gpu-b, one engine per listed GPU
PREFILL_NICS = {
    0: ("mlx5_0:1", "PIX"),
    1: ("mlx5_0:1", "PXB"),
    2: ("mlx5_1:1", "PIX"),
    3: ("mlx5_1:1", "PXB"),
}
DECODE_GPUS = [[0], [2], [4], [6]]
DECODE_NICS = {
    0: ("mlx5_0:1", "PIX"),
    2: ("mlx5_1:1", "PIX"),
    4: ("mlx5_2:1", "PIX"),
    6: ("mlx5_2:1", "NODE"),
}  # mlx5_3, beside GPU 6, is down


tb = module_testbed(RTX_PAIR)


def write(
    tb: Testbed,
    path: Path,
    name: str,
    prefill: dict[str, Any],
    decode: dict[str, Any],
    router: str = "gpu-a",
) -> Path:
    inv = rtx_pair_dict(tb, name, prefill, decode, router)
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def labelled(tb: Testbed, deployment: str) -> dict[str, dict[str, Any]]:
    """engine key (prefill-2@gpu-a) -> docker inspect of its container, over both hosts."""
    found: dict[str, dict[str, Any]] = {}
    for h in tb.hosts.values():
        ids = h.docker("ps", "-aq", "--filter", f"label=io.pdboot.deployment={deployment}")
        for cid in ids.stdout.split():
            doc = json.loads(h.docker("inspect", cid).stdout)[0]
            lab = doc["Config"]["Labels"]
            role, idx = lab["io.pdboot.role"], lab.get("io.pdboot.engine", "0")
            name = role if idx == "0" else f"{role}-{idx}"
            found[f"{name}@{lab['io.pdboot.host']}"] = doc
    return found


def env_of(doc: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in doc["Config"]["Env"])


def chat(router: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    req = urllib.request.Request(
        f"{router}/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        assert json.loads(r.read())["usage"]["completion_tokens"] == 3


def burst_reaches_every_decode(tb: Testbed, decodes: dict[str, str], router: str) -> None:
    """decodes: engine key -> its /metrics URL. Each must pull KV for its share."""
    before = {k: metric(u, "vllm:nixl_xfer_time_seconds_count") for k, u in decodes.items()}
    for _ in range(3 * len(decodes)):
        chat(router)
    after = {k: metric(u, "vllm:nixl_xfer_time_seconds_count") for k, u in decodes.items()}
    pulled = {k: after[k] - before[k] for k in decodes}
    assert all(n >= 1 for n in pulled.values()), pulled
    assert sum(pulled.values()) == 3 * len(decodes), pulled


def started_spread(docs: list[dict[str, Any]]) -> float:
    ts = [datetime.fromisoformat(d["State"]["StartedAt"][:26]) for d in docs]
    return (max(ts) - min(ts)).total_seconds()


def test_two_hosts_four_engines_per_tier(cli: Cli, tb: Testbed, tmp_path: Path) -> None:
    inv = write(
        tb,
        tmp_path / "inv.yaml",
        "eng2x4",
        prefill={"hosts": ["gpu-a"], "engines_per_host": 4, "gpus": [0, 1, 2, 3]},
        decode={"hosts": ["gpu-b"], "gpus": DECODE_GPUS},
    )
    res = cli("up", str(inv))  # with preflight: it chooses each engine's NIC
    assert res.returncode == 0, output(res)
    assert "nic: decode-3@gpu-b -> mlx5_2:1 (NODE, nearest GPUs 6)" in output(res)
    docs = labelled(tb, "eng2x4")
    assert len(docs) == 10, sorted(docs)  # 8 engines, the router, the proxy
    a, b = tb.hosts["gpu-a"].address, tb.hosts["gpu-b"].address

    # each engine: its own GPU only, its ports, its nearest ACTIVE port as UCX_NET_DEVICES
    for i, gpu in enumerate([0, 1, 2, 3]):
        d = docs["prefill" + (f"-{i}" if i else "") + "@gpu-a"]
        e = env_of(d)
        assert e["UCX_NET_DEVICES"] == PREFILL_NICS[gpu][0], (i, e)
        assert e["VLLM_NIXL_SIDE_CHANNEL_PORT"] == str(5600 + 10 * i)
        req = d["HostConfig"]["DeviceRequests"][0]
        assert req["DeviceIDs"] == [str(gpu)]
    for i, (gpu,) in enumerate(DECODE_GPUS):
        d = docs["decode" + (f"-{i}" if i else "") + "@gpu-b"]
        assert env_of(d)["UCX_NET_DEVICES"] == DECODE_NICS[gpu][0], i
        granted = metric(f"http://{b}:{8201 + 10 * i}/metrics", "standin_granted_gpu_info")
        assert granted == 1  # the stand-in saw exactly one GPU
    # that a host's engines start in one compose up is a unit test of the orchestrator
    # (test_a_hosts_engines_start_in_one_compose_up_and_converge_per_engine); the start
    # spread in seconds is bench/up.py's to show, not a timed assertion here

    # the router has one worker per engine
    workers = router_json(tb.hosts["gpu-a"])["workers"]  # its loopback, from its host
    assert sorted(w["url"] for w in workers) == sorted(
        [f"http://{a}:{8200 + 10 * i}" for i in range(4)]
        + [f"http://{b}:{8201 + 10 * i}" for i in range(4)]
    )
    burst_reaches_every_decode(
        tb,
        {f"decode-{i}": f"http://{b}:{8201 + 10 * i}/metrics" for i in range(4)},
        f"http://{a}:8000",
    )

    rows = {r["service"]: r for r in cli.status_json(inv)["services"]}
    assert len(rows) == 10 and all(
        r["health"] == "ok" and r["matches_inventory"] for r in rows.values()
    )
    assert rows["decode-3@gpu-b"]["nic"] == "mlx5_2:1 (NODE, nearest GPUs 6)"
    assert rows["prefill-2@gpu-a"]["nic"] == "mlx5_1:1 (PIX, nearest GPUs 2)"
    text = cli("status", str(inv))
    assert "decode-3@gpu-b" in text.stdout and "mlx5_2:1 (NODE, nearest GPUs 6)" in text.stdout
    lg = cli("logs", str(inv), "decode-2@gpu-b", "--tail", "500")
    assert lg.returncode == 0 and "GPU" in lg.stdout, output(lg)

    # one group changes (decode-3: GPU 6 -> 7): only that engine is new (the router stays)
    before = {k: d["Id"] for k, d in docs.items()}
    changed = write(
        tb,
        tmp_path / "inv.yaml",
        "eng2x4",
        prefill={"hosts": ["gpu-a"], "engines_per_host": 4, "gpus": [0, 1, 2, 3]},
        decode={"hosts": ["gpu-b"], "gpus": [[0], [2], [4], [7]]},
    )
    res = cli("up", str(changed), "--skip-preflight")
    assert res.returncode == 0, output(res)
    after = {k: d["Id"] for k, d in labelled(tb, "eng2x4").items()}
    assert {k for k in after if after[k] != before.get(k)} == {"decode-3@gpu-b"}
    d3 = labelled(tb, "eng2x4")["decode-3@gpu-b"]
    assert d3["HostConfig"]["DeviceRequests"][0]["DeviceIDs"] == ["7"]
    # the recorded choice was for GPU 6: without a preflight it gets every ACTIVE port
    assert env_of(d3)["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1,mlx5_2:1"

    res = cli("down", str(inv))
    assert res.returncode == 0, output(res)
    assert labelled(tb, "eng2x4") == {}


def test_colocated_four_plus_four(cli: Cli, tb: Testbed, tmp_path: Path) -> None:
    inv = write(
        tb,
        tmp_path / "colo.yaml",
        "engcolo",
        prefill={"hosts": ["gpu-b"], "engines_per_host": 4, "gpus": [0, 1, 2, 3]},
        decode={"hosts": ["gpu-b"], "engines_per_host": 4, "gpus": [4, 5, 6, 7]},
        router="gpu-b",
    )
    res = cli("up", str(inv))
    assert res.returncode == 0, output(res)
    docs = labelled(tb, "engcolo")
    assert len(docs) == 10  # 8 engines, the router, the proxy
    nics = {
        k: env_of(d).get("UCX_NET_DEVICES")
        for k, d in docs.items()
        if not k.startswith(("router", "proxy"))
    }
    assert nics == {
        "prefill@gpu-b": "mlx5_0:1",
        "prefill-1@gpu-b": "mlx5_0:1",
        "prefill-2@gpu-b": "mlx5_1:1",
        "prefill-3@gpu-b": "mlx5_1:1",
        "decode@gpu-b": "mlx5_2:1",
        "decode-1@gpu-b": "mlx5_2:1",
        "decode-2@gpu-b": "mlx5_2:1",
        "decode-3@gpu-b": "mlx5_2:1",
    }
    b = tb.hosts["gpu-b"].address
    burst_reaches_every_decode(
        tb,
        {f"decode-{i}": f"http://{b}:{8201 + 10 * i}/metrics" for i in range(4)},
        f"http://{b}:8000",
    )
    st = cli("status", str(inv), "--json")
    assert st.returncode == 0 and len(json.loads(st.stdout)["services"]) == 10, output(st)
    res = cli("down", str(inv))
    assert res.returncode == 0, output(res)
    assert labelled(tb, "engcolo") == {}


def test_engines_per_host_all_follows_the_gpus_preflight_found(
    cli: Cli, tb: Testbed, tmp_path: Path
) -> None:
    inv = write(
        tb,
        tmp_path / "all.yaml",
        "engall",
        prefill={"hosts": ["gpu-a"], "engines_per_host": "all", "tensor_parallel_size": 2},
        decode={"hosts": ["gpu-b"], "engines_per_host": "all", "tensor_parallel_size": 4},
    )
    blind = cli("up", str(inv), "--skip-preflight")  # nothing recorded yet: no guess
    assert blind.returncode == 1 and "needs preflight's GPU count" in output(blind), output(blind)
    assert labelled(tb, "engall") == {}

    res = cli("up", str(inv))
    assert res.returncode == 0, output(res)
    docs = labelled(tb, "engall")
    groups = {
        k: d["HostConfig"]["DeviceRequests"][0]["DeviceIDs"]
        for k, d in docs.items()
        if not k.startswith(("router", "proxy"))
    }
    assert groups == {
        "prefill@gpu-a": ["0", "1"],
        "prefill-1@gpu-a": ["2", "3"],
        "prefill-2@gpu-a": ["4", "5"],
        "prefill-3@gpu-a": ["6", "7"],
        "decode@gpu-b": ["0", "1", "2", "3"],
        "decode-1@gpu-b": ["4", "5", "6", "7"],
    }
    # a TP group's NIC is the one nearest its farthest GPU; ties give every tied port
    nics = {k: env_of(d).get("UCX_NET_DEVICES") for k, d in docs.items() if "router" not in k}
    assert nics["prefill@gpu-a"] == "mlx5_0:1" and nics["prefill-3@gpu-a"] == "mlx5_2:1"
    assert nics["decode@gpu-b"] == "mlx5_0:1,mlx5_1:1"  # both NODE to GPUs 0-3

    # the count is recorded on the host: without preflight the same engines, unchanged
    again = cli("up", str(inv), "--skip-preflight")
    assert again.returncode == 0, output(again)
    assert {k: d["Id"] for k, d in labelled(tb, "engall").items()} == {
        k: d["Id"] for k, d in docs.items()
    }
    res = cli("down", str(inv))
    assert res.returncode == 0 and labelled(tb, "engall") == {}, output(res)
