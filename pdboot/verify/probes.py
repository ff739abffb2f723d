"""HTTP checks against engines and the router, with the parsing kept pure.

vLLM: ``/health`` is 200 when serving; while the model loads the port refuses connections,
so any connection error or non-200 means "not ready". vllm-router: ``/health`` answers
once it serves, ``/workers`` lists what it registered (``{"workers": [{"url", "worker_type",
"is_healthy"}, ...]}``). KV evidence comes from the decode engines' ``/metrics``, read only
under names real vLLM 0.33.0 exports (shared fixture metrics.json): NIXL transfers in
``vllm:nixl_xfer_time_seconds_count`` / ``vllm:nixl_bytes_transferred_sum``, failures in
``vllm:nixl_num_failed_transfers_total``, and where the prompt's tokens came from in
``vllm:prompt_tokens_by_source_total{source=...}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

# Real vLLM 0.33.0 names only (metrics.json): the NIXL connector's stats.py histograms and
# counters, and loggers.py's prompt-token accounting. Labels model_name and engine are summed.
KV_XFERS = "vllm:nixl_xfer_time_seconds_count"  # one observation per NIXL transfer
KV_BYTES = "vllm:nixl_bytes_transferred_sum"
KV_FAILED = "vllm:nixl_num_failed_transfers_total"  # includes handshake failures
BY_SOURCE = "vllm:prompt_tokens_by_source_total"
KV_METRICS = (KV_XFERS, KV_BYTES, KV_FAILED, BY_SOURCE)
# vLLM's PromptTokenStats (v1/metrics/stats.py): local_compute = prompt_len - num_cached_tokens,
# and when every prompt token arrived over NIXL the scheduler still recomputes the last one
# (the model needs at least one input token), so a healthy remote prefill leaves 1 local token.
LOCAL_TOKENS_ALLOWED = 2

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfaN]+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


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


def metric_sums_by(text: str, name: str, label: str) -> dict[str, float]:
    """Prometheus text -> sum of one sample name per value of one label (others summed)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or m.group(1) != name:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        key = labels.get(label, "")
        out[key] = out.get(key, 0.0) + v
    return out


@dataclass(frozen=True)
class KVCounters:
    """The decode tier's KV evidence, summed over engines and label sets."""

    xfers: float = 0.0  # NIXL transfers (nixl_xfer_time_seconds_count)
    bytes: float = 0.0  # NIXL bytes (nixl_bytes_transferred_sum)
    failures: float = 0.0  # nixl_num_failed_transfers_total
    external_tokens: float = 0.0  # prompt_tokens_by_source{source="external_kv_transfer"}
    local_tokens: float = 0.0  # prompt_tokens_by_source{source="local_compute"}
    cached_tokens: float = 0.0  # prompt_tokens_by_source{source="local_cache_hit"}
    known: bool = False  # the engine exposes at least one of these metrics

    @classmethod
    def parse(cls, text: str) -> KVCounters:
        s = metric_sums(text)
        src = metric_sums_by(text, BY_SOURCE, "source")
        return cls(
            xfers=s.get(KV_XFERS, 0.0),
            bytes=s.get(KV_BYTES, 0.0),
            failures=s.get(KV_FAILED, 0.0),
            external_tokens=src.get("external_kv_transfer", 0.0),
            local_tokens=src.get("local_compute", 0.0),
            cached_tokens=src.get("local_cache_hit", 0.0),
            known=any(n in s for n in KV_METRICS),
        )

    def _combine(self, other: KVCounters, sign: float, known: bool) -> KVCounters:
        return KVCounters(
            self.xfers + sign * other.xfers,
            self.bytes + sign * other.bytes,
            self.failures + sign * other.failures,
            self.external_tokens + sign * other.external_tokens,
            self.local_tokens + sign * other.local_tokens,
            self.cached_tokens + sign * other.cached_tokens,
            known,
        )

    @classmethod
    def total(cls, items: Iterable[KVCounters]) -> KVCounters:
        """Sum over engines; ``known`` if any engine exposes the counters."""
        out = cls()
        for c in items:
            out = out._combine(c, 1.0, out.known or c.known)
        return out

    def __sub__(self, other: KVCounters) -> KVCounters:
        return self._combine(other, -1.0, self.known and other.known)


@dataclass(frozen=True)
class KVVerdict:
    ok: bool
    confirmed: bool  # False: the engines expose no metric that could confirm it
    message: str
    cause: str = ""  # why it failed, for the report (empty when ok)


def _recomputed(delta: KVCounters, prompt_tokens: int | None) -> bool:
    if delta.local_tokens <= LOCAL_TOKENS_ALLOWED:
        return False
    # more than "the last token": nearly the whole prompt was computed on the decode
    whole = prompt_tokens if prompt_tokens else delta.local_tokens + delta.external_tokens
    return delta.local_tokens >= whole - LOCAL_TOKENS_ALLOWED or delta.external_tokens == 0


def kv_verdict(delta: KVCounters, prompt_tokens: int | None = None) -> KVVerdict:
    """Did the decode tier receive the test request's KV from a prefill?

    ``delta`` is after - before on every decode engine; ``prompt_tokens`` the request's
    prompt length (the completion's usage) when known."""
    if not delta.known:
        return KVVerdict(True, False, "decode metrics expose no NIXL counters; KV pull unconfirmed")
    if _recomputed(delta, prompt_tokens):
        of = f" of {prompt_tokens}" if prompt_tokens else ""
        failed = f", {KV_FAILED} by {delta.failures:g}" if delta.failures > 0 else ""
        return KVVerdict(
            False,
            True,
            f"the decode engine recomputed the prompt ({delta.local_tokens:g}{of} tokens "
            "computed locally): no KV arrived from prefill",
            f'{BY_SOURCE}{{source="local_compute"}} grew by {delta.local_tokens:g}, '
            f'source="external_kv_transfer" by {delta.external_tokens:g}'
            f"{failed}; with kv_load_failure_policy=recompute a failed transfer looks like this",
        )
    if delta.failures > 0:
        return KVVerdict(
            False,
            True,
            "the decode engine's KV transfer from prefill FAILED",
            f"{KV_FAILED} grew by {delta.failures:g} on the decode tier",
        )
    if delta.xfers > 0:
        size = f" ({int(delta.bytes)} bytes)" if delta.bytes > 0 else ""
        toks = f", {delta.external_tokens:g} prompt tokens" if delta.external_tokens > 0 else ""
        return KVVerdict(
            True, True, f"decode pulled the KV cache from a prefill engine{size}{toks}"
        )
    if delta.cached_tokens > 0 and delta.local_tokens <= LOCAL_TOKENS_ALLOWED:
        return KVVerdict(
            True, False, "decode served the prompt from its own prefix cache; KV pull not exercised"
        )
    return KVVerdict(
        False,
        True,
        "no KV transfer counted on any decode engine",
        f'{KV_XFERS} and {BY_SOURCE}{{source="external_kv_transfer"}} did not grow',
    )


_DP_SUFFIX = re.compile(r"@\d+$")


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
            # vllm-router 0.1.17 registers a DP head once per rank its /metrics reports,
            # as `<url>@<rank>`: the head counts as registered when every rank is healthy
            url = _DP_SUFFIX.sub("", str(w.get("url", ""))).rstrip("/")
            kind = str(w.get("worker_type", "")).lower()
            healthy = bool(w.get("is_healthy", True))
            if kind.startswith("prefill"):
                p[url] = p.get(url, True) and healthy
            elif kind.startswith("decode"):
                d[url] = d.get(url, True) and healthy
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


def prompt_tokens(body: str) -> int | None:
    """The prompt's token count from a completion's usage, or None."""
    try:
        return int(json.loads(body)["usage"]["prompt_tokens"])
    except (ValueError, KeyError, TypeError):
        return None
