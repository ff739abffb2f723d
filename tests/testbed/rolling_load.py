"""A day-two change under load, on a testbed (bench/rolling.py and tests/e2e/test_rolling.py):
a bounded client loop sends a short completion through the router every ~50 ms while
`pdboot up` applies a change, and counts what was served and what failed.

The deployment: 2 prefill hosts (p1, p2), 2 decode hosts (d1, d2) and a spare (d3), the router
on p1; stand-in engines that load in 0.5 s and take STANDIN_REQUEST_SECONDS per request (so a
request is in flight when an engine is taken out of service). The three changes of issue 19:
(a) a new image tag on every engine, (b) d3 added to the decode tier, (c) p2 removed from the
prefill tier. Router container id and start time are read before and after each change.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.cli import Cli
from tests.testbed.inventory import REAL_SERVED_NAME, TEST_MODEL, inventory_dict

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ["p1", "p2", "d1", "d2", "d3"]
NAME = "roll"
REQUEST_SECONDS = "0.3"  # each request holds its decode this long
EVERY = 0.05  # a new request every 50 ms
SECOND_TAG = "v0.33.0-rebuild"


@dataclass
class Counts:
    served: int = 0
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, ok: bool, why: str = "") -> None:
        with self.lock:
            if ok:
                self.served += 1
            else:
                self.failed += 1
                self.errors[why] = self.errors.get(why, 0) + 1


def _one(url: str, model: str, counts: Counts, key: str | None = None) -> None:
    body = json.dumps({"model": model, "prompt": "Say hello.", "max_tokens": 4}).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            doc = json.loads(r.read())
            text = doc["choices"][0].get("text", "")
            # a real tiny model's 4 tokens may decode to "" (a partial UTF-8 sequence is held
            # back): tokens generated are an answer; no text and no tokens are not
            tokens = (doc.get("usage") or {}).get("completion_tokens") or 0
            counts.add(bool(text) or tokens > 0, "" if text or tokens else "empty answer")
    except urllib.error.HTTPError as e:
        counts.add(False, f"HTTP {e.code}")
    except (OSError, ValueError, KeyError) as e:
        counts.add(False, type(e).__name__ if not str(e) else str(e)[:60])


class ClientLoop:
    """Requests at a fixed cadence (each in its own thread, so a slow one does not stall
    the cadence); stops when told or after ``limit`` seconds, whichever comes first."""

    def __init__(
        self,
        endpoint: str,
        model: str,
        limit: float = 600.0,
        key: str | None = None,
        every: float = EVERY,
    ) -> None:
        self.url = f"{endpoint}/v1/completions"
        self.model = model
        self.key = key
        self.limit = limit
        self.every = every
        self.counts = Counts()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._runner = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ClientLoop:
        self._runner.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._runner.join()
        for t in self._threads:
            t.join(timeout=35)

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set() and time.monotonic() - t0 < self.limit:
            t = threading.Thread(
                target=_one, args=(self.url, self.model, self.counts, self.key), daemon=True
            )
            t.start()
            self._threads.append(t)
            self._stop.wait(self.every)


def inventory(
    tb: Any,
    path: Path,
    *,
    tag: str | None = None,
    prefill: list[str] | None = None,
    decode: list[str] | None = None,
    decode_env: dict[str, str] | None = None,
    prefill_env: dict[str, str] | None = None,
    live: bool = True,
    api_key_env: str | None = None,
    decode_policy: str | None = None,
    real: bool = False,
) -> Path:
    """``real``: real vLLM CPU engines (tb.cpu_image; the testbed started with real_vllm)."""
    env = {"STANDIN_LOAD_SECONDS": "0.5", "STANDIN_REQUEST_SECONDS": REQUEST_SECONDS}
    base = tb.cpu_image if real else tb.image
    image = base if tag is None else base.rsplit(":", 1)[0] + f":{tag}"
    tiers: dict[str, Any] = (
        {}
        if real
        else {
            "prefill": {"env": {**env, **(prefill_env or {})}},
            "decode": {"env": {**env, **(decode_env or {})}},
        }
    )
    doc = inventory_dict(
        tb,
        name=NAME,
        prefill=prefill or ["p1", "p2"],
        decode=decode or ["d1", "d2"],
        router="p1",
        engine="vllm" if real else "standin",
        overrides={
            "image": image,
            "router": {"live_workers": live}
            | ({"decode_policy": decode_policy} if decode_policy else {}),
            **tiers,
            "timeouts": {"drain_seconds": 30, "poll_interval_seconds": 0.2},
        },
    )
    if api_key_env:
        doc["secrets"] = {"api_key": f"env:{api_key_env}"}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def push_second_tag(tb: Any) -> str:
    """The testbed engine image under a second tag in the registry (a "new release")."""
    host = tb.hosts["p1"]
    host.pull(tb.image)
    new = tb.image.rsplit(":", 1)[0] + f":{SECOND_TAG}"
    host.docker("tag", tb.image, new)
    host.docker("push", new, timeout=300)
    return SECOND_TAG


# the pdboot checkout `checkout_cli()` runs: this one, or a baseline's (bench/rolling.py
# --baseline)
CHECKOUT = {"root": ROOT}


def checkout_cli() -> Cli:
    """The pdboot command line of CHECKOUT's checkout, its own package first on the path."""
    root = CHECKOUT["root"]
    return Cli(root=root, timeout=600, env={"PYTHONPATH": str(root)})


def engine_logs(tb: Any, hosts: list[str]) -> str:
    """Every container of the deployment on ``hosts``: their logs (stderr), joined."""
    out = []
    for h in hosts:
        ids = (
            tb.hosts[h]
            .docker("ps", "-aq", "--filter", f"label=io.pdboot.deployment={NAME}")
            .stdout.split()
        )
        out += [tb.hosts[h].docker("logs", cid, timeout=60).stderr for cid in ids]
    return "\n".join(out)


def router_identity(tb: Any) -> tuple[str, str]:
    """(container id, State.StartedAt) of the deployment's router."""
    res = tb.hosts["p1"].docker(
        "ps",
        "-q",
        "--no-trunc",
        "--filter",
        f"label=io.pdboot.deployment={NAME}",
        "--filter",
        "label=io.pdboot.role=router",
    )
    cid = res.stdout.strip()
    if not cid:
        return "", ""
    started = tb.hosts["p1"].docker("inspect", "--format", "{{.State.StartedAt}}", cid)
    return cid, started.stdout.strip()


@dataclass
class Case:
    name: str
    mode: str
    rc: int
    seconds: float
    served: int
    failed: int
    errors: dict[str, int]
    router_kept: bool
    output: str


def change_under_load(
    tb: Any,
    name: str,
    mode: str,
    inv: Path,
    extra: list[str],
    key: str | None = None,
    env: dict[str, str] | None = None,
    real: bool = False,
) -> Case:
    """`pdboot up INV` (plus ``extra``, with ``env``) while the client loop runs; the loop
    starts 1 s before and stops 1 s after. ``key``: the clients' API key (secrets.api_key).
    ``real``: real vLLM engines (their model name, a request every 0.25 s: 2 cores)."""
    before = router_identity(tb)
    endpoint = f"http://{tb.hosts['p1'].address}:8000"
    model, every, limit = (REAL_SERVED_NAME, 0.25, 1800.0) if real else (TEST_MODEL, EVERY, 600.0)
    t0 = time.monotonic()
    with ClientLoop(endpoint, model, key=key, every=every, limit=limit) as loop:
        time.sleep(1.0)
        res = checkout_cli()("up", str(inv), "--no-speed", *extra, env=env, timeout=limit)
        time.sleep(1.0)
    took = time.monotonic() - t0
    c = loop.counts
    return Case(
        name,
        mode,
        res.returncode,
        took,
        c.served,
        c.failed,
        dict(c.errors),
        router_identity(tb) == before,
        res.stdout + res.stderr,
    )


def run_cases(tb: Any, work: Path, mode: str) -> list[Case]:
    """From a fresh 2P2D deployment: (a), (b), (c) in turn. ``mode``: "rolling" (the
    default), or "recreate" (the baseline: today's path before issue 19, the router's static
    lists, `router.live_workers: false`: every changed engine recreated at once and the router
    whenever its workers change), or "no-rolling" (the live router with `--no-rolling`: every
    changed engine at once, the router kept and its workers registered afterwards)."""
    live = mode != "recreate"
    extra = ["--no-rolling"] if mode == "no-rolling" else []
    path = work / f"inv-{mode}.yaml"
    inventory(tb, path, live=live)
    # the base deployment is setup, not what is measured: no preflight (its probes time
    # out on a loaded 2-core machine); each change runs `up` with preflight (issue 22)
    res = checkout_cli()("up", str(path), "--skip-preflight", "--no-speed")
    if res.returncode != 0:
        raise RuntimeError(f"base up failed:\n{res.stdout}\n{res.stderr}")
    tag = SECOND_TAG
    steps: list[tuple[str, dict[str, Any]]] = [
        ("a: new image tag, every engine", {"tag": tag}),
        ("b: decode host added", {"tag": tag, "decode": ["d1", "d2", "d3"]}),
        ("c: prefill host removed", {"tag": tag, "prefill": ["p1"], "decode": ["d1", "d2", "d3"]}),
    ]
    out = [
        change_under_load(tb, name, mode, inventory(tb, path, live=live, **change), extra)
        for name, change in steps
    ]
    down = checkout_cli()("down", str(path))
    if down.returncode != 0:
        raise RuntimeError(f"down failed:\n{down.stdout}\n{down.stderr}")
    return out


def run_build_case(tb: Any, work: Path, mode: str, checkout: Path, *, real: bool = False) -> Case:
    """Issue 29: from a fresh 2P2D deployment, the engine image moves to its nightly (the
    same release, another version string: NIXL refuses old/new pairs) under the client loop,
    with the pdboot of ``checkout`` (a baseline's, that rolls it; or this one, that goes
    blue/green). ``real``: real vLLM CPU engines (0.32.0 -> 0.32.0+nightly.1), else the
    stand-in (0.33.0 -> 0.33.0+nightly.1)."""
    from tests.testbed.images import NIGHTLY_TAG, STANDIN_NIGHTLY_TAG

    CHECKOUT["root"] = checkout
    try:
        path = work / f"inv-build-{mode}.yaml"
        inventory(tb, path, real=real)
        res = checkout_cli()("up", str(path), "--skip-preflight", "--no-speed", timeout=1800)
        if res.returncode != 0:
            raise RuntimeError(f"base up failed:\n{res.stdout}\n{res.stderr}")
        tag = NIGHTLY_TAG if real else STANDIN_NIGHTLY_TAG
        nightly = inventory(tb, work / f"inv-build-{mode}-nightly.yaml", tag=tag, real=real)
        name = f"d: new vLLM build ({'real' if real else 'stand-in'} nightly)"
        case = change_under_load(tb, name, mode, nightly, [], real=real)
        down = checkout_cli()("down", str(nightly))
        if down.returncode != 0:
            raise RuntimeError(f"down failed:\n{down.stdout}\n{down.stderr}")
        return case
    finally:
        CHECKOUT["root"] = ROOT


# bench/rolling.py's baseline for a router change: the router recreated, as before issue 28.
# `--no-rolling` takes the recreate path, which recreates a changed router in place (the
# engines are unchanged by a policy change, so they keep running): that outage, measured
# through pdboot's own options rather than a switch in product code.
RECREATE_ROUTER = ["--no-rolling"]


def router_policy_cases(tb: Any, work: Path, runs: int = 1) -> list[Case]:
    """A router change through `up` (the decode tier's policy, power_of_two <-> round_robin)
    on a fresh live 2P2D deployment: swapped (issue 28) and recreated (the baseline, forced
    by RECREATE_ROUTER: `--no-rolling`), alternately, ``runs`` times each, in one run on one testbed."""
    path = work / "inv-router.yaml"
    inventory(tb, path)
    res = checkout_cli()("up", str(path), "--skip-preflight", "--no-speed")
    if res.returncode != 0:
        raise RuntimeError(f"base up failed:\n{res.stdout}\n{res.stderr}")
    out: list[Case] = []
    policies = ["round_robin", "power_of_two"]
    for i in range(2 * runs):
        mode = "swap" if i % 2 == 0 else "recreate"
        policy = policies[i % 2]
        inventory(tb, path, decode_policy=policy)
        extra = ["--skip-preflight", *(RECREATE_ROUTER if mode == "recreate" else [])]
        name = f"router policy -> {policy}"
        out.append(change_under_load(tb, name, mode, path, extra))
    down = checkout_cli()("down", str(path))
    if down.returncode != 0:
        raise RuntimeError(f"down failed:\n{down.stdout}\n{down.stderr}")
    return out
