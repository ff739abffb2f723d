"""Drain: an engine taken out of the router is stopped only once its in-flight work ends.

An engine is idle when vLLM's own gauges on its /metrics, `vllm:num_requests_running` and
`vllm:num_requests_waiting` (names from vLLM 0.33.0's loggers.py,
`../shared/fixtures/vllm-0.33.0/metrics.json`), read 0 on every rank. A prefill also holds
KV blocks that decodes still pull after its own request ended (NIXL keeps them under a
lease, `kv_lease_duration`, 30 s by default): it is kept until no decode has a KV load
waiting or in progress (`vllm:num_requests_kv_fetch_by_stage`, stages `waiting_to_start` and
`in_progress`). Idle must hold on two reads in a row: the router hands a request's decode
stage over right after its prefill answer, and one read could fall in between. An engine
that no longer answers has nothing in flight. The wait is bounded by the inventory's
`timeouts.drain_seconds`; the leases that expired unread meanwhile
(`vllm:nixl_num_kv_expired_reqs_total` on the prefill) are reported.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pdboot.deploy.waits import Clock
from pdboot.transport.http import HttpFn

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_FETCH = "vllm:num_requests_kv_fetch_by_stage"
KV_FETCH_PENDING = ("waiting_to_start", "in_progress")
KV_EXPIRED = "vllm:nixl_num_kv_expired_reqs_total"
SETTLE_READS = 2

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_STAGE = re.compile(r'stage="([^"]*)"')


@dataclass(frozen=True)
class Load:
    """What an engine's /metrics says is still in flight (summed over its ranks)."""

    running: float = 0.0
    waiting: float = 0.0
    kv_fetching: float = 0.0  # requests waiting for, or doing, a KV pull (decode side)
    kv_expired: float = 0.0  # counter: leases that expired before the decode pulled

    @property
    def idle(self) -> bool:
        return self.running <= 0 and self.waiting <= 0

    def describe(self) -> str:
        text = f"{self.running:g} running, {self.waiting:g} waiting"
        return text + (f", {self.kv_fetching:g} KV pulls" if self.kv_fetching else "")


def parse_load(text: str) -> Load:
    running = waiting = fetching = expired = 0.0
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        name, labels, raw = m.group(1), m.group(2) or "", m.group(3)
        try:
            value = float(raw)
        except ValueError:
            continue
        if name == RUNNING:
            running += value
        elif name == WAITING:
            waiting += value
        elif name == KV_FETCH:
            stage = _STAGE.search(labels)
            if stage is not None and stage.group(1) in KV_FETCH_PENDING:
                fetching += value
        elif name == KV_EXPIRED:
            expired += value
    return Load(running, waiting, fetching, expired)


@dataclass(frozen=True)
class DrainResult:
    url: str
    drained: bool  # False: the timeout ran out with work in flight
    seconds: float
    last: str  # the last reading, in words
    expired_leases: float = 0.0  # on a prefill: leases that expired unread while it drained

    def describe(self) -> str:
        if self.drained:
            extra = f"; {self.expired_leases:g} KV lease(s) expired" if self.expired_leases else ""
            return f"drained in {self.seconds:.1f}s ({self.last}){extra}"
        return f"still busy after {self.seconds:.1f}s ({self.last}): stopped anyway"


def _read(url: str, fetch: HttpFn) -> Load | None:
    """None: the engine did not answer (stopped, or never started)."""
    a = fetch(f"{url}/metrics", timeout=2.0)
    return parse_load(a.body) if a.ok else None


def drain(
    url: str,
    fetch: HttpFn,
    clock: Clock,
    *,
    timeout: float,
    interval: float,
    pullers: Sequence[str] = (),
) -> DrainResult:
    """Wait until the engine at ``url`` (already deregistered) is idle; ``pullers``: for a
    prefill, the decode URLs whose KV pulls must finish first."""
    t0 = clock.now()
    first = _read(url, fetch)
    expired0 = first.kv_expired if first is not None else 0.0
    calm = 0
    last = "no answer" if first is None else first.describe()
    load = first
    while True:
        if load is None:
            return DrainResult(url, True, clock.now() - t0, "no answer: nothing in flight")
        pulls = [p for p in (_read(d, fetch) for d in pullers) if p is not None]
        fetching = sum(p.kv_fetching for p in pulls)
        busy = not load.idle or fetching > 0
        last = load.describe() + (f", decodes pulling {fetching:g}" if fetching else "")
        calm = 0 if busy else calm + 1
        took = clock.now() - t0
        if calm >= SETTLE_READS:
            return DrainResult(url, True, took, last, max(0.0, load.kv_expired - expired0))
        if took >= timeout:
            return DrainResult(url, False, took, last, max(0.0, load.kv_expired - expired0))
        clock.sleep(interval)
        load = _read(url, fetch)
