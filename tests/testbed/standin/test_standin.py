"""The vLLM stand-in (an emulation) on loopback: its API, its refusals, its NIXL pull, and the
real vllm-router driving a prefill/decode pair of it. No root, no containers; seconds."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.shared_data import SHARED_VLLM
from tests.testbed.standin.router_proc import RouterProc, free_port

STANDIN = Path(__file__).with_name("vllm_standin.py")
DEADLINE = 30.0  # generous bound for "it came up"; nothing asserts on durations


def kv_config(role: str, policy: str = "fail", **extra: Any) -> str:
    cfg: dict[str, Any] = {
        "kv_connector": "NixlConnector",
        "kv_role": role,
        "kv_buffer_device": "cuda",
        "kv_load_failure_policy": policy,
    }
    cfg.update(extra)
    return json.dumps(cfg)


class Engine:
    """One stand-in process; `log` is its merged stdout/stderr."""

    def __init__(self, tmp: Path, name: str, args: list[str], env: dict[str, str]) -> None:
        self.port = free_port()
        self.side_port = free_port()
        self.log_path = tmp / f"{name}.log"
        full_env = {
            **os.environ,
            "STANDIN_LOAD_SECONDS": "0",
            "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(self.side_port),
            **env,
        }
        argv = [sys.executable, str(STANDIN), "serve", *args, "--port", str(self.port)]
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=full_env)
        self.url = f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def wait_log(self, text: str) -> None:
        end = time.monotonic() + DEADLINE
        while text not in self.log:
            assert self.proc.poll() is None or text in self.log, f"exited:\n{self.log}"
            assert time.monotonic() < end, f"{text!r} never logged:\n{self.log}"
            time.sleep(0.05)

    def wait_healthy(self) -> None:
        end = time.monotonic() + DEADLINE
        while True:
            assert self.proc.poll() is None, f"stand-in exited:\n{self.log}"
            try:
                if get(self.url + "/health")[0] == 200:
                    return
            except OSError:
                pass
            assert time.monotonic() < end, f"never healthy:\n{self.log}"
            time.sleep(0.05)

    def metrics(self) -> dict[str, float]:
        return parse_metrics(get(self.url + "/metrics")[1])

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=DEADLINE)


def parse_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            base = name.split("{")[0]
            out[base] = out.get(base, 0.0) + float(value)
    return out


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=DEADLINE) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=DEADLINE) as r:
            raw = r.read().decode()
            return r.status, raw if body.get("stream") else json_or_text(raw)
    except urllib.error.HTTPError as e:
        return e.code, json_or_text(e.read().decode())


def json_or_text(raw: str) -> Any:
    """A body as JSON, or as the text it is (the router answers some errors in plain text:
    a test shows what came back rather than a JSONDecodeError)."""
    try:
        return json.loads(raw or "null")
    except ValueError:
        return raw


def alone_text(decode_url: str, model: str, prompt: str) -> str:
    """The decode's own answer to ``prompt`` (16 tokens, greedy): what a client through the
    router must get, whichever way its request is served."""
    status, alone = post(
        decode_url + "/v1/completions",
        {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0},
    )
    assert status == 200, alone
    return str(alone["choices"][0]["text"])


def started(
    watch: Callable[[threading.Event], None], client: Callable[[], None], stop: threading.Event
) -> list[threading.Thread]:
    """A watcher's loop (until ``stop``) and a client's loop, each in a daemon thread."""
    threads = [
        threading.Thread(target=watch, args=(stop,), daemon=True),
        threading.Thread(target=client, daemon=True),
    ]
    for t in threads:
        t.start()
    return threads


def stopped(stop: threading.Event, client: Any, threads: list[threading.Thread]) -> None:
    """The loops ``started`` started, told to stop and joined (``client``: None when the
    test ended before it had one)."""
    stop.set()
    if client is not None:
        client.stop.set()
    for t in threads:
        t.join(timeout=30)


def stop_bed(router: Any, procs: Iterable[Any]) -> None:
    """A loopback bed's router (None: never started) and engine processes, stopped."""
    if router is not None:
        router.stop()
    for p in procs:
        p.stop()


def sse_text(raw: str, chat: bool) -> str:
    events = [ln[len("data: ") :] for ln in raw.splitlines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    out = ""
    for ev in events[:-1]:
        for ch in json.loads(ev)["choices"]:
            out += (ch["delta"].get("content") or "") if chat else ch["text"]
    return out


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[Any]:
    started: list[Engine] = []

    def start(
        args: list[str], env: dict[str, str] | None = None, name: str = "e", healthy: bool = True
    ) -> Engine:
        e = Engine(tmp_path, f"{name}{len(started)}", args, env or {})
        started.append(e)
        if healthy:
            e.wait_healthy()
        return e

    yield start
    for e in started:
        e.stop()


def engine_argv(kv: str, *args: str, model: str = "org/m") -> list[str]:
    """A stand-in's argv serving ``model`` as "m" with the KV transfer config ``kv``."""
    return [model, "--served-model-name", "m", "--kv-transfer-config", kv, *args]


def pd_pair(
    engines: Any,
    policy: str = "fail",
    decode_model: str = "org/m",
    extra: dict[str, Any] | None = None,
    decode_env: dict[str, str] | None = None,
) -> tuple[Engine, Engine]:
    p = engines(engine_argv(kv_config("kv_producer", **(extra or {}))), name="prefill")
    d = engines(
        engine_argv(kv_config("kv_consumer", policy), model=decode_model),
        decode_env,
        name="decode",
    )
    return p, d


PREFILL_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
REQ = {"model": "m", "prompt": "The quick brown fox jumps over the lazy dog " * 5, "max_tokens": 8}


def prefill(p: Engine, rid: str = "req-1") -> dict[str, Any]:
    status, body = post(
        p.url + "/v1/completions",
        {**REQ, "max_tokens": 1, "kv_transfer_params": PREFILL_PARAMS},
        {"X-Request-Id": rid},
    )
    assert status == 200, body
    assert len(body["choices"][0]["text"].split()) == 1
    params: dict[str, Any] = body["kv_transfer_params"]
    return params


def test_pd_flow_by_hand_pulls_blocks_over_the_side_channel(engines: Any) -> None:
    p, d = pd_pair(engines)
    params = prefill(p)
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert (params["remote_host"], params["remote_port"]) == ("127.0.0.1", p.side_port)
    blocks = params["remote_block_ids"]
    assert isinstance(blocks, list) and all(isinstance(g, list) for g in blocks)
    assert params["remote_num_tokens"] == 45 and params["tp_size"] == 1
    assert sum(len(g) for g in blocks) == 3  # 45 tokens in blocks of 16

    status, body = post(
        d.url + "/v1/completions", {**REQ, "kv_transfer_params": params}, {"X-Request-Id": "req-1"}
    )
    assert status == 200, body
    assert body["id"] == "cmpl-req-1"
    dm, pm = d.metrics(), p.metrics()
    assert dm["standin_kv_pulls_total"] == 1
    assert dm["standin_kv_blocks_pulled_total"] == 3
    assert dm["standin_kv_bytes_pulled_total"] > 0
    assert dm["standin_local_prefills_total"] == 0
    assert dm["vllm:nixl_xfer_time_seconds_count"] == 1  # the real vLLM names
    assert dm["vllm:nixl_bytes_transferred_sum"] == dm["standin_kv_bytes_pulled_total"]
    text = get(d.url + "/metrics")[1]
    # vLLM's accounting: every prompt token external, the last one recomputed locally
    assert 'source="external_kv_transfer"} 45.0' in text
    assert 'source="local_compute"} 1.0' in text
    assert pm["standin_remote_prefills_served_total"] == 1
    assert pm["standin_kv_blocks_served_total"] == 3
    assert pm["standin_kv_leases_held"] == 0  # released once read

    # The same text as a plain local run: the pull does not change what is generated.
    status, local = post(d.url + "/v1/completions", REQ)
    assert local["choices"][0]["text"] == body["choices"][0]["text"]
    assert d.metrics()["standin_local_prefills_total"] == 1

    # Blocks are gone once pulled: a replay of the params fails (policy fail -> 500).
    status, err = post(d.url + "/v1/completions", {**REQ, "kv_transfer_params": params})
    assert (status, err["error"]["message"]) == (500, "Internal server error")
    assert "NIXL transfer failure: no KV blocks held" in d.log


def test_decode_connects_to_the_advertised_address(engines: Any) -> None:
    # The side channel binds and advertises VLLM_NIXL_SIDE_CHANNEL_HOST, not localhost.
    p = engines(
        ["org/m", "--served-model-name", "m", "--kv-transfer-config", kv_config("kv_producer")],
        {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.2"},
    )
    d = engines(
        ["org/m", "--served-model-name", "m", "--kv-transfer-config", kv_config("kv_consumer")],
        {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.3"},
    )
    params = prefill(p)
    assert params["remote_host"] == "127.0.0.2"
    with pytest.raises(ConnectionRefusedError):  # bound to that address only
        socket.create_connection(("127.0.0.1", p.side_port), timeout=5).close()
    assert post(d.url + "/v1/completions", {**REQ, "kv_transfer_params": params})[0] == 200
    assert d.metrics()["standin_kv_pulls_total"] == 1


def test_fail_policy_when_advertised_side_channel_is_unreachable(engines: Any) -> None:
    p, d = pd_pair(engines)
    params = {**prefill(p), "remote_port": free_port()}  # nothing listens there
    status, err = post(
        d.url + "/v1/chat/completions",
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "kv_transfer_params": params,
        },
    )
    assert (status, err["error"]["message"]) == (500, "Internal server error")  # no cause
    m = d.metrics()
    assert (m["standin_kv_pull_failures_total"], m["standin_kv_pulls_total"]) == (1, 0)
    assert m["vllm:nixl_num_failed_transfers_total"] == 1
    assert "ERROR" in d.log and "Resource temporarily unavailable" in d.log
    assert "Connection refused" in d.log


def test_recompute_policy_recomputes_and_counts_it(engines: Any) -> None:
    p, d = pd_pair(engines, policy="recompute")
    params = {**prefill(p), "remote_engine_id": "some-other-engine"}
    status, body = post(d.url + "/v1/completions", {**REQ, "kv_transfer_params": params})
    assert status == 200, body
    m = d.metrics()
    assert m["standin_recomputed_prefills_total"] == 1
    assert m["standin_kv_pull_failures_total"] == m["vllm:nixl_num_failed_transfers_total"] == 1
    assert "RuntimeError: Remote NIXL agent engine ID mismatch" in d.log
    assert "Recovered from KV load failure" in d.log
    # the decode computed the whole prompt itself: vLLM's accounting says so
    assert 'source="local_compute"} 45.0' in get(d.url + "/metrics")[1]


def test_different_model_strings_fail_the_compatibility_check(engines: Any) -> None:
    p, d = pd_pair(engines, decode_model="org/m-other")
    status, err = post(d.url + "/v1/completions", {**REQ, "kv_transfer_params": prefill(p)})
    assert (status, err["error"]["message"]) == (500, "Internal server error")
    assert "RuntimeError: NIXL compatibility hash mismatch. Local: " in d.log


@pytest.mark.parametrize(
    ("prefill_args", "decode_args", "same"),
    [
        (["--kv-cache-dtype", "fp8"], [], False),
        (["--dtype", "float16"], ["--dtype", "bfloat16"], False),
        (["--attention-backend", "FLASHINFER"], [], False),
        (["--block-size", "32", "--tensor-parallel-size", "1"], [], True),  # checked later
    ],
)
def test_compat_hash_covers_what_vllm_hashes(
    engines: Any, prefill_args: list[str], decode_args: list[str], same: bool
) -> None:
    p = engines(engine_argv(kv_config("kv_producer"), *prefill_args), {})
    d = engines(engine_argv(kv_config("kv_consumer"), *decode_args), {})
    status, _ = post(d.url + "/v1/completions", {**REQ, "kv_transfer_params": prefill(p)})
    assert (status == 200) is same
    assert ("NIXL compatibility hash mismatch" in d.log) is not same


@pytest.mark.parametrize(
    ("prefill_version", "decode_version", "same"),
    [
        ("0.33.0", "0.33.0", True),
        ("0.33.0+nightly.1", "0.33.0", False),  # a nightly: same release, another string
        ("0.34.0", "0.33.0", False),  # and the connector version, 16 against 15
    ],
)
def test_the_version_string_enters_the_compat_hash_as_in_vllm(
    engines: Any, prefill_version: str, decode_version: str, same: bool
) -> None:
    """Issue 29: real vLLM hashes ``vllm.__version__`` (and NIXL_CONNECTOR_VERSION) into the
    handshake's compatibility hash, so two builds never pair; the stand-in, told its version
    by VLLM_STANDIN_VERSION, refuses the same pairs with the same text."""

    def one(role: str, version: str) -> Any:
        argv = ["org/m", "--served-model-name", "m", "--kv-transfer-config", kv_config(role)]
        return engines(argv, {"VLLM_STANDIN_VERSION": version})

    p, d = one("kv_producer", prefill_version), one("kv_consumer", decode_version)
    status, _ = post(d.url + "/v1/completions", {**REQ, "kv_transfer_params": prefill(p)})
    assert (status == 200) is same
    assert ("RuntimeError: NIXL compatibility hash mismatch. Local: " in d.log) is not same


def test_compat_check_can_be_disabled_as_vllm_says(engines: Any) -> None:
    off = {"kv_connector_extra_config": {"enforce_handshake_compat": False}}
    p = engines(engine_argv(kv_config("kv_producer"), "--kv-cache-dtype", "fp8"), {})
    d = engines(engine_argv(kv_config("kv_consumer", **off)), {})
    post(d.url + "/v1/completions", {**REQ, "kv_transfer_params": prefill(p)})
    assert "NIXL compatibility hash mismatch" not in d.log


def test_lease_expiry_releases_blocks(engines: Any) -> None:
    p, d = pd_pair(engines, extra={"kv_connector_extra_config": {"kv_lease_duration": 0.2}})
    params = prefill(p)
    p.wait_log("Releasing expired KV blocks")
    status, err = post(d.url + "/v1/completions", {**REQ, "kv_transfer_params": params})
    assert (status, err["error"]["message"]) == (500, "Internal server error")
    assert "NIXL transfer failure: no KV blocks held" in d.log
    assert "which were retrieved by 0 remote worker(s) before lease expired." in p.log
    pm = p.metrics()
    assert pm["standin_kv_leases_expired_total"] == pm["vllm:nixl_num_kv_expired_reqs_total"] == 1


def test_streaming_matches_non_streaming(engines: Any) -> None:
    e = engines(["org/m"])
    _, plain = post(e.url + "/v1/completions", {**REQ, "model": "org/m"})
    status, raw = post(e.url + "/v1/completions", {**REQ, "model": "org/m", "stream": True})
    assert status == 200
    assert sse_text(raw, chat=False) == plain["choices"][0]["text"]
    chat = {"model": "org/m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5}
    _, cplain = post(e.url + "/v1/chat/completions", chat)
    status, craw = post(
        e.url + "/v1/chat/completions",
        {**chat, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert sse_text(craw, chat=True) == cplain["choices"][0]["message"]["content"]
    assert '"completion_tokens": 5' in craw


def test_endpoints_and_api_key(engines: Any) -> None:
    e = engines(["org/m", "--api-key", "sekret", "--served-model-name", "a", "b"])
    assert get(e.url + "/health")[0] == 200  # /health needs no key
    assert get(e.url + "/v1/models")[0] == 401
    status, body = get(e.url + "/v1/models", {"Authorization": "Bearer sekret"})
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["a", "b"]
    assert json.loads(get(e.url + "/version")[1])["version"] == "0.33.0"
    assert post(e.url + "/v1/completions", {**REQ, "model": "a"})[0] == 401
    status, err = post(
        e.url + "/v1/completions", {**REQ, "model": "nope"}, {"Authorization": "Bearer sekret"}
    )
    assert status == 404 and "does not exist" in err["error"]["message"]
    assert "sekret" not in e.log


def run_once(
    args: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "STANDIN_LOAD_SECONDS": "0", **(env or {})}
    return subprocess.run(
        [sys.executable, str(STANDIN), "serve", *args, "--port", "0"],
        env=full,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )


@pytest.mark.parametrize(
    ("cfg", "rc", "needle"),
    [
        (
            '{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_rank":0}',
            2,
            "vllm serve: error: argument --kv-transfer-config: 1 validation error for KVTransferConfig"
            "\nkv_rank\n  Unexpected keyword argument",
        ),
        (
            '{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_ip":"10.0.0.1",'
            '"kv_buffer_size":1e9}',
            2,
            "2 validation errors for KVTransferConfig",
        ),
        ('{"kv_connector":"NixlConnector","kv_role":"producer"}', 2, "kv_role\n  Input should be"),
        (
            '{"kv_connector":"NixlConnector","kv_role":"kv_consumer","kv_buffer_device":"gpu"}',
            2,
            "kv_buffer_device",
        ),
        (
            '{"kv_connector":"NixlConnector","kv_role":"kv_consumer","kv_load_failure_policy":"retry"}',
            2,
            "kv_load_failure_policy",
        ),
        ('{"kv_connector":"NixlConnector","kv_role":', 2, "argument --kv-transfer-config"),
        (
            '{"kv_connector":"NoSuchConnector","kv_role":"kv_consumer"}',
            1,
            "Unsupported connector type",
        ),
    ],
)
def test_refuses_bad_kv_transfer_config(cfg: str, rc: int, needle: str) -> None:
    r = run_once(["org/m", "--kv-transfer-config", cfg])
    assert r.returncode == rc
    assert needle in r.stderr
    if rc == 1:
        assert "ValueError" in r.stderr


def test_unknown_flag_exits_2_like_argparse() -> None:
    r = run_once(["org/m", "--no-such-flag", "1"])
    assert r.returncode == 2 and "unrecognized arguments: --no-such-flag" in r.stderr


def test_tolerates_common_flags_and_logs_like_vllm(engines: Any) -> None:
    e = engines(
        [
            "--model",
            "org/m",
            "--max-model-len",
            "4096",
            "--gpu-memory-utilization",
            "0.85",
            "--dtype",
            "bfloat16",
            "--kv-cache-dtype",
            "fp8",
            "--block-size",
            "32",
            "--enforce-eager",
            "--tensor-parallel-size",
            "2",
            "--kv-transfer-config",
            kv_config("kv_consumer"),
        ]
    )
    log = e.log
    assert "vLLM API server version 0.33.0" in log
    assert "non-default args:" in log and "'max_model_len': 4096" in log
    assert f"Starting vLLM API server 0 on http://0.0.0.0:{e.port}" in log
    assert "Starting listening on path: tcp://127.0.0.1:" in log


def test_side_channel_host_it_cannot_bind_is_refused() -> None:
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: vLLM binds what it advertises.
    r = run_once(
        ["org/m", "--kv-transfer-config", kv_config("kv_producer")],
        {
            "VLLM_NIXL_SIDE_CHANNEL_HOST": "192.0.2.1",
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port()),
        },
    )
    assert r.returncode == 1
    assert "Cannot assign requested address (addr='tcp://192.0.2.1:" in r.stderr


@pytest.mark.parametrize(
    ("visible", "needle"),
    [
        ("0", "World size (2) is larger than the number of available GPUs (1)"),
        ("void", "No CUDA GPUs are available"),
    ],
)
def test_tensor_parallel_needs_the_gpus_docker_exposed(visible: str, needle: str) -> None:
    r = run_once(["org/m", "-tp", "2"], {"NVIDIA_VISIBLE_DEVICES": visible})
    assert r.returncode == 1 and needle in r.stderr


def test_tensor_parallel_fits_the_gpus_docker_exposed(engines: Any) -> None:
    e = engines(["org/m", "-tp", "2"], {"NVIDIA_VISIBLE_DEVICES": "0,1"})  # becomes healthy
    assert "tensor_parallel_size=2" in e.log


@pytest.mark.parametrize(
    ("kind", "needle"),
    [
        ("oom", "torch.OutOfMemoryError: CUDA out of memory"),
        ("gated", "401 Client Error"),
        ("cuda_driver", "CUDA driver version is insufficient for CUDA runtime version"),
    ],
)
def test_crash_at_start(kind: str, needle: str) -> None:
    r = run_once(["org/m"], {"STANDIN_CRASH_AT_START": kind})
    assert r.returncode == 1 and needle in r.stderr


def test_fail_message_overrides_the_signature() -> None:
    r = run_once(["org/m"], {"STANDIN_FAIL_MESSAGE": "ValueError: my own signature"})
    assert r.returncode == 1 and "ValueError: my own signature" in r.stderr


def test_never_healthy_refuses_connections_and_sigterm_exits_0(engines: Any) -> None:
    e = engines(["org/m"], {"STANDIN_NEVER_HEALTHY": "1"}, healthy=False)
    e.wait_log("Starting to load model org/m")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", e.port), timeout=5).close()
    assert e.stop() == 0


def test_die_after_requests(engines: Any) -> None:
    e = engines(["org/m"], {"STANDIN_DIE_AFTER_REQUESTS": "2"})
    assert post(e.url + "/v1/completions", {**REQ, "model": "org/m"})[0] == 200
    assert post(e.url + "/v1/completions", {**REQ, "model": "org/m"})[0] == 200
    assert e.proc.wait(timeout=DEADLINE) != 0
    assert "EngineDeadError" in e.log


# ---------------------------------------------------------------- through the real router
def test_real_vllm_router_drives_the_pd_flow(engines: Any, tmp_path: Path) -> None:
    p, d = pd_pair(engines)
    router = RouterProc(
        ["--vllm-pd-disaggregation", "--prefill", p.url, "--decode", d.url],
        tmp_path / "router.log",
    )
    url = router.url
    try:
        status, body = post(url + "/v1/completions", REQ)
        assert status == 200, body
        assert len(body["choices"][0]["text"].split()) == REQ["max_tokens"]
        chat = {
            "model": "m",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4,
            "stream": True,
        }
        status, raw = post(url + "/v1/chat/completions", chat)
        assert status == 200 and len(sse_text(raw, chat=True).split()) == 4
    finally:
        router.stop()
    dm, pm = d.metrics(), p.metrics()
    assert pm["standin_remote_prefills_served_total"] == 2
    assert dm["standin_kv_pulls_total"] == dm["vllm:nixl_xfer_time_seconds_count"] == 2
    assert dm["standin_local_prefills_total"] == 0
    assert dm["vllm:nixl_num_failed_transfers_total"] == 0
    assert dm["vllm:nixl_bytes_transferred_count"] == 2


FIXTURES = Path(__file__).resolve().parents[2] / "unit" / "fixtures" / "vllm"
SERVE_ARGS = json.loads(STANDIN.with_name("serve-args.json").read_text())["actions"]


def test_parser_accepts_exactly_the_options_of_vllm_serve() -> None:
    # the stand-in's copy is the shared fixture, and its parser is built from it
    shared = SHARED_VLLM / "serve-args.json"
    if shared.exists():
        assert json.loads(shared.read_text())["actions"] == SERVE_ARGS
    sys.path.insert(0, str(STANDIN.parent))
    try:
        import vllm_standin
    finally:
        sys.path.pop(0)
    p = vllm_standin.Parser(prog="vllm serve")
    vllm_standin.add_serve_args(p)
    mine = {o for a in p._actions for o in a.option_strings} - {"-h", "--help"}
    real = {o for a in SERVE_ARGS for o in a["option_strings"]} - {"-h", "--help"}
    assert mine == real and len(real) > 300


def test_unknown_option_is_refused_as_vllm_does() -> None:
    r = subprocess.run(
        [sys.executable, str(STANDIN), "serve", "org/m", "--kv-rank", "0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2
    assert "vllm: error: unrecognized arguments: --kv-rank 0" in r.stderr


def test_exports_only_real_vllm_names_besides_its_private_prefix(engines: Any) -> None:
    exposed = {
        n
        for m in json.loads((FIXTURES / "metrics.json").read_text())["metrics"]
        for n in m["exposed_as"]
    }
    p, d = pd_pair(engines)
    post(d.url + "/v1/completions", {**REQ, "kv_transfer_params": prefill(p)})
    names = set(d.metrics()) | set(p.metrics())
    foreign = {n for n in names if not n.startswith("standin_") and n not in exposed}
    assert not foreign


def test_load_prints_vllms_start_up_lines(engines: Any) -> None:
    e = engines(
        ["org/m", "--served-model-name", "m"],
        {"STANDIN_LOAD_SECONDS": "0.3", "STANDIN_LOAD_SHARDS": "3"},
    )
    e.wait_healthy()
    for text in (
        "Loading safetensors checkpoint shards:  66% Completed | 2/3",
        "Model loading took",
        "torch.compile took",
        "GPU KV cache size:",
        "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|",
        "Graph capturing finished in",
        "Starting vLLM API server 0 on",
    ):
        assert text in e.log, text


# ------------------------------------------------------------------ the release it plays


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_it_plays_the_release_it_is_told(version: str) -> None:
    env = {**os.environ, "VLLM_STANDIN_VERSION": version}
    r = subprocess.run(
        [sys.executable, str(STANDIN), "--version"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.stdout.strip() == version
    # an option only 0.34.0's real parser has (serve-args-0.34.0.json), beside one neither has
    r = subprocess.run(
        [
            sys.executable,
            str(STANDIN),
            "serve",
            "org/m",
            "--max-num-inflight-kv-loads",
            "4",
            "--kv-rank",
            "0",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2
    refused = r.stderr.strip().splitlines()[-1]
    if version == "0.34.0":
        assert refused == "vllm: error: unrecognized arguments: --kv-rank 0"
    else:
        assert refused == (
            "vllm: error: unrecognized arguments: --max-num-inflight-kv-loads 4 --kv-rank 0"
        )


def test_a_034_decode_declines_other_block_sizes_without_remote_num_tokens(engines: Any) -> None:
    env = {"VLLM_STANDIN_VERSION": "0.34.0"}
    p = engines(
        [
            "org/m",
            "--served-model-name",
            "m",
            "--block-size",
            "16",
            "--kv-transfer-config",
            kv_config("kv_producer"),
        ],
        env,
        name="prefill",
    )
    d = engines(
        [
            "org/m",
            "--served-model-name",
            "m",
            "--kv-transfer-config",
            kv_config("kv_consumer", "recompute"),
        ],
        env,
        name="decode",
    )  # 64: 0.34's
    params = prefill(p)
    assert params["remote_num_tokens"] > 0  # what a 0.34 prefill returns, as since 0.33
    status, _ = post(d.url + "/v1/completions", {**REQ, "kv_transfer_params": params})
    assert status == 200 and d.metrics()["standin_kv_pulls_total"] == 1  # forwarded: it pulls
    for rid in ("req-2", "req-3"):  # a router that drops it: declined, recomputed
        params = {k: v for k, v in prefill(p, rid).items() if k != "remote_num_tokens"}
        status, _ = post(d.url + "/v1/completions", {**REQ, "kv_transfer_params": params})
        assert status == 200
    m = d.metrics()
    assert m["standin_kv_pulls_total"] == 1 and m["standin_recomputed_prefills_total"] == 2
    assert m["vllm:nixl_num_failed_transfers_total"] == 0  # 0.34 does not count them
    declined = [ln for ln in d.log.splitlines() if "Declining remote reads from engine" in ln]
    assert len(declined) == 1 and "Make the proxy forward it." in declined[0]  # error_once
