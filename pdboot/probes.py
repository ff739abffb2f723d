"""HTTP checks against engines and the router, with the parsing kept pure.

vLLM: ``/health`` is 200 when serving; while the model loads the port refuses connections,
so any connection error or non-200 means "not ready". vllm-router: ``/health`` answers
once it serves, ``/workers`` lists what it registered (``{"workers": [{"url", "worker_type",
"is_healthy"}, ...]}``). KV evidence comes from the decode engines' ``/metrics``: real vLLM
counts NIXL transfers in ``vllm:nixl_xfer_time_seconds_count`` (a histogram), the testbed's
stand-in in ``vllm:nixl_kv_pulls_total``; a decode that prefilled locally instead shows up
in ``vllm:nixl_local_prefills_total`` / ``vllm:nixl_recomputed_prefills_total``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Metric sample names (after the histogram/counter suffix) that count KV pulls by decode.
KV_PULL_METRICS = ("vllm:nixl_xfer_time_seconds_count", "vllm:nixl_kv_pulls_total")
KV_BYTES_METRICS = ("vllm:nixl_bytes_transferred_sum", "vllm:nixl_kv_bytes_pulled_total")
LOCAL_PREFILL_METRICS = ("vllm:nixl_local_prefills_total", "vllm:nixl_recomputed_prefills_total")
KV_FAILURE_METRICS = ("vllm:nixl_num_failed_transfers_total", "vllm:nixl_kv_pull_failures_total")

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfaN]+)")


def metric_sums(text: str) -> dict[str, float]:
    """Prometheus text -> sum per sample name over all label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + v
    return out


def _first(sums: Mapping[str, float], names: Iterable[str]) -> float:
    """The first of several names for the same quantity that the engine exposes (real
    vLLM's name first; an engine exporting both must not be counted twice)."""
    for n in names:
        if n in sums:
            return sums[n]
    return 0.0


@dataclass(frozen=True)
class KVCounters:
    pulls: float
    bytes: float
    local_prefills: float
    failures: float
    known: bool  # the engine exposes at least one of the NIXL metrics we read

    @classmethod
    def parse(cls, text: str) -> KVCounters:
        s = metric_sums(text)
        names = KV_PULL_METRICS + KV_BYTES_METRICS + LOCAL_PREFILL_METRICS + KV_FAILURE_METRICS
        return cls(
            pulls=_first(s, KV_PULL_METRICS),
            bytes=_first(s, KV_BYTES_METRICS),
            local_prefills=sum(s.get(n, 0.0) for n in LOCAL_PREFILL_METRICS),
            failures=_first(s, KV_FAILURE_METRICS),
            known=any(n in s for n in names),
        )

    @classmethod
    def total(cls, items: Iterable[KVCounters]) -> KVCounters:
        """Sum over engines; ``known`` if any engine exposes the counters."""
        out = cls(0.0, 0.0, 0.0, 0.0, False)
        for c in items:
            out = cls(
                out.pulls + c.pulls,
                out.bytes + c.bytes,
                out.local_prefills + c.local_prefills,
                out.failures + c.failures,
                out.known or c.known,
            )
        return out

    def __sub__(self, other: KVCounters) -> KVCounters:
        return KVCounters(
            self.pulls - other.pulls,
            self.bytes - other.bytes,
            self.local_prefills - other.local_prefills,
            self.failures - other.failures,
            self.known and other.known,
        )


@dataclass(frozen=True)
class KVVerdict:
    ok: bool
    confirmed: bool  # False: the engines expose no metric that could confirm it
    message: str


def kv_verdict(delta: KVCounters) -> KVVerdict:
    """Did the decode tier receive KV from a prefill for the test request?"""
    if not delta.known:
        return KVVerdict(True, False, "decode metrics expose no NIXL counters; KV pull unconfirmed")
    if delta.pulls > 0:
        size = f" ({int(delta.bytes)} bytes)" if delta.bytes > 0 else ""
        return KVVerdict(True, True, f"decode pulled the KV cache from a prefill engine{size}")
    if delta.failures > 0:
        return KVVerdict(False, True, "the decode engine's KV transfer from prefill FAILED")
    if delta.local_prefills > 0:
        return KVVerdict(
            False, True, "decode recomputed the prefill locally: no KV arrived from prefill"
        )
    return KVVerdict(False, True, "no KV transfer counted on any decode engine")


@dataclass(frozen=True)
class RouterWorkers:
    prefill: dict[str, bool]  # url -> healthy
    decode: dict[str, bool]

    @classmethod
    def parse(cls, text: str) -> RouterWorkers:
        data = json.loads(text)
        items = data.get("workers", []) if isinstance(data, dict) else data
        p: dict[str, bool] = {}
        d: dict[str, bool] = {}
        for w in items if isinstance(items, list) else []:
            if not isinstance(w, dict):
                continue
            url = str(w.get("url", "")).rstrip("/")
            kind = str(w.get("worker_type", "")).lower()
            healthy = bool(w.get("is_healthy", True))
            if kind.startswith("prefill"):
                p[url] = healthy
            elif kind.startswith("decode"):
                d[url] = healthy
        return cls(p, d)

    def missing(self, prefills: Iterable[str], decodes: Iterable[str]) -> list[str]:
        """Engine URLs not registered (or registered unhealthy) with the router."""
        out = [f"prefill {u}" for u in prefills if not self.prefill.get(u.rstrip("/"))]
        out += [f"decode {u}" for u in decodes if not self.decode.get(u.rstrip("/"))]
        return out


def completion_text(body: str) -> str:
    """The generated text of a (non-streamed) chat completion, or '' if there is none."""
    try:
        data = json.loads(body)
        choice = data["choices"][0]
        msg = choice.get("message") or {}
        return str(msg.get("content") or choice.get("text") or "")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return ""
