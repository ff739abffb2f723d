"""The running router's worker API (vllm-router 0.1.17 started with `--enable-igw`): list,
add and remove prefill/decode workers without restarting it.

Tried with the real router against engines on loopback (vllm-pd-facts.md, last section):
`POST /workers {"url", "worker_type": "prefill"|"decode"}` answers 200 with the worker (the
router reads the model id from the engine first), posting a URL already registered answers
200 and keeps one entry, `DELETE /workers/<url, percent-encoded>` answers 200 or 400
`WORKER_NOT_FOUND`, `GET /workers` lists `{"workers": [{"url", "worker_type", "is_healthy",
...}]}`. `up` uses it to register engines once healthy and deregister them before they stop;
`reconcile` (pure) says what makes the router's list equal the inventory's.

Every registration names the served model (`model_id`): without it the router reads the id
from the engine's `GET /v1/models`, which it sends without a key, so with `secrets.api_key`
the engine answers 401, the worker lands under model "unknown", a request for the real name
finds no P/D worker and the router's default (regular) router sends it to any one engine:
200, but no KV moved (tried with 0.1.17 and key-checking stand-ins, issue 28).
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from pdboot.inventory.schema import TierName
from pdboot.plan.degraded import (
    PLAIN,
    RouteChange,
    ServingMode,
    engine_url,
    is_plain_url,
    plain_url,
    plain_urls,
    routed_workers,
    serving_mode,
    switch_steps,
)
from pdboot.plan.model import Plan, Service
from pdboot.transport.http import HttpFn


class RouterApiError(Exception):
    """The router refused or did not answer a worker change."""


@dataclass(frozen=True)
class Worker:
    """One entry of the router's GET /workers."""

    url: str  # without a trailing slash (a plain entry: with plan/degraded.py's suffix)
    worker_type: str  # prefill, decode, regular
    healthy: bool
    model_id: str = ""  # as the router filed it ("unknown" when it could not read it)


# one kind of worker change: the degraded switch (plan/degraded.py) plans them too
WorkerChange = RouteChange


_DP_RANK = re.compile(r"@\d+$")


def _error_code(body: str) -> str:
    """The router's machine-readable error code (``{"error": ..., "code":
    "WORKER_NOT_FOUND"}``); "" when the body is not that JSON. Its message is never read."""
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    code = data.get("code") if isinstance(data, dict) else None
    return code if isinstance(code, str) else ""


def parse_workers(text: str) -> list[Worker]:
    """GET /workers' body -> its workers (anything unexpected is skipped, never guessed)."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    items = data.get("workers", []) if isinstance(data, dict) else data
    out: list[Worker] = []
    for w in items if isinstance(items, list) else []:
        if isinstance(w, dict) and isinstance(w.get("url"), str):
            kind = str(w.get("worker_type", "regular")).lower()
            # a DP-aware router (--intra-node-data-parallel-size) lists each rank of an
            # engine as URL@rank: one engine, the URL pdboot registered; a plain entry of
            # degraded mode (plan/degraded.py) keeps its suffix: it is another entry
            raw = _DP_RANK.sub("", w["url"])
            url = plain_url(raw) if kind == PLAIN and is_plain_url(raw) else engine_url(raw)
            if all(x.url != url for x in out):
                model = w.get("model_id")
                out.append(
                    Worker(
                        url,
                        kind,
                        bool(w.get("is_healthy", True)),
                        model if isinstance(model, str) else "",
                    )
                )
    return out


def worker_of(svc: Service) -> tuple[str, TierName] | None:
    """The router worker an engine is (a DP tier registers its head only)."""
    if not svc.is_engine or svc.headless:
        return None
    kind: TierName = "prefill" if svc.role == "prefill" else "decode"
    return svc.url.rstrip("/"), kind


def wanted_workers(services: Iterable[Service]) -> dict[str, TierName]:
    """URL -> worker type, for the engines among ``services``."""
    out: dict[str, TierName] = {}
    for s in services:
        w = worker_of(s)
        if w is not None:
            out[w[0]] = w[1]
    return out


def plan_workers(plan: Plan) -> dict[str, TierName]:
    """What the inventory says the router serves: every engine of the plan."""
    return wanted_workers(plan.services())


def reconcile(
    wanted: Mapping[str, str], present: Sequence[Worker], model_id: str = ""
) -> list[WorkerChange]:
    """Removals first (a worker registered with the wrong type, or filed under another
    model than ``model_id`` when one is given, is removed and added again), then additions,
    each in URL order so the same lists give the same steps."""
    have = {w.url: w.worker_type for w in present}
    stale = {w.url for w in present if model_id and w.model_id and w.model_id != model_id}
    out = [
        WorkerChange("remove", url, kind)
        for url, kind in sorted(have.items())
        if wanted.get(url) != kind or url in stale
    ]
    out += [
        WorkerChange("add", url, kind)
        for url, kind in sorted(wanted.items())
        if have.get(url) != kind or url in stale
    ]
    return out


@dataclass(frozen=True)
class WorkerDiff:
    """The router's list against the plan (`status`): workers pdboot did not register, and
    engines of the plan the router does not list; ``error`` when the list could not be read.
    ``plain``: engines registered as plain workers (degraded mode: a tier is out, the other
    serves alone; plan/degraded.py), never foreign."""

    foreign: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    error: str = ""
    plain: tuple[str, ...] = ()


def worker_diff(plan: Plan, fetch: HttpFn, headers: Mapping[str, str] | None = None) -> WorkerDiff:
    """GET /workers through ``fetch`` (router_admin.py's: the router's loopback via its host)."""
    try:
        listed = {w.url for w in RouterWorkerApi(plan.router.url, fetch, headers).workers()}
    except RouterApiError as e:
        return WorkerDiff(error=str(e))
    wanted = set(plan_workers(plan))
    plain = listed & plain_urls(sorted(wanted))
    return WorkerDiff(
        tuple(sorted(listed - wanted - plain)),
        tuple(sorted(wanted - listed)),
        plain=tuple(sorted(engine_url(u) for u in plain)),
    )


class RouterWorkerApi:
    """The calls, over pdboot's one HTTP function (a test hands in its own). ``model_id``:
    the served model name every registration names (module docstring)."""

    def __init__(
        self,
        router_url: str,
        fetch: HttpFn,
        headers: Mapping[str, str] | None = None,
        timeout: float = 10.0,
        model_id: str = "",
    ) -> None:
        self.base = router_url.rstrip("/")
        self.fetch = fetch
        self.headers = dict(headers or {})
        self.timeout = timeout
        self.model_id = model_id

    def workers(self) -> list[Worker]:
        a = self.fetch(f"{self.base}/workers", timeout=self.timeout, headers=self.headers)
        if not a.ok:
            raise RouterApiError(f"GET /workers: {a.describe()} {a.body[:200]}".strip())
        return parse_workers(a.body)

    def add(self, url: str, worker_type: TierName | str) -> None:
        body: dict[str, str] = {"url": url, "worker_type": str(worker_type)}
        if self.model_id:
            body["model_id"] = self.model_id
        a = self.fetch(
            f"{self.base}/workers",
            body=body,
            timeout=self.timeout,
            headers=self.headers,
        )
        if not a.ok:
            raise RouterApiError(f"register {url}: {a.describe()} {a.body[:200]}".strip())

    def remove(self, url: str) -> bool:
        """True when it was registered; False when the router did not have it."""
        quoted = urllib.parse.quote(url, safe="")
        a = self.fetch(
            f"{self.base}/workers/{quoted}",
            method="DELETE",
            timeout=self.timeout,
            headers=self.headers,
        )
        if a.ok:
            return True
        if a.status in (400, 404) and _error_code(a.body).endswith("NOT_FOUND"):
            return False
        raise RouterApiError(f"deregister {url}: {a.describe()} {a.body[:200]}".strip())

    def apply(self, changes: Iterable[WorkerChange]) -> None:
        for c in changes:
            if c.action == "remove":
                self.remove(c.url)
            else:
                self.add(c.url, c.worker_type)

    def sync(self, wanted: Mapping[str, str]) -> list[WorkerChange]:
        """Make the router's workers equal ``wanted``; returns what was changed."""
        changes = reconcile(wanted, self.workers(), self.model_id)
        self.apply(changes)
        return changes


class WorkerCalls(Protocol):
    """What a switch needs of a router (RouterWorkerApi, or a test's fake)."""

    def add(self, url: str, worker_type: str) -> None: ...

    def remove(self, url: str) -> bool: ...


def switch_router(
    router: WorkerCalls,
    present: Mapping[str, str],
    in_rotation: Mapping[str, TierName],
    registrable: Callable[[str], bool] = lambda _url: True,
) -> tuple[list[RouteChange], ServingMode]:
    """The degraded switch carried out (plan/degraded.py decides): make a router whose
    entries for these engines are ``present`` (entry URL -> type) serve ``in_rotation``
    (engine URL -> tier): P/D, or one tier alone as plain workers. An engine not on the
    router that ``registrable`` refuses (its /health failing) counts as out of rotation until
    a later call, so the list reached always routes. Step by step, the calls of one step sent
    together (the router spends as little time as possible between two P/D entries). Returns
    the calls made and the mode served; raises the router's first error once a step ended.
    watch's loop calls it, and so can any second router (a standby ingress)."""
    listed = {engine_url(u) for u in present}
    usable = {u: t for u, t in in_rotation.items() if engine_url(u) in listed or registrable(u)}
    done: list[RouteChange] = []
    for step in switch_steps(present, routed_workers(usable)):
        _send_together(router, step)
        done += step
    return done, serving_mode(usable)


def _send_together(router: WorkerCalls, calls: Sequence[RouteChange]) -> None:
    def send(c: RouteChange) -> None:
        if c.action == "add":
            router.add(c.url, c.worker_type)
        else:
            router.remove(c.url)

    if len(calls) <= 1:
        for c in calls:
            send(c)
        return
    with ThreadPoolExecutor(len(calls)) as pool:
        for f in [pool.submit(send, c) for c in calls]:
            f.result()
