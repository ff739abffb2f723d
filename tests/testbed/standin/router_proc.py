"""The real vllm-router on loopback for the stand-in tests, on free ports.

free_port's ports are free when asked, not when the router binds: they come from the kernel's
ephemeral range, where any outgoing connection can take one meanwhile (seen once in CI). A
router that says "Address already in use" is stopped and started again on new ports.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import pytest

DEADLINE = 30.0  # generous bound for "it came up"; nothing asserts on durations
TRIES = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def router_binary() -> str:
    found = shutil.which("vllm-router")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("vllm-router is not installed (pip install vllm-router)")
        pytest.skip("vllm-router is not installed")
    return found


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=DEADLINE) as r:
            return int(r.status) == 200
    except (urllib.error.HTTPError, OSError):
        return False


class RouterProc:
    """vllm-router with ``args`` (its mode, workers, policies), listening on ``host``:``port``
    (a free one when None) with its metrics on a free port; up once ``ready`` answers 200."""

    def __init__(
        self,
        args: Sequence[str],
        log: Path,
        *,
        ready: str = "/health",
        host: str = "127.0.0.1",
        port: int | None = None,
    ) -> None:
        self.log = log
        for attempt in range(TRIES):
            self.port, self.metrics_port = port or free_port(), free_port()
            self.url = f"http://{host}:{self.port}"
            self.proc = self._spawn(args, host)
            try:
                if self._up(ready):
                    return
                if port is not None or attempt == TRIES - 1:
                    raise AssertionError(self.log.read_text())
            except BaseException:
                self.stop()
                raise

    def _spawn(self, args: Sequence[str], host: str) -> subprocess.Popen[bytes]:
        ports = ["--host", host, "--port", str(self.port)]
        ports += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port)]
        with self.log.open("wb") as out:
            return subprocess.Popen(
                [router_binary(), *args, *ports],
                stdout=out,
                stderr=subprocess.STDOUT,
                # its launcher's words on a failed start reach the log at once, not at exit
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def _up(self, ready: str) -> bool:
        """True once it answers; False (stopped) when a port was taken: it says so, and
        exits or not (its Prometheus thread can keep it alive)."""
        end = time.monotonic() + DEADLINE
        while True:
            if "Address already in use" in self.log.read_text():
                self.stop()
                return False
            assert self.proc.poll() is None, self.log.read_text()
            if _answers(self.url + ready):
                return True
            assert time.monotonic() < end, self.log.read_text()
            time.sleep(0.1)

    def stop(self) -> None:
        stop_process(self.proc)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after DEADLINE seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
