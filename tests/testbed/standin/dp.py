"""EMULATION of vLLM 0.33's multi-node data parallelism for the stand-in (see ../../../docs/
data-parallel.md for the vLLM source behind each behaviour).

The head (`--data-parallel-size N --data-parallel-size-local L` without `--headless`) runs
ranks 0..L-1 itself, binds the RPC (handshake) port on `--data-parallel-address` when some ranks
are remote, and answers HTTP only once every rank, local and remote, reported READY (vLLM's
`wait_for_engine_startup` has no deadline on the head). A headless follower runs ranks
K..K+L-1, serves no HTTP, and connects each rank to the head's RPC port; a rank that gets no
answer within vLLM's HANDSHAKE_TIMEOUT_MINS (5 min; STANDIN_DP_HANDSHAKE_TIMEOUT_S shortens it)
fails with vLLM's text, and the follower then exits the way `run_headless` does (status 0).

Each rank has its own "engine": engine id `<id>_dp<rank>`, NIXL side channel on
VLLM_NIXL_SIDE_CHANNEL_PORT + rank on the host it runs on, its own counters (`engine="<rank>"`
in /metrics). The head sends each request to the rank with the fewest requests in flight (vLLM's
DP client picks the lowest waiting*4+running; ties here go round-robin), or to the rank an
`X-data-parallel-rank` header names (what vllm-router's DP-aware mode sends). A request for a
remote rank travels to its follower over the RPC connection, as raw HTTP, and is answered
there by the same handler, so a prefill's KV lease and a decode's pull happen on that rank's
host. Streams are relayed whole (not chunk by chunk): a stand-in simplification.

Wire format on the RPC port: JSON lines; HTTP payloads base64. Stdlib only.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import itertools
import json
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

HANDSHAKE_TIMEOUT_MINS = 5  # vllm/v1/engine/core.py
DEFAULT_RPC_PORT = 29550  # ParallelConfig.data_parallel_rpc_port
RANK_HEADER = "X-data-parallel-rank"


def add_args(p: argparse.ArgumentParser) -> None:
    """The data-parallel options of `vllm serve` 0.33 (serve-args.json), names and short forms."""
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--data-parallel-rank", "-dpn", type=int, default=None)
    p.add_argument("--data-parallel-start-rank", "-dpr", type=int, default=None)
    p.add_argument("--data-parallel-size-local", "-dpl", type=int, default=None)
    p.add_argument("--data-parallel-address", "-dpa", default=None)
    p.add_argument("--data-parallel-rpc-port", "-dpp", type=int, default=None)
    p.add_argument("--data-parallel-backend", "-dpb", default="mp")
    p.add_argument(
        "--data-parallel-hybrid-lb",
        "--no-data-parallel-hybrid-lb",
        "-dph",
        action=argparse.BooleanOptionalAction,
        default=False,
    )
    p.add_argument(
        "--data-parallel-external-lb",
        "--no-data-parallel-external-lb",
        "-dpe",
        action=argparse.BooleanOptionalAction,
        default=False,
    )
    p.add_argument("--data-parallel-multi-port-external-lb", "-dpm", action="store_true")
    p.add_argument("--data-parallel-supervisor-port", type=int, default=9256)
    p.add_argument(
        "--enable-expert-parallel",
        "-ep",
        "--disable-expert-parallel",
        action=argparse.BooleanOptionalAction,
        default=False,
    )
    p.add_argument("--headless", action="store_true")
    p.add_argument("--api-server-count", "-asc", type=int, default=None)


@dataclasses.dataclass
class Layout:
    size: int
    local: int
    start: int
    address: str
    rpc_port: int
    headless: bool

    @property
    def ranks(self) -> range:
        return range(self.start, self.start + self.local)

    @property
    def handshake(self) -> str:
        return f"tcp://{self.address}:{self.rpc_port}"


def layout(args: argparse.Namespace) -> Layout:
    size = args.data_parallel_size
    local = args.data_parallel_size_local
    if local is None:  # vLLM: all ranks local unless told otherwise
        local = size
    return Layout(
        size=size,
        local=local,
        start=args.data_parallel_start_rank or 0,
        address=args.data_parallel_address or "127.0.0.1",
        rpc_port=args.data_parallel_rpc_port or DEFAULT_RPC_PORT,
        headless=args.headless,
    )


BASE: dict[str, Any] = {}  # the engine id and side-channel port before any rank suffix


def rank_engine(eng: Any, rank: int, size: int) -> Any:
    """A copy of the stand-in Engine for one DP rank: its own id, side channel and state."""
    if size <= 1:
        return eng
    base = BASE.setdefault("engine", (eng.engine_id, eng.side_port))
    # vLLM 0.33 suffixes the global rank (core.py); older releases used the node-local rank.
    suffix = rank
    if os.environ.get("STANDIN_DP_ENGINE_ID_RANK", "global") == "local":
        suffix = rank - (eng.args.data_parallel_start_rank or 0)
    return dataclasses.replace(
        eng,
        engine_id=f"{base[0]}_dp{suffix}",
        side_port=base[1] + rank,
        leases={},
        counters={},
        lock=threading.Lock(),
        next_block=1,
        requests_done=0,
    )


def _send(sock_file: Any, lock: threading.Lock, obj: dict[str, Any]) -> None:
    with lock:
        sock_file.write(json.dumps(obj).encode() + b"\n")
        sock_file.flush()


def _die(proc: str, lines: list[str], code: int) -> None:
    pid = os.getpid()
    stamp = time.strftime("%m-%d %H:%M:%S")
    print("Traceback (most recent call last):", file=sys.stderr)
    for line in lines:
        print(line, file=sys.stderr)
    sys.stderr.flush()
    print(f"({proc} pid={pid}) INFO {stamp} [serve.py:262] Shutting down.", flush=True)
    os._exit(code)


# ---------------------------------------------------------------- the head
class Remote:
    """One remote rank as the head sees it: its connection and its advertised side channel."""

    def __init__(self, rank: int, f: Any) -> None:
        self.rank, self.f = rank, f
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.info: dict[str, Any] = {}
        self.waiting: dict[int, tuple[threading.Event, list[dict[str, Any]]]] = {}
        self.ids = itertools.count(1)

    def call(self, msg: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
        ev, box = threading.Event(), []  # type: ignore[var-annotated]
        mid = next(self.ids)
        self.waiting[mid] = (ev, box)
        _send(self.f, self.lock, {**msg, "id": mid})
        if not ev.wait(timeout) or not box:
            raise OSError(f"DP rank {self.rank} did not answer")
        return box[0]

    def reader(self) -> None:
        for raw in self.f:
            msg = json.loads(raw)
            if msg.get("status") == "READY":
                self.info = msg
                self.ready.set()
            elif msg.get("id") in self.waiting:
                ev, box = self.waiting.pop(msg["id"])
                box.append(msg)
                ev.set()
        for ev, _ in list(self.waiting.values()):
            ev.set()


class Head:
    def __init__(self, lay: Layout, log: Callable[..., None]) -> None:
        self.lay, self.log = lay, log
        self.local: dict[int, Any] = {}
        self.remote: dict[int, Remote] = {}
        self.inflight: dict[int, int] = {r: 0 for r in range(lay.size)}
        self.turn = itertools.count()
        self.lock = threading.Lock()
        self.srv: socket.socket | None = None

    def bind(self, die: Callable[[list[str]], None]) -> None:
        """vLLM binds the handshake socket on TCP only when some ranks are remote."""
        if self.lay.local >= self.lay.size:
            return
        try:
            infos = socket.getaddrinfo(self.lay.address, self.lay.rpc_port, type=socket.SOCK_STREAM)
            fam, *_, addr = sorted(infos, key=lambda i: i[0] != socket.AF_INET)[0]
            srv = socket.socket(fam, socket.SOCK_STREAM)
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            srv.bind(addr[:2])
            srv.listen(64)
        except OSError as e:
            reason = (
                "Cannot assign requested address"
                if isinstance(e, socket.gaierror) or e.errno == 99
                else (e.strerror or str(e))
            )
            die(["  ...", f"zmq.error.ZMQError: {reason} (addr='{self.lay.handshake}')"])
            return
        self.srv = srv
        threading.Thread(target=self.accept, args=(srv,), daemon=True).start()

    def accept(self, srv: socket.socket) -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:  # closed once every rank started, as vLLM's handshake socket
                return
            threading.Thread(target=self.greet, args=(conn,), daemon=True).start()

    def greet(self, conn: socket.socket) -> None:
        f = conn.makefile("rwb")
        try:
            hello = json.loads(f.readline() or b"{}")
        except ValueError:
            conn.close()
            return
        idx = hello.get("index")
        # vLLM's wait_for_engine_startup raises on these and the head goes down with it
        if hello.get("status") != "HELLO" or idx not in range(self.lay.local, self.lay.size):
            self.fail(f"Message from engine with unexpected data parallel rank: {idx}")
        if idx in self.remote:
            self.fail(
                f"Unexpected HELLO message for remote engine {idx} in "
                "CoreEngineState.CONNECTED state."
            )
        rem = Remote(int(idx), f)
        self.remote[rem.rank] = rem
        _send(
            f,
            rem.lock,
            {
                "status": "INIT",
                "parallel_config": {
                    "data_parallel_master_ip": self.lay.address,
                    "data_parallel_size": self.lay.size,
                },
            },
        )
        rem.reader()
        self.log("ERROR", "core_client.py:2", f"Lost connection to DP rank {rem.rank}")

    def fail(self, msg: str) -> None:
        self.log("ERROR", "utils.py:1037", f"RuntimeError: {msg}")
        _die("APIServer", ["  ...", f"RuntimeError: {msg}"], 1)

    def wait_ready(self) -> None:
        """Head side of vLLM's wait_for_engine_startup: no deadline, a line every 10 s."""
        remote = range(self.lay.local, self.lay.size)
        told: set[int] = set()
        last = time.monotonic()
        while True:
            ready = [r for r in remote if r in self.remote and self.remote[r].ready.is_set()]
            for r in sorted(set(ready) - told):
                info = self.remote[r].info
                told.add(r)
                self.log(
                    "INFO",
                    "utils.py:1010",
                    f"DP rank {r} ready: engine_id "
                    f"{info.get('engine_id')}, NIXL side channel "
                    f"{info.get('side_host')}:{info.get('side_port')}",
                )
            if len(ready) == len(remote):
                return
            if time.monotonic() - last >= 10:
                last = time.monotonic()
                unseen = len([r for r in remote if r not in self.remote])
                for n, what in ((unseen, "connect"), (len(remote) - len(ready) - unseen, "start")):
                    if n:
                        self.log(
                            "DEBUG",
                            "utils.py:1003",
                            f"Waiting for 0 local, {n} remote core engine proc(s) to {what}.",
                        )
            time.sleep(0.05)

    def pick(self, header: str | None) -> int:
        """The rank for a request, counted in flight at once (under the same lock: two
        requests picking together must not both see the same rank idle)."""
        with self.lock:
            if header is not None:
                rank = int(header)
            else:
                low = min(self.inflight.values())
                tied = [r for r, n in sorted(self.inflight.items()) if n == low]
                rank = tied[next(self.turn) % len(tied)]
            self.inflight[rank] += 1
            return rank


HEAD: Head | None = None


def start_head(
    eng: Any, args: argparse.Namespace, log: Callable[..., None], die: Callable[[list[str]], None]
) -> Any:
    """Called once the HTTP port is bound: rank `start`'s engine, the RPC port bound."""
    global HEAD
    lay = layout(args)
    if lay.size <= 1:
        return eng
    HEAD = Head(lay, log)
    log("INFO", "utils.py:871", f"Started DP Coordinator process (PID: {os.getpid()})")
    HEAD.bind(die)
    return rank_engine(eng, 0, lay.size)


def finish_head(eng: Any, bind_side: Callable[[Any], None]) -> None:
    """After rank 0 loaded: the other local ranks, then every remote rank READY."""
    if HEAD is None:
        return
    HEAD.local[0] = eng
    for r in range(1, HEAD.lay.local):
        other = rank_engine(eng, r, HEAD.lay.size)
        if eng.role is not None:
            bind_side(other)
            threading.Thread(target=other.sweep, daemon=True).start()
        HEAD.local[r] = other
    HEAD.wait_ready()
    if HEAD.srv is not None:  # launch_core_engines leaves its `with zmq_socket_ctx(...)`
        with contextlib.suppress(OSError):
            HEAD.srv.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not)
        HEAD.srv.close()


@contextlib.contextmanager
def routed(handler: Any) -> Iterator[bool]:
    """Send a completion to a rank. Local ranks: point the handler at that rank's engine and
    yield False (the handler goes on). Remote ranks: relay there and yield True."""
    if HEAD is None:
        yield False
        return
    header = handler.headers.get(RANK_HEADER)
    if header is not None and (not header.isdigit() or int(header) >= HEAD.lay.size):
        header = None  # not a rank of this engine: balanced like any other request
    rank = HEAD.pick(header)
    if header is not None:  # a stand-in line: lets a test see who chose the rank
        HEAD.log(
            "DEBUG",
            "standin.py:2",
            f"STAND-IN request for DP rank {rank} ({RANK_HEADER}: {header})",
        )
    try:
        if rank in HEAD.local:
            handler.engine = HEAD.local[rank]
            yield False
        else:
            relay(handler, HEAD.remote[rank])
            yield True
    finally:
        with HEAD.lock:
            HEAD.inflight[rank] -= 1


def relay(handler: Any, rem: Remote) -> None:
    body = json.dumps(handler.read_body()).encode()
    skip = {"content-length", "transfer-encoding", "connection"}
    head = f"{handler.command} {handler.path} HTTP/1.1\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in handler.headers.items() if k.lower() not in skip
    )
    raw = (head + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    try:
        ans = rem.call({"type": "http", "raw": base64.b64encode(raw).decode()})
        handler.wfile.write(base64.b64decode(ans["raw"]))
    except (OSError, KeyError) as e:
        msg = json.dumps(
            {
                "error": {
                    "message": f"EngineCore DP rank {rem.rank}: {e}",
                    "type": "InternalServerError",
                    "param": None,
                    "code": 500,
                }
            }
        ).encode()
        handler.wfile.write(
            b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: "
            b"application/json\r\ncontent-length: " + str(len(msg)).encode() + b"\r\n\r\n" + msg
        )
    handler.wfile.flush()


def metrics(eng: Any, render: Callable[[Any], str]) -> str:
    """/metrics with one series per rank (engine="<rank>"), remote ranks' asked over RPC."""
    if HEAD is None:
        return render(eng)
    texts = [relabel(render(e), r) for r, e in sorted(HEAD.local.items())]
    for r, rem in sorted(HEAD.remote.items()):
        try:
            texts.append(relabel(str(rem.call({"type": "metrics"}, 10)["text"]), r))
        except (OSError, KeyError):
            continue
    return merge(texts)


def relabel(text: str, rank: int) -> str:
    return re.sub(r'engine="\d+"', f'engine="{rank}"', text)


def merge(texts: list[str]) -> str:
    """Prometheus text of several ranks as one exposition: each family's HELP/TYPE once."""
    families: dict[str, list[str]] = {}
    current = ""
    for text in texts:
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                current = line.split()[2]
                fam = families.setdefault(current, [])
                if line not in fam:
                    fam.append(line)
            elif line:
                fam = families.setdefault(current, [])
                if line not in fam:
                    fam.append(line)
    return "\n".join(line for fam in families.values() for line in fam) + "\n"


# ---------------------------------------------------------------- a headless follower
def run_headless(
    eng: Any,
    args: argparse.Namespace,
    api: type,
    bind_side: Callable[[Any], None],
    render: Callable[[Any], str],
    log: Callable[..., None],
) -> None:
    lay = layout(args)
    log(
        "INFO",
        "serve.py:241",
        f"Launching {lay.local} data parallel engine(s) in headless "
        f"mode, with head node address {lay.handshake}.",
        proc="APIServer",
    )
    for rank in lay.ranks:
        threading.Thread(
            target=follower_rank,
            daemon=True,
            args=(rank_engine(eng, rank, lay.size), rank, lay, api, bind_side, render),
        ).start()
    while True:  # join_first: the engine threads end the process
        time.sleep(3600)


def connect(lay: Layout, deadline: float) -> socket.socket | None:
    """ZMQ connects lazily and retries forever: an absent head is only noticed by the wait."""
    while time.monotonic() < deadline:
        try:
            return socket.create_connection((lay.address, lay.rpc_port), timeout=2)
        except OSError:
            time.sleep(0.2)
    return None


def follower_rank(
    eng: Any,
    rank: int,
    lay: Layout,
    api: type,
    bind_side: Callable[[Any], None],
    render: Callable[[Any], str],
) -> None:
    proc = f"EngineCore_DP{rank}"
    wait_s = float(os.environ.get("STANDIN_DP_HANDSHAKE_TIMEOUT_S", HANDSHAKE_TIMEOUT_MINS * 60))
    deadline = time.monotonic() + wait_s
    sock = connect(lay, deadline)
    init: dict[str, Any] = {}
    if sock is not None:
        f = sock.makefile("rwb")
        lock = threading.Lock()
        _send(f, lock, {"status": "HELLO", "local": False, "headless": True, "index": rank})
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            init = json.loads(f.readline() or b"{}")
        except (OSError, ValueError):
            init = {}
    if init.get("status") != "INIT":
        stamp = time.strftime("%m-%d %H:%M:%S")
        print(
            f"({proc} pid={os.getpid()}) ERROR {stamp} [core.py:1087] EngineCore failed to start.",
            flush=True,
        )
        _die(
            proc,
            [
                '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", '
                "line 1072, in run_engine_core",
                "    ...",
                "RuntimeError: Did not receive response from front-end process within "
                f"{HANDSHAKE_TIMEOUT_MINS} minutes",
            ],
            0,
        )
    assert sock is not None
    sock.settimeout(None)
    time.sleep(float(os.environ.get("STANDIN_LOAD_SECONDS", "1")))
    if eng.role is not None:
        bind_side(eng)
        threading.Thread(target=eng.sweep, daemon=True).start()
    _send(
        f,
        lock,
        {
            "status": "READY",
            "local": False,
            "index": rank,
            "engine_id": eng.engine_id,
            "side_host": eng.side_host,
            "side_port": eng.side_port,
        },
    )
    handler = type(f"Rank{rank}Api", (api,), {"engine": eng})
    for raw in f:
        msg = json.loads(raw)
        threading.Thread(
            target=serve_one, daemon=True, args=(msg, f, lock, handler, eng, render)
        ).start()
    _die(proc, ["  ...", "RuntimeError: lost the connection to the head node (front-end)"], 0)


def serve_one(
    msg: dict[str, Any],
    f: Any,
    lock: threading.Lock,
    handler: type,
    eng: Any,
    render: Callable[[Any], str],
) -> None:
    if msg.get("type") == "metrics":
        _send(f, lock, {"id": msg["id"], "text": render(eng)})
        return
    ours, theirs = socket.socketpair()

    def answer() -> None:  # one request, as the head's HTTP server would have served it
        try:
            handler(theirs, ("head", 0), None)
        finally:
            theirs.close()

    threading.Thread(target=answer, daemon=True).start()
    ours.sendall(base64.b64decode(msg["raw"]))
    chunks = []
    while True:
        data = ours.recv(65536)
        if not data:
            break
        chunks.append(data)
    ours.close()
    _send(f, lock, {"id": msg["id"], "raw": base64.b64encode(b"".join(chunks)).decode()})
