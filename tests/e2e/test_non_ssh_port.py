"""A host whose SSH port answers something else (issue 32, item 5): a real HTTP server on a
loopback port stands in for the host's sshd. Every verb fails cleanly, naming the port and
the fix; nothing prints paramiko's "Exception (client)" line or a traceback (paramiko logs
the failed handshake on its logger, which Python's last-resort handler printed to stderr).
No testbed needed: the traffic stays on loopback."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *_a: object) -> None:
        pass


@pytest.fixture(scope="module")
def http_port() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def inv(http_port: int, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("nonssh")
    (d / "known_hosts").write_text("")
    (d / "id").write_text("")
    data = {
        "name": "nonssh",
        "model": "Qwen/Qwen3-0.6B",
        "ssh": {
            "user": "root",
            "port": http_port,
            "identity_file": str(d / "id"),
            "known_hosts": str(d / "known_hosts"),
            "use_ssh_config": False,
            "connect_timeout": 5,
        },
        "hosts": {"box": {"address": "127.0.0.1"}},
        "prefill": {"hosts": ["box"], "gpus": [0]},
        "decode": {"hosts": ["box"], "gpus": [1]},
        "router": {"host": "box"},
    }
    path = d / "inv.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


VERBS = [
    ["preflight"],
    ["status"],
    ["status", "--json"],
    ["logs", "router"],
    ["down"],
    ["up", "--skip-preflight"],
]


@pytest.mark.parametrize("verb", VERBS, ids=[" ".join(v) for v in VERBS])
def test_a_port_answering_http_is_a_clean_failure(
    verb: list[str], inv: Path, http_port: int
) -> None:
    argv = [sys.executable, "-m", "pdboot", verb[0], str(inv), *verb[1:]]
    env = dict(os.environ, COLUMNS="250", TERM="dumb")
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "Traceback" not in out and "Exception (client)" not in out, out
    assert f"127.0.0.1 port {http_port} answers, but not with SSH" in out, out
    assert "sshd listens on that port" in out, out  # the fix
    if verb == ["status", "--json"]:  # the reason is in the document too (issue 32, item 6)
        doc = json.loads(res.stdout)
        assert all("answers, but not with SSH" in s["reason"] for s in doc["services"]), doc


def _local_inventory(tmp_path: Path) -> Path:
    data = {
        "name": "nodocker",
        "model": "Qwen/Qwen3-0.6B",
        "hosts": {"box": {"address": "local"}},
        "prefill": {"hosts": ["box"], "gpus": [0]},
        "decode": {"hosts": ["box"], "gpus": [1]},
        "router": {"host": "box"},
    }
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("verb", VERBS[1:5], ids=[" ".join(v) for v in VERBS[1:5]])
def test_docker_that_does_not_answer_is_named_with_its_fix(verb: list[str], tmp_path: Path) -> None:
    """Issue 32, item 6: the real docker SDK and CLI against a socket that is not there
    (a stopped dockerd): every verb says the cause and the fix; `status` carries it (also
    in --json); `down` says it plainly, then that the containers are left as they are."""
    inv = _local_inventory(tmp_path)
    argv = [sys.executable, "-m", "pdboot", verb[0], str(inv), *verb[1:]]
    sock = tmp_path / "docker.sock"  # never created
    env = dict(os.environ, COLUMNS="250", TERM="dumb", DOCKER_HOST=f"unix://{sock}")
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "Traceback" not in out and "FileNotFoundError" not in out, out
    assert "the Docker daemon is not running" in out, out
    assert "fix: start dockerd (systemctl start docker)" in out, out
    if verb == ["status", "--json"]:
        doc = json.loads(res.stdout)
        assert all("Docker daemon is not running" in s["reason"] for s in doc["services"]), doc
    if verb == ["down"]:
        assert "cannot reach (its containers" not in out, out
        assert "error: cannot reach box: cannot reach Docker:" in out, out
        assert "the containers on box are left as they are" in out, out
