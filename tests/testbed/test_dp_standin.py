"""The stand-in image's data parallelism across two testbed hosts: a DP head on one host, a
headless follower on another joining it over the real network, and a decode engine pulling
the KV blocks of the follower's rank from the follower's host."""

from __future__ import annotations

import json
import shlex
import time
import urllib.request

from tests.testbed.harness import Testbed
from tests.testbed.scrape import per_engine
from tests.testbed.test_harness import _engine, _http, _wait_http

RPC = 13345
KV = {"kv_connector": "NixlConnector"}


def _refused(url: str) -> bool:
    try:
        _http(url, timeout=2)
    except OSError:
        return True
    return False


def test_dp_head_and_headless_follower_on_two_hosts(testbed_clean: Testbed) -> None:
    tb = testbed_clean
    pre, dec = tb.hosts["prefill"], tb.hosts["decode"]
    for h in (pre, dec):
        h.pull(tb.image)
    producer = shlex.quote(json.dumps({**KV, "kv_role": "kv_producer"}))
    dp = f"-dp 3 -dpa {pre.address} -dpp {RPC} --enable-expert-parallel"
    _engine(
        tb,
        "prefill",
        "head",
        f"--port 8200 {dp} -dpl 2 --kv-transfer-config {producer}",
        {
            "VLLM_NIXL_SIDE_CHANNEL_HOST": pre.address,
            "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600",
            "STANDIN_LOAD_SECONDS": "0.2",
        },
    )
    head = f"http://{pre.address}:8200"
    time.sleep(2)
    assert _refused(head + "/health"), "the head answered before its follower joined"

    _engine(
        tb,
        "decode",
        "follower",
        f"{dp} -dpl 1 -dpr 2 --headless --kv-transfer-config {producer}",
        {
            "VLLM_NIXL_SIDE_CHANNEL_HOST": dec.address,
            "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600",
            "STANDIN_LOAD_SECONDS": "0.2",
        },
    )
    consumer = shlex.quote(json.dumps({**KV, "kv_role": "kv_consumer"}))
    _engine(
        tb,
        "decode",
        "decode",
        f"--port 8201 --kv-transfer-config {consumer}",
        {
            "VLLM_NIXL_SIDE_CHANNEL_HOST": dec.address,
            "VLLM_NIXL_SIDE_CHANNEL_PORT": "5700",
            "STANDIN_LOAD_SECONDS": "0.2",
        },
    )
    _wait_http(head + "/health")
    _wait_http(f"http://{dec.address}:8201/health")
    follower_log = tb.ssh("decode", "docker logs follower 2>&1").stdout
    assert f"with head node address tcp://{pre.address}:{RPC}" in follower_log

    req = {
        "model": "Qwen/Qwen3-0.6B",
        "prompt": "the quick brown fox " * 4,
        "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True},
    }
    data = json.dumps(req).encode()
    r = urllib.request.Request(
        head + "/v1/completions",
        data=data,
        headers={"Content-Type": "application/json", "X-data-parallel-rank": "2"},
    )
    with urllib.request.urlopen(r, timeout=30) as resp:
        params = json.loads(resp.read())["kv_transfer_params"]
    assert params["remote_engine_id"].endswith("_dp2")
    assert (params["remote_host"], params["remote_port"]) == (dec.address, 5602)

    status, body = _http(
        f"http://{dec.address}:8201/v1/completions",
        {**req, "max_tokens": 4, "kv_transfer_params": params},
    )
    assert status == 200, body
    d_metrics = _http(f"http://{dec.address}:8201/metrics")[1]
    assert per_engine(d_metrics, "vllm:nixl_xfer_time_seconds_count") == {"0": 1.0}
    h_metrics = _http(head + "/metrics")[1]
    assert per_engine(h_metrics, "vllm:prompt_tokens_total") == {"0": 0.0, "1": 0.0, "2": 16.0}

    # The follower exits (status 0, as vLLM's run_headless) once its head is gone.
    tb.ssh("prefill", "docker rm -f head", check=True)
    rc = tb.ssh("decode", "docker wait follower", check=True, timeout=60).stdout.strip()
    assert rc == "0"
