"""The stand-in's data parallelism on loopback: a head with local ranks, a headless follower
joining it over the RPC port, per-rank side channels and engine ids, and a follower with no
head. Plain processes, no root; seconds."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest
from test_standin import (
    PREFILL_PARAMS,
    REQ,
    Engine,
    engine_argv,
    free_port,
    get,
    kv_config,
    post,
    run_once,
    sse_text,
)
from test_standin import engines as standin  # noqa: F401  (the fixture, as `standin`)

from tests.testbed.scrape import per_engine as by_engine
from tests.testbed.standin.router_proc import RouterProc


def free_run(n: int) -> int:
    """A base port with n free ports above it (side channels bind base + rank)."""
    for _ in range(50):
        base = free_port()
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                s.bind(("127.0.0.1", base + i))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free port run")


def refuses(url: str) -> bool:
    try:
        get(url + "/health")
    except OSError:
        return True
    return False


def test_head_waits_for_its_follower_then_ranks_serve_and_advertise(standin: Any) -> None:  # noqa: F811
    rpc, base = free_port(), free_run(3)
    kv = ["--served-model-name", "m", "--kv-transfer-config", kv_config("kv_producer")]
    side = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(base)}
    head = standin(
        [
            "org/m",
            *kv,
            "--data-parallel-size",
            "3",
            "--data-parallel-size-local",
            "2",
            "--data-parallel-address",
            "127.0.0.1",
            "--data-parallel-rpc-port",
            str(rpc),
            "--enable-expert-parallel",
        ],
        side,
        name="head",
        healthy=False,
    )
    head.wait_log("Started DP Coordinator")
    time.sleep(1.0)
    assert head.proc.poll() is None and refuses(head.url), "healthy before rank 2 joined"

    # The follower runs on "another host" (127.0.0.2): its rank's side channel binds there.
    follower = standin(
        [
            "org/m",
            *kv,
            "-dp",
            "3",
            "-dpl",
            "1",
            "-dpr",
            "2",
            "-dpa",
            "127.0.0.1",
            "-dpp",
            str(rpc),
            "--headless",
            "-ep",
        ],
        {**side, "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.2"},
        name="follower",
        healthy=False,
    )
    follower.wait_log(f"with head node address tcp://127.0.0.1:{rpc}")
    head.wait_healthy()
    assert refuses(follower.url)  # headless: no HTTP
    assert "DP rank 2 ready" in head.log
    with pytest.raises(ConnectionRefusedError):  # vLLM closes its handshake socket once
        socket.create_connection(("127.0.0.1", rpc), timeout=5)  # every rank started

    seen = {}
    for rank in (0, 1, 2):
        status, body = post(
            head.url + "/v1/completions",
            {**REQ, "max_tokens": 1, "kv_transfer_params": PREFILL_PARAMS},
            {"X-data-parallel-rank": str(rank)},
        )
        assert status == 200, body
        seen[rank] = body["kv_transfer_params"]
    assert [p["remote_engine_id"].rsplit("_", 1)[1] for p in seen.values()] == ["dp0", "dp1", "dp2"]
    assert (
        seen[0]["remote_engine_id"].rsplit("_", 1)[0]
        == seen[1]["remote_engine_id"].rsplit("_", 1)[0]
    )  # one head: one base id
    assert [(p["remote_host"], p["remote_port"]) for p in seen.values()] == [
        ("127.0.0.1", base),
        ("127.0.0.1", base + 1),
        ("127.0.0.2", base + 2),
    ]

    # A decode engine with two local ranks pulls rank 2's blocks on the follower's host.
    dbase = free_run(2)
    dec = standin(
        engine_argv(kv_config("kv_consumer"), "-dp", "2"),
        {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(dbase)},
        name="decode",
    )
    status, body = post(
        dec.url + "/v1/completions",
        {**REQ, "kv_transfer_params": seen[2]},
        {"X-data-parallel-rank": "1"},
    )
    assert status == 200, body
    dm = get(dec.url + "/metrics")[1]
    assert by_engine(dm, "vllm:nixl_xfer_time_seconds_count") == {"0": 0.0, "1": 1.0}
    hm = get(head.url + "/metrics")[1]
    assert by_engine(hm, "vllm:prompt_tokens_total") == {"0": 45.0, "1": 45.0, "2": 45.0}
    assert hm.count("# TYPE vllm:prompt_tokens_total counter") == 1

    # Without a rank header the head spreads requests over its ranks (follower's included).
    for _ in range(3):
        assert post(head.url + "/v1/completions", REQ)[0] == 200
        # the head counts a request in flight until its handler returns, just after the
        # client has the answer: under load the next one arrived first and skipped that rank
        time.sleep(0.3)
    after = by_engine(get(head.url + "/metrics")[1], "vllm:request_success_total")
    assert after == {"0": 2.0, "1": 2.0, "2": 2.0}

    # A stream served by the follower's rank reaches the client whole, same text as rank 0's.
    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
        "stream": True,
    }
    texts = []
    for rank in ("0", "2"):
        status, raw = post(head.url + "/v1/chat/completions", chat, {"X-data-parallel-rank": rank})
        assert status == 200, raw
        texts.append(sse_text(raw, chat=True))
    assert texts[0] == texts[1] and len(texts[0].split()) == 5


def test_all_local_ranks_bind_no_rpc_port(standin: Any) -> None:  # noqa: F811
    rpc, base = free_port(), free_run(2)
    e = standin(
        [
            "org/m",
            "--served-model-name",
            "m",
            "--kv-transfer-config",
            kv_config("kv_producer", engine_id="pf"),
            "-dp",
            "2",
            "-dpp",
            str(rpc),
        ],
        {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(base)},
    )
    status, body = post(
        e.url + "/v1/completions",
        {**REQ, "max_tokens": 1, "kv_transfer_params": PREFILL_PARAMS},
        {"X-data-parallel-rank": "1"},
    )
    assert status == 200, body
    assert body["kv_transfer_params"]["remote_engine_id"] == "pf_dp1"
    assert body["kv_transfer_params"]["remote_port"] == base + 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", rpc))  # vLLM uses IPC, not TCP, when every rank is local


def test_follower_without_a_head_fails_like_vllm() -> None:
    r = run_once(
        [
            "org/m",
            "--headless",
            "-dp",
            "2",
            "-dpl",
            "1",
            "-dpr",
            "1",
            "-dpa",
            "127.0.0.1",
            "-dpp",
            str(free_port()),
        ],
        {"STANDIN_DP_HANDSHAKE_TIMEOUT_S": "1"},
    )
    assert "EngineCore failed to start." in r.stdout
    assert (
        "RuntimeError: Did not receive response from front-end process within 5 minutes" in r.stderr
    )
    assert r.returncode == 0  # run_headless returns normally after join_first


def test_a_rank_joining_twice_ends_the_head(standin: Any) -> None:  # noqa: F811
    rpc = free_port()
    dp = ["-dp", "4", "-dpa", "127.0.0.1", "-dpp", str(rpc)]
    head = standin(["org/m", *dp, "-dpl", "2"], name="head", healthy=False)
    head.wait_log("Started DP Coordinator")
    env = {"STANDIN_LOAD_SECONDS": "30"}  # rank 2 stays CONNECTED (not READY) meanwhile
    standin(["org/m", *dp, "-dpl", "1", "-dpr", "2", "--headless"], env, name="f", healthy=False)
    time.sleep(1.0)
    standin(["org/m", *dp, "-dpl", "1", "-dpr", "2", "--headless"], env, name="g", healthy=False)
    assert head.proc.wait(timeout=30) == 1
    assert "Unexpected HELLO message for remote engine 2 in CoreEngineState.CONNECTED" in head.log


def test_real_router_dp_aware_pd_mode_reaches_every_rank(
    standin: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """vllm-router's --intra-node-data-parallel-size against DP heads in P/D mode: it learns
    the ranks from /metrics and sends X-data-parallel-rank, which the heads honour."""
    pbase, dbase = free_run(2), free_run(2)
    p = standin(
        engine_argv(kv_config("kv_producer"), "-dp", "2"),
        {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(pbase)},
        name="prefill",
    )
    d = standin(
        engine_argv(kv_config("kv_consumer"), "-dp", "2"),
        {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(dbase)},
        name="decode",
    )
    args = ["--vllm-pd-disaggregation", "--prefill", p.url, "--decode", d.url]
    args += ["--prefill-policy", "round_robin", "--decode-policy", "round_robin"]
    args += ["--intra-node-data-parallel-size", "2", "--api-key", "k"]
    router = RouterProc(args, tmp_path / "router.log")
    url = router.url
    try:
        for _ in range(4):
            status, body = post(url + "/v1/completions", REQ)
            assert status == 200, body
    finally:
        router.stop()
    pulls = by_engine(get(d.url + "/metrics")[1], "vllm:nixl_xfer_time_seconds_count")
    served = by_engine(get(p.url + "/metrics")[1], "vllm:request_success_total")
    assert sum(pulls.values()) == 4 and all(v > 0 for v in pulls.values()), pulls
    assert sum(served.values()) == 4 and all(v > 0 for v in served.values()), served
    for e in (p, d):  # the router chose the ranks, by header
        assert "(X-data-parallel-rank: 0)" in e.log and "(X-data-parallel-rank: 1)" in e.log


def test_engine_is_the_real_option_set() -> None:
    r = run_once(["org/m", "--data-parallel-hybrid-lbx"])
    assert r.returncode == 2 and "unrecognized arguments" in r.stderr


_ = Engine  # the type of what `engines` returns
