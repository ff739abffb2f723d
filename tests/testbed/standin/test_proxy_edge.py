"""The edge as deployed, on loopback: pdboot's rendered proxy files (plan/proxy.py
`proxy_files`, with an API key) run by the real nginx, in front of the real vllm-router 0.1.17
in runtime-registration mode (--enable-igw, its workers posted as `up` does) over a stand-in
P/D pair that requires the key. Only the listen address, the upstream port and the file
paths are moved (tests/testbed/nginx_local.py). Loopback rather than the testbed's images:
the same nginx directives, a start in a second instead of a deployment.

A logging relay sits between nginx and the router, so the test sees every request line the
router received; the stand-ins' access logs say what reached an engine. A corpus of encoded,
dot-segment, absolute-form and method variants, with no key, the right key and the key in
the wrong case, is replayed; the test asserts each answer against the rule docs/security.md
states, that the router received exactly the allowed requests (each as its fixed path) and
that no engine saw a path outside the client API."""

from __future__ import annotations

import http.client
import http.server
import itertools
import json
import re
import secrets
import socket
import ssl
import string
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from pdboot.plan.proxy import CLIENT_METHODS, MAX_API_KEY_CHARS, OPEN_METHODS, proxy_files
from tests.testbed.nginx_local import NginxProc, localize
from tests.testbed.standin.router_proc import RouterProc, free_port
from tests.testbed.standin.test_standin import engines, get, kv_config, post
from tests.unit.builders import inventory
from tests.unit.plan.test_proxy import pem_pair

__all__ = ["engines"]

KEY = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(64)) + "aB"
SERVED = {**OPEN_METHODS, **CLIENT_METHODS}
METHODS = ("GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS")
COMPLETION = {"model": "m", "prompt": "hello there", "max_tokens": 2}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

# Request targets sent byte for byte. Canonical ones (the client API, the admin API, others)
# and spellings that normalize to a served or an admin path.
CANONICAL = [
    "/health",
    "/v1/models",
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/completions?stream=false",
    "/workers",
    "/add_worker?url=http://127.0.0.1:9",
    "/list_workers",
    "/metrics",
    "/v1/embeddings",
]
NOT_CANONICAL = [
    "/x%2F..%2Fhealth",
    "/x%2f..%2fv1%2fcompletions",
    "/workers/x%2F..%2F..%2Fhealth",
    "/workers/http%3A%2F%2F127.0.0.1%3A9",
    "/v1%2Fcompletions",
    "/v1/%2e%2e/workers",
    "/%2E%2E/v1/models",
    "/%68ealth",
    "/v1/completions/..%2F..%2Fworkers",
    "/a/../health",
    "/v1/./completions",
    "/v1/chat/completions/.",
    "/v1/models/..",
    "/workers/../v1/models",
    "//v1/completions",
    "/v1//chat/completions",
    "/v1\\completions",
    "/health#x",
    "http://127.0.0.1/health",
    "http://evil.example/v1/completions",
    "HTTP://x/workers",
    "*",
]


def expected(method: str, target: str, auth: str | None) -> tuple[int, bool]:
    """(status, forwarded) by the rule docs/security.md states: target (400), path (404),
    method (405), key (401), else the router's answer."""
    if target not in CANONICAL:
        return 400, False
    path = target.split("?")[0]
    if path not in SERVED:
        return 404, False
    if method != SERVED[path]:
        return 405, False
    if path in CLIENT_METHODS and auth != f"Bearer {KEY}":
        return 401, False
    return 200, True


class Relay:
    """TCP from nginx to the router, recording each request's line and Authorization."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.seen: list[tuple[str, str, str | None]] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.sock.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._requests, args=(down, up), daemon=True).start()
            threading.Thread(target=_pipe, args=(up, down), daemon=True).start()

    def _requests(self, down: socket.socket, up: socket.socket) -> None:
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                chunk = down.recv(65536)
                if not chunk:
                    up.close()
                    return
                buf += chunk
            head, buf = buf.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ")
            fields = dict(ln.split(": ", 1) for ln in lines[1:])
            lower = {k.lower(): v for k, v in fields.items()}
            assert "chunked" not in lower.get("transfer-encoding", ""), lines
            need = int(lower.get("content-length", "0"))
            while len(buf) < need:
                buf += down.recv(65536)
            body, buf = buf[:need], buf[need:]
            self.seen.append((method, target, lower.get("authorization")))
            up.sendall(head + b"\r\n\r\n" + body)

    def close(self) -> None:
        self.sock.close()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    dst.close()


def send(port: int, method: str, target: str, auth: str | None) -> int:
    """One request with the target exactly as given; its status."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = None
    if method in ("POST", "PUT", "PATCH"):
        body = json.dumps(CHAT if "chat" in target else COMPLETION)
    headers = {"Content-Type": "application/json", **({"Authorization": auth} if auth else {})}
    try:
        conn.request(method, target, body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        return int(resp.status)
    finally:
        conn.close()


@pytest.fixture
def edge(engines: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """nginx -> relay -> router -> stand-in prefill + decode, all requiring KEY."""

    def engine(role: str) -> Any:
        args = ["org/m", "--served-model-name", "m", "--api-key", KEY]
        return engines([*args, "--kv-transfer-config", kv_config(role)], name=role)

    p, d = engine("kv_producer"), engine("kv_consumer")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # the router's key to the engines, as up gives
    args = ["--vllm-pd-disaggregation", "--enable-igw", "--prefill", p.url, "--decode", d.url]
    router = RouterProc(
        [*args, "--policy", "round_robin"], tmp_path / "router.log", ready="/workers"
    )
    relay = Relay(router.port)
    nginx = None
    try:
        for url, kind in ((p.url, "prefill"), (d.url, "decode")):
            body = {"url": url, "worker_type": kind, "model_id": "m"}
            status, text = post(router.url + "/workers", body)
            assert status == 200, text
        port = free_port()
        hosts = {"a": "192.0.2.10", "b": "192.0.2.11"}
        over = {"secrets.api_key": "env:K", "router.port": port, "router.internal_port": relay.port}
        inv = inventory(hosts, ["a"], ["b"], "a", overrides=over)
        nginx = NginxProc(localize(proxy_files(inv, KEY), tmp_path / "edge"), port)
        yield port, relay, router, (p, d)
    finally:
        if nginx is not None:
            nginx.stop()
        relay.close()
        router.stop()


def _workers(router: RouterProc) -> list[str]:
    return sorted(w["url"] for w in json.loads(get(router.url + "/workers")[1])["workers"])


def test_the_edge_forwards_only_the_client_api_each_as_its_fixed_path(edge: Any) -> None:
    port, relay, router, pair = edge
    before = _workers(router)
    auths = (None, f"Bearer {KEY}", f"Bearer {KEY.swapcase()}", f"bearer {KEY}")
    corpus = list(itertools.product(METHODS, CANONICAL + NOT_CANONICAL, auths))
    assert len(corpus) >= 120
    wanted: list[tuple[str, str, str | None]] = []
    wrong = []
    for method, target, auth in corpus:
        status, forwarded = expected(method, target, auth)
        got = send(port, method, target, auth)
        if got != status:
            wrong.append((method, target, (auth or "")[:8], got, status))
        if forwarded:
            wanted.append((method, target, auth))
    assert wrong == [], wrong
    # the router received exactly the allowed requests, each as its fixed path
    assert sorted(relay.seen, key=str) == sorted(wanted, key=str)
    assert len(wanted) == 8  # /health with each auth, the four client targets with the key
    for method, target, _ in relay.seen:
        assert SERVED[target.split("?")[0]] == method
    # ... and nothing reached the worker API or an engine outside the client API
    assert _workers(router) == before
    for engine in pair:
        paths = re.findall(r'"[A-Z]+ (\S+) HTTP/1\.1"', engine.log)
        assert paths and all(
            p.split("?")[0] in ("/health", "/v1/models", "/v1/completions", "/v1/chat/completions")
            for p in paths
        ), paths
        assert not any("%" in p or ".." in p or "workers" in p for p in paths), paths


@pytest.mark.parametrize("length", [16, 64, 128, MAX_API_KEY_CHARS])
def test_nginx_starts_with_a_key_of(length: int, tmp_path: Path) -> None:
    """The key of any length pdboot serves: nginx starts, the key lets a request through
    (to an upstream that is down: 502, so it was forwarded), the key in another case or one
    character short does not (401)."""
    key = "".join(secrets.choice(string.ascii_letters) for _ in range(length - 1)) + "k"
    port, closed = free_port(), free_port()
    over = {"secrets.api_key": "env:K", "router.port": port, "router.internal_port": closed}
    inv = inventory({"a": "192.0.2.10", "b": "192.0.2.11"}, ["a"], ["b"], "a", overrides=over)
    nginx = NginxProc(localize(proxy_files(inv, key), tmp_path), port)
    try:
        assert send(port, "GET", "/v1/models", f"Bearer {key}") == 502
        for other in (key.upper(), key[:-1], key + "k"):
            assert send(port, "GET", "/v1/models", f"Bearer {other}") == 401
    finally:
        nginx.stop()


def _handshake(port: int, version: ssl.TLSVersion, ciphers: str | None) -> ssl.SSLSocket:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # a self-signed pair
    ctx.minimum_version = ctx.maximum_version = version
    if ciphers:
        ctx.set_ciphers(ciphers)
    raw = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        return ctx.wrap_socket(raw)
    except BaseException:
        raw.close()
        raise


def test_tls_takes_only_forward_secret_aead_suites_and_issues_no_tickets(tmp_path: Path) -> None:
    """Mozilla's intermediate profile, by handshakes against the rendered TLS conf."""
    cert, key, _ = pem_pair(days=400)  # an ECDSA certificate: the ECDSA suites apply
    port = free_port()
    tls_refs = {"cert": "file:/c.pem", "key": "env:TLS_KEY"}
    over = {"router.port": port, "router.tls": tls_refs}
    inv = inventory({"a": "192.0.2.10", "b": "192.0.2.11"}, ["a"], ["b"], "a", overrides=over)
    nginx = NginxProc(localize(proxy_files(inv, None, (cert, key)), tmp_path), port)
    try:
        v12, v13 = ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3
        for refused in ("AES128-SHA", "AES128-GCM-SHA256", "ECDHE-ECDSA-AES128-SHA"):
            with pytest.raises(ssl.SSLError):
                _handshake(port, v12, refused).close()
        with _handshake(port, v12, "ECDHE-ECDSA-AES128-GCM-SHA256") as s:
            assert s.cipher()[0] == "ECDHE-ECDSA-AES128-GCM-SHA256"
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert s.recv(64).startswith(b"HTTP/1.1 502")  # served, no router behind it
            assert s.session is not None and not s.session.has_ticket
        with _handshake(port, v13, None) as s:
            assert s.version() == "TLSv1.3"
    finally:
        nginx.stop()


class _Upstream(http.server.ThreadingHTTPServer):
    """A stand-in for the router that holds each completion until ``release`` is set."""

    daemon_threads = True
    # socketserver's listen backlog is 5, and the burst below opens up to 256 connections
    # at once: in a loaded CI run 8 or more of its 512 requests got nginx's 502, most likely
    # at this full accept queue (a router's listener holds far more; the stand-in engine
    # sets 128 for the same reason)
    request_queue_size = 1024

    def __init__(self) -> None:
        self.release = threading.Event()
        self.release.set()
        self.held = threading.Semaphore(0)

        release, held = self.release, self.held

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.startswith("/v1/completions"):
                    held.release()
                    release.wait(30)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _answer

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def _edge_over(upstream: _Upstream, tmp: Path, limits: dict[str, int]) -> tuple[int, NginxProc]:
    port = free_port()
    over = {
        "router.port": port,
        "router.internal_port": upstream.server_address[1],
        "router.proxy_limits": limits,
    }
    inv = inventory({"a": "192.0.2.10", "b": "192.0.2.11"}, ["a"], ["b"], "a", overrides=over)
    return port, NginxProc(localize(proxy_files(inv, None), tmp), port)


def test_a_client_over_its_connections_gets_429_and_the_defaults_hold_a_full_burst(
    tmp_path: Path,
) -> None:
    upstream = _Upstream()
    port, nginx = _edge_over(upstream, tmp_path / "one", {"connections_per_client": 2})
    try:
        upstream.release.clear()
        first = [threading.Thread(target=send, args=(port, "POST", "/v1/completions", None))]
        first.append(threading.Thread(target=send, args=(port, "POST", "/v1/completions", None)))
        for t in first:
            t.start()
        for _ in first:
            assert upstream.held.acquire(timeout=30)  # both in flight at the router
        assert send(port, "POST", "/v1/completions", None) == 429
        assert send(port, "GET", "/health", None) == 429  # a connection is a connection
        upstream.release.set()
        for t in first:
            t.join(30)
        assert send(port, "POST", "/v1/completions", None) == 200
    finally:
        nginx.stop()
    # the defaults: 256 requests at once from one address, none refused
    port, nginx = _edge_over(upstream, tmp_path / "defaults", {})
    try:
        with ThreadPoolExecutor(max_workers=256) as pool:
            codes = list(
                pool.map(lambda _: send(port, "POST", "/v1/completions", None), range(512))
            )
        assert codes == [200] * 512, sorted(set(codes))
    finally:
        nginx.stop()
        upstream.shutdown()


def test_a_client_over_its_rate_gets_429_and_a_trickled_header_is_closed(tmp_path: Path) -> None:
    upstream = _Upstream()
    limits = {
        "requests_per_second_per_client": 1,
        "request_burst_per_client": 0,
        "header_timeout_secs": 1,
    }
    port, nginx = _edge_over(upstream, tmp_path, limits)
    try:
        # 20 at once against 1 per second and no burst: the first in, most of the rest 429
        with ThreadPoolExecutor(max_workers=20) as pool:
            codes = list(pool.map(lambda _: send(port, "GET", "/health", None), range(20)))
        assert 200 in codes and codes.count(429) >= 10, codes
        # a header sent a byte at a time: closed by the proxy long before it is complete
        # (header_timeout_secs counts the whole header, not the gaps between bytes)
        head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 200 + b"\r\n\r\n"
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            sent = 0
            try:
                for byte in head:
                    s.sendall(bytes([byte]))
                    sent += 1
                    time.sleep(0.1)
            except OSError:
                pass  # the proxy closed it while we were still sending
            assert sent < len(head), "the whole trickled header was accepted"
    finally:
        nginx.stop()
        upstream.shutdown()
