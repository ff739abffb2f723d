"""A P/D deployment on loopback for `pdboot watch`: stand-in engines (an emulation) on fixed
ports, so an engine can be restarted where the router knows it, and the real vllm-router in
runtime-registration mode (--enable-igw; workers posted after it starts, as `up` does)."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.testbed.standin.router_proc import RouterProc, stop_process
from tests.testbed.standin.test_standin import (
    DEADLINE,
    STANDIN,
    get,
    kv_config,
    post,
)

MODEL = "m"


def stable_port() -> int:
    """A free port below the kernel's ephemeral range (32768-60999 here): an engine restarted
    on its port must not find it taken by some process's outgoing connection meanwhile."""
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError("no free port in 20000-32000")


class Proc:
    """One stand-in engine on fixed ports; restart() brings it back on the same ones."""

    def __init__(
        self,
        tmp: Path,
        name: str,
        role: str,
        env: dict[str, str],
        host: str = "127.0.0.1",
        port: int | None = None,
        side_port: int | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        self.name, self.role, self.tmp, self.host = name, role, tmp, host
        self.args = args  # more `vllm serve` arguments
        self.port, self.side_port = port or stable_port(), side_port or stable_port()
        self.env = env
        self.url = f"http://{host}:{self.port}"
        self.starts = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.starts += 1
        log = self.tmp / f"{self.name}.{self.starts}.log"
        env = {
            **os.environ,
            "STANDIN_LOAD_SECONDS": "0",
            "VLLM_NIXL_SIDE_CHANNEL_HOST": self.host,
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(self.side_port),
            **self.env,
        }
        kv = "kv_producer" if self.role == "prefill" else "kv_consumer"
        argv = [
            sys.executable,
            str(STANDIN),
            "serve",
            "org/m",
            "--served-model-name",
            MODEL,
            "--kv-transfer-config",
            kv_config(kv),
            "--host",
            self.host,
            "--port",
            str(self.port),
            *self.args,
        ]
        with log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            self._wait_healthy(log)
        except BaseException:
            self.stop()  # never leave a half-started engine behind
            raise

    def _wait_healthy(self, log: Path) -> None:
        assert self.proc is not None
        end = time.monotonic() + DEADLINE
        while True:
            assert self.proc.poll() is None, log.read_text()
            try:
                if get(self.url + "/health")[0] == 200:
                    return
            except OSError:
                pass
            assert time.monotonic() < end, log.read_text()
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)

    def restart(self) -> None:
        self.stop()
        self.start()

    def faults(self, **faults: Any) -> dict[str, Any]:
        status, body = post(self.url + "/standin/faults", faults)
        assert status == 200, body
        return dict(body)


class Router(RouterProc):
    """The router in --enable-igw mode, its workers added and removed through its API."""

    def __init__(
        self, tmp: Path, prefill: str, decode: str, host: str = "127.0.0.1", port: int | None = None
    ) -> None:
        # --prefill / --decode: required by its argument check, ignored in --enable-igw mode
        args = ["--vllm-pd-disaggregation", "--enable-igw", "--prefill", prefill]
        args += ["--decode", decode, "--policy", "round_robin"]
        super().__init__(args, tmp / "router.log", ready="/workers", host=host, port=port)

    def add(self, url: str, kind: str) -> None:
        status, body = post(self.url + "/workers", {"url": url, "worker_type": kind})
        assert status == 200, body

    def listed(self) -> dict[str, str]:
        doc = json.loads(get(self.url + "/workers")[1])
        return {w["url"].rstrip("/"): w["worker_type"] for w in doc["workers"]}


def remove_url(router: Router, url: str) -> str:
    return f"{router.url}/workers/{urllib.parse.quote(url, safe='')}"


def switch_back_window(
    errors: list[tuple[float, str]], start: float, back: float
) -> list[tuple[float, str]]:
    """The failures degraded mode's switch back may cost (docs/watch.md): vllm-router routes a
    model P/D from its first P/D entry, so between the two registrations of the P/D step it
    answers 503 "No available workers". Only those, sent from the lost tier's start until
    P/D was seen again."""
    return [
        (t0, why)
        for t0, why in errors
        if start <= t0 <= back and why.startswith("HTTP 503") and "No available workers" in why
    ]


@dataclass
class ClientLoop:
    """A bounded client loop through the router: every answer compared with the stand-in's
    answer from a healthy decode alone (the stand-in is deterministic by prompt)."""

    url: str
    expected: str
    prompt: str
    results: list[tuple[float, str]] = field(default_factory=list)  # (start, ok|wrong|failed)
    errors: list[tuple[float, str]] = field(default_factory=list)  # (start, what went wrong)
    stop: threading.Event = field(default_factory=threading.Event)
    max_requests: int = 2000
    model: str = MODEL  # the served model name the router routes

    def run(self) -> None:
        body = {"model": self.model, "prompt": self.prompt, "max_tokens": 16, "temperature": 0}
        while not self.stop.is_set() and len(self.results) < self.max_requests:
            t0 = time.monotonic()
            try:
                status, doc = post(self.url + "/v1/completions", body)
                text = (
                    doc["choices"][0]["text"] if status == 200 and isinstance(doc, dict) else None
                )
                why = f"HTTP {status} {str(doc)[:300]}"
            except (OSError, KeyError, TypeError, ValueError) as e:
                text, why = None, f"{type(e).__name__}: {e}"
            verdict = "failed" if text is None else "ok" if text == self.expected else "wrong"
            if verdict != "ok":
                self.errors.append((t0, why if text is None else f"wrong: {text!r}"))
            self.results.append((t0, verdict))
            time.sleep(0.05)

    def after(self, t: float) -> dict[str, int]:
        out = {"ok": 0, "wrong": 0, "failed": 0}
        for t0, v in self.results:
            if t0 >= t:
                out[v] += 1
        return out
