"""The P/D part of `status`: per engine what its own ``/metrics`` says (KV transfers, failed
transfers, expired leases, requests served, TTFT and ITL percentiles), the request spread per
tier, and the flags of pdboot.verify.metrics.

One scrape gives totals since each engine started; `status --watch` scrapes again and shows
what happened in between (deltas), which is what the flags should judge on a long-lived
deployment. Pure except ``scrape``, which goes through the caller's HttpFn.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

from pdboot.inventory.schema import TIERS
from pdboot.plan.model import Plan
from pdboot.transport.http import HttpFn
from pdboot.verify.metrics import (
    EngineFacts,
    Flag,
    decode_recomputes,
    engine_facts,
    expired_leases,
    failing_transfers,
    idle_prefill_pool,
    merged,
    spread,
)

Quantiles = dict[str, float | None]  # {"p50": s, "p90": s, "p99": s}


@dataclass(frozen=True)
class EngineMetrics:
    """One engine's row of `status`: its ``metrics.EngineFacts`` (None when its /metrics
    could not be read, ``error`` says why), read under the names `status --json` uses."""

    service: str
    role: str
    facts: EngineFacts | None = None
    error: str = ""

    @property
    def scraped(self) -> bool:
        return self.facts is not None

    def _get(self, name: str) -> float:
        return float(getattr(self.facts, name)) if self.facts is not None else 0.0

    @property
    def requests(self) -> float:
        return self._get("requests")

    @property
    def kv_transfers(self) -> float:
        return self._get("kv_transfers")

    @property
    def kv_megabytes(self) -> float:
        return self._get("kv_bytes") / 1e6

    @property
    def failed_transfers(self) -> float:
        return self._get("failed_transfers")

    @property
    def expired_leases(self) -> float:
        return self._get("expired_leases")

    @property
    def local_prompt_tokens(self) -> float:
        return self._get("local_compute_tokens")

    @property
    def external_prompt_tokens(self) -> float:
        return self._get("external_tokens")

    @property
    def ttft(self) -> Quantiles | None:  # seconds
        return self.facts.percentiles("ttft") if self.facts is not None else None

    @property
    def itl(self) -> Quantiles | None:  # seconds
        return self.facts.percentiles("itl") if self.facts is not None else None

    def as_json(self) -> dict[str, object]:
        """The row in `status --json` (its keys are a stable interface)."""
        return {
            "service": self.service,
            "role": self.role,
            "scraped": self.scraped,
            "error": self.error,
            "requests": self.requests,
            "kv_transfers": self.kv_transfers,
            "kv_megabytes": self.kv_megabytes,
            "failed_transfers": self.failed_transfers,
            "expired_leases": self.expired_leases,
            "local_prompt_tokens": self.local_prompt_tokens,
            "external_prompt_tokens": self.external_prompt_tokens,
            "ttft": self.ttft,
            "itl": self.itl,
        }


@dataclass(frozen=True)
class TierSpread:
    tier: str
    requests: dict[str, float]  # engine -> requests served


@dataclass(frozen=True)
class PDStatus:
    engines: tuple[EngineMetrics, ...]
    spread: tuple[TierSpread, ...]
    flags: tuple[Flag, ...]
    window_seconds: float | None = None  # None: totals since start; else a --watch window

    def as_json(self) -> dict[str, object]:
        """`status --json`'s "pd" object."""
        return {
            "engines": [e.as_json() for e in self.engines],
            "spread": [asdict(s) for s in self.spread],
            "flags": [asdict(f) for f in self.flags],
            "window_seconds": self.window_seconds,
        }


Scrape = dict[str, EngineFacts | str]  # service key -> facts, or why it could not be read


def scrape(plan: Plan, fetch: HttpFn, running: set[str] | None = None) -> Scrape:
    """Every engine's /metrics (all its data-parallel ranks summed); only ``running`` keys
    when given (no point asking a stopped container)."""
    out: Scrape = {}
    for svc in plan.services():
        if not svc.is_engine or (running is not None and svc.key not in running):
            continue
        if svc.headless:  # a DP follower serves no HTTP; its head's /metrics has its ranks
            continue
        a = fetch(f"{svc.url}/metrics", timeout=5.0)
        out[svc.key] = merged(engine_facts(a.body)) if a.ok else f"/metrics: {a.describe()}"
    return out


def _row(key: str, role: str, f: EngineFacts | str) -> EngineMetrics:
    if isinstance(f, str):
        return EngineMetrics(key, role, None, f)
    return EngineMetrics(key, role, f)


def window(now: Scrape, before: Scrape | None) -> Scrape:
    """``now - before`` per engine read both times; totals when there is no ``before``; an
    engine whose counters went down restarted in between: its totals are the window."""
    if before is None:
        return dict(now)
    out: Scrape = {}
    for key, f in now.items():
        b = before.get(key)
        if isinstance(f, str) or not isinstance(b, EngineFacts) or f.requests < b.requests:
            out[key] = f
        else:
            out[key] = f - b
    return out


def _flags(roles: Mapping[str, str], facts: Mapping[str, EngineFacts]) -> list[Flag]:
    found: list[Flag | None] = []
    for key, f in facts.items():
        if roles[key] == "decode":
            found += [decode_recomputes(key, f), failing_transfers(key, f)]
        else:
            found.append(expired_leases(key, f))
    tiers = {t: {k: f for k, f in facts.items() if roles[k] == t} for t in TIERS}
    found.append(idle_prefill_pool(tiers["prefill"], tiers["decode"]))
    found += [spread(t, fs).flag() for t, fs in tiers.items()]
    return [f for f in found if f is not None]


def pd_status(
    plan: Plan, now: Scrape, before: Scrape | None = None, seconds: float | None = None
) -> PDStatus:
    """Pure: the rows, spread and flags from one scrape (totals) or two (a window)."""
    roles = {s.key: s.role for s in plan.services()}
    data = window(now, before)
    rows = tuple(_row(k, roles[k], f) for k, f in data.items())
    facts = {k: f for k, f in data.items() if isinstance(f, EngineFacts)}
    spreads = tuple(
        TierSpread(t, {k: f.requests for k, f in facts.items() if roles[k] == t}) for t in TIERS
    )
    flags = tuple(_flags(roles, facts))
    return PDStatus(rows, spreads, flags, seconds if before is not None else None)
