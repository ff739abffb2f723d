"""HTTP checks against engines and the router, with the parsing kept pure.

vLLM: ``/health`` is 200 when serving; while the model loads the port refuses connections,
so any connection error or non-200 means "not ready". vllm-router: ``/health`` answers
once it serves, ``/workers`` lists what it registered (``{"workers": [{"url", "worker_type",
"is_healthy"}, ...]}``). KV evidence comes from the decode engines' ``/metrics`` as
``metrics.EngineFacts`` (names real vLLM 0.33.0 exports, shared fixture metrics.json): NIXL
transfers, their bytes and failures, and where the prompt's tokens came from.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from pdboot.plan.degraded import engine_url
from pdboot.verify.metrics import FAILED_XFERS, PROMPT_BY_SOURCE, XFER_TIME, EngineFacts

# Real vLLM 0.33.0 names only (metrics.json), as they appear in the KV verdict's causes.
KV_XFERS = f"{XFER_TIME}_count"  # one observation per NIXL transfer
KV_FAILED = FAILED_XFERS  # includes handshake failures
BY_SOURCE = PROMPT_BY_SOURCE
# vLLM's PromptTokenStats (v1/metrics/stats.py): local_compute = prompt_len - num_cached_tokens,
# and when every prompt token arrived over NIXL the scheduler still recomputes the last one
# (the model needs at least one input token), so a healthy remote prefill leaves 1 local token.
LOCAL_TOKENS_ALLOWED = 2


@dataclass(frozen=True)
class KVVerdict:
    ok: bool
    confirmed: bool  # False: the engines expose no metric that could confirm it
    message: str
    cause: str = ""  # why it failed, for the report (empty when ok)


def _recomputed(delta: EngineFacts, prompt_tokens: int | None) -> bool:
    # `up` on a deployment that serves clients (a rolling change) reads other requests in
    # the same window: each pulled one computes its last prompt token locally too. Counted
    # by pulls as well as by finished requests: a request counts its prompt tokens when
    # its first step runs and its success only when it ends, after the window maybe.
    others = max(0.0, max(delta.requests, delta.kv_transfers) - 1)
    if delta.local_compute_tokens <= LOCAL_TOKENS_ALLOWED + others:
        return False
    # more than "the last token": nearly the whole prompt was computed on the decode
    whole = prompt_tokens if prompt_tokens else delta.local_compute_tokens + delta.external_tokens
    return delta.local_compute_tokens >= whole - LOCAL_TOKENS_ALLOWED or delta.external_tokens == 0


def kv_verdict(delta: EngineFacts, prompt_tokens: int | None = None) -> KVVerdict:
    """Did the decode tier receive the test request's KV from a prefill?

    ``delta`` is after - before on every decode engine; ``prompt_tokens`` the request's
    prompt length (the completion's usage) when known."""
    if not delta.known:
        return KVVerdict(True, False, "decode metrics expose no NIXL counters; KV pull unconfirmed")
    if _recomputed(delta, prompt_tokens):
        of = f" of {prompt_tokens}" if prompt_tokens else ""
        n_failed = delta.failed_transfers
        failed = f", {KV_FAILED} by {n_failed:g}" if n_failed > 0 else ""
        return KVVerdict(
            False,
            True,
            f"the decode engine recomputed the prompt ({delta.local_compute_tokens:g}{of} tokens "
            "computed locally): no KV arrived from prefill",
            f'{BY_SOURCE}{{source="local_compute"}} grew by {delta.local_compute_tokens:g}, '
            f'source="external_kv_transfer" by {delta.external_tokens:g}'
            f"{failed}; with kv_load_failure_policy=recompute a failed transfer looks like this",
        )
    if delta.failed_transfers > 0:
        return KVVerdict(
            False,
            True,
            "the decode engine's KV transfer from prefill FAILED",
            f"{KV_FAILED} grew by {delta.failed_transfers:g} on the decode tier",
        )
    if delta.kv_transfers > 0:
        size = f" ({int(delta.kv_bytes)} bytes)" if delta.kv_bytes > 0 else ""
        toks = f", {delta.external_tokens:g} prompt tokens" if delta.external_tokens > 0 else ""
        return KVVerdict(
            True, True, f"decode pulled the KV cache from a prefill engine{size}{toks}"
        )
    if delta.cached_tokens > 0 and delta.local_compute_tokens <= LOCAL_TOKENS_ALLOWED:
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
            url = engine_url(_DP_SUFFIX.sub("", str(w.get("url", ""))))
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
