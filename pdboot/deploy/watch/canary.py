"""One canary through one prefill->decode pair, the decode alone, and the pair's NIXL counters.

Thin I/O over the gate (pdboot.verify.gate: the request body, the answer, the rule) and the
metrics parser (pdboot.verify.metrics): requests go through the caller's HttpFn, each step with
its own deadline (a step past it is a hang, not a slow success). Nothing here decides: the
result is a PairCheck for pdboot.plan.watch.policy.

The router's P/D flow by hand, as pdboot.verify.pdcheck.measure_pair does: the prefill with
``do_remote_decode`` and ``max_tokens: 1``, then the decode with the ``kv_transfer_params`` the
prefill returned, the same ``X-Request-Id`` to both. Then the same prompt to the decode alone.

Caches. Every canary's prompt starts with a fresh word, so no prefix cache on the path holds it
(a cached prompt would make the decode pull nothing). The decode-alone request carries a
``cache_salt`` (vLLM's per-request prefix-cache namespace) so that it computes the prompt
itself instead of reusing the blocks the P/D request just pulled - corrupted ones included.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pdboot.plan.watch.policy import CanaryResult, PairCheck, WatchedEngine
from pdboot.transport.http import HttpAnswer, HttpFn
from pdboot.verify.gate import GATE_PROMPT, GATE_SEED, answer_text, classify
from pdboot.verify.metrics import EngineFacts, engine_facts, merged
from pdboot.verify.pdcheck import PREFILL_PARAMS, kv_params

# Short: a canary runs every interval for every pair. Past the gate's LATE_AFTER (8 words),
# so a late divergence (numerics) is still told from a broken KV path.
CANARY_MAX_TOKENS = 16


def canary_body(model: str, prompt: str) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": CANARY_MAX_TOKENS,
        "temperature": 0,
        "top_p": 1,
        "seed": GATE_SEED,
        "stream": False,
    }


def canary_prompt() -> str:
    return f"{uuid.uuid4().hex[:8]} {GATE_PROMPT}"


def _hung(a: HttpAnswer) -> bool:
    return a.status == 0 and "timed out" in a.error


def _step_failure(
    pre: str, dec: str, step: str, a: HttpAnswer, took: float, delta: EngineFacts | None = None
) -> PairCheck:
    detail = a.describe() + (f" {a.body.strip()[:120]}" if a.status else "")
    failed, pulled = _counts(delta)
    return PairCheck(pre, dec, "hang" if _hung(a) else "error", step, detail, took, failed, pulled)


def _counts(delta: EngineFacts | None) -> tuple[float, float]:
    """(failed transfers, prompt tokens pulled) over the canary; a decode whose /metrics went
    unreadable after the request counts as neither."""
    if delta is None:
        return 0.0, 0.0
    return max(delta.failed_transfers, 0.0), max(delta.external_tokens, 0.0)


def decode_facts(fetch: HttpFn, engine: WatchedEngine, deadline: float) -> EngineFacts | None:
    a = fetch(f"{engine.url}/metrics", timeout=deadline)
    return merged(engine_facts(a.body)) if a.ok else None


@dataclass(frozen=True)
class CanaryContext:
    fetch: HttpFn
    headers: Mapping[str, str]
    model: str
    deadline: float
    clock: Callable[[], float] = time.monotonic


def run_canary(ctx: CanaryContext, pre: WatchedEngine, dec: WatchedEngine) -> PairCheck:
    """The pair's canary; every failure is a PairCheck, never an exception."""
    p, d = pre.key, dec.key
    before = decode_facts(ctx.fetch, dec, ctx.deadline)
    if before is None:
        return PairCheck(p, d, "error", "metrics", f"{d} /metrics unreadable")
    prompt = canary_prompt()
    body = canary_body(ctx.model, prompt)
    hdrs = {**ctx.headers, "X-Request-Id": f"pdboot-watch-{uuid.uuid4().hex}"}
    t0 = ctx.clock()
    a = ctx.fetch(
        f"{pre.url}/v1/completions",
        timeout=ctx.deadline,
        headers=hdrs,
        body={**body, "max_tokens": 1, "kv_transfer_params": PREFILL_PARAMS},
    )
    params, _ = kv_params(a.body) if a.ok else (None, 0)
    if params is None:
        if a.ok:
            return PairCheck(p, d, "error", "prefill", "no kv_transfer_params", ctx.clock() - t0)
        return _step_failure(p, d, "prefill", a, ctx.clock() - t0)
    b = ctx.fetch(
        f"{dec.url}/v1/completions",
        timeout=ctx.deadline,
        headers=hdrs,
        body={**body, "kv_transfer_params": params},
    )
    took = ctx.clock() - t0
    after = decode_facts(ctx.fetch, dec, ctx.deadline)
    delta = after - before if after is not None else None
    failed, pulled = _counts(delta)
    if not b.ok:
        return _step_failure(p, d, "decode", b, took, delta)
    pd_text = answer_text(b.body)
    alone = ctx.fetch(
        f"{dec.url}/v1/completions",
        timeout=ctx.deadline,
        headers=dict(ctx.headers),
        body={**body, "cache_salt": f"pdboot-watch-{uuid.uuid4().hex}"},
    )
    if not alone.ok:
        return _step_failure(p, d, "direct", alone, took, delta)
    outcome = classify(pd_text, answer_text(alone.body))
    if outcome.verdict == "broken":
        return PairCheck(
            p,
            d,
            "wrong",
            "compare",
            f"common prefix {outcome.common} words: {outcome.pd_text[:60]!r} vs "
            f"{outcome.direct_text[:60]!r}",
            took,
            failed,
            pulled,
        )
    result: CanaryResult = "late" if outcome.verdict == "late_divergence" else "good"
    return PairCheck(p, d, result, "", "", took, failed, pulled)


def health(fetch: HttpFn, engine: WatchedEngine, deadline: float) -> bool:
    return fetch(f"{engine.url}/health", timeout=deadline).ok
