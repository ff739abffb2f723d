"""STANDIN_CORRUPT_PULLED_KV: a decode whose pulled KV lands wrong answers 200 with other
words, and pdboot's correctness gate tells it from a healthy pair (loopback, a few seconds)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pdboot.verify import gate
from tests.testbed.standin.test_standin import (
    DEADLINE,
    REQ,
    Engine,
    engines,
    free_port,
    get,
    kv_config,
    post,
    prefill,
    router_binary,
)

__all__ = ["engines"]  # the fixture, re-exported for pytest


def _pd_answer(engines: Any, env: dict[str, str]) -> tuple[str, str, dict[str, float]]:
    p = engines(
        ["org/m", "--served-model-name", "m", "--kv-transfer-config", kv_config("kv_producer")],
        name="prefill",
    )
    d = engines(
        ["org/m", "--served-model-name", "m", "--kv-transfer-config", kv_config("kv_consumer")],
        env,
        name="decode",
    )
    params = prefill(p)
    status, body = post(d.url + "/v1/completions", {**REQ, "kv_transfer_params": params})
    assert status == 200, body
    status, alone = post(d.url + "/v1/completions", REQ)  # the decode prefilling locally
    assert status == 200, alone
    return body["choices"][0]["text"], alone["choices"][0]["text"], d.metrics()


def test_healthy_pull_gives_the_single_engine_answer(engines: Any) -> None:
    pd, alone, _ = _pd_answer(engines, {})
    assert gate.classify(pd, alone).verdict == "identical"


def test_corrupted_kv_answers_200_with_wrong_tokens_and_the_gate_fails(engines: Any) -> None:
    pd, alone, m = _pd_answer(engines, {"STANDIN_CORRUPT_PULLED_KV": "1"})
    # the transfer itself "succeeded", as on a broken GPUDirect path
    assert m["vllm:nixl_bytes_transferred_count"] == 1
    assert m["vllm:nixl_num_failed_transfers_total"] == 0
    assert pd != alone and len(pd.split()) == len(alone.split()) == REQ["max_tokens"]
    out = gate.classify(pd, alone)
    assert out.verdict == "broken" and not out.ok


def _post_text(url: str, body: dict[str, Any]) -> tuple[int, str]:
    status, data = post(url, body)
    return status, data if isinstance(data, str) else json.dumps(data)


def _wait_router(proc: subprocess.Popen[bytes], url: str, log: Path) -> str:
    end = time.monotonic() + DEADLINE
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            if get(url + "/health")[0] == 200:
                return url
        except OSError:
            pass
        assert time.monotonic() < end, log.read_text()
        time.sleep(0.1)


@contextmanager
def _router(prefill_e: Engine, decode_e: Engine, tmp: Path) -> Iterator[str]:
    port = free_port()
    log = tmp / "router.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                router_binary(),
                "--vllm-pd-disaggregation",
                "--prefill",
                prefill_e.url,
                "--decode",
                decode_e.url,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                str(free_port()),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield _wait_router(proc, f"http://127.0.0.1:{port}", log)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=DEADLINE)


@pytest.mark.parametrize("corrupt", [False, True])
def test_gate_through_the_real_router(engines: Any, tmp_path: Path, corrupt: bool) -> None:
    env = {"STANDIN_CORRUPT_PULLED_KV": "1"} if corrupt else {}
    p = engines(
        ["org/m", "--served-model-name", "m", "--kv-transfer-config", kv_config("kv_producer")],
        name="prefill",
    )
    d = engines(
        ["org/m", "--served-model-name", "m", "--kv-transfer-config", kv_config("kv_consumer")],
        env,
        name="decode",
    )
    with _router(p, d, tmp_path) as url:
        out = gate.run_gate(_post_text, url, d.url, "m")
    assert d.metrics()["vllm:nixl_bytes_transferred_count"] == 1  # the P/D path was taken
    if corrupt:
        assert out.verdict == "broken" and not out.ok, out.message()
        assert "dynamo#12463" in out.message()
    else:
        assert out.verdict == "identical", out.message()
