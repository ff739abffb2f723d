"""The KV proof of `up`: one chat completion through the router, and the decode tier's own
``/metrics`` before and after it, say whether decode pulled the prompt's KV from a prefill.

Thin I/O over ``probes.kv_verdict`` (pure): requests go through the caller's HttpFn.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pdboot.plan.model import Plan
from pdboot.transport.http import HttpFn
from pdboot.verify.metrics import server_facts, total
from pdboot.verify.probes import KVVerdict, completion_text, kv_verdict, prompt_tokens

PROOF_PROMPT = "Say hello in five words."


@dataclass(frozen=True)
class KVProof:
    """``failure`` is why the test request itself failed ("" when it answered); then
    ``verdict`` is None. Otherwise ``text`` is the answer and ``verdict`` the KV judgement."""

    failure: str = ""
    text: str = ""
    verdict: KVVerdict | None = None


def prove_kv(plan: Plan, fetch: HttpFn, headers: Mapping[str, str]) -> KVProof:
    # a DP head's /metrics carries every rank's counters (engine="<rank>")
    decodes = [s for s in plan.services() if s.role == "decode" and not s.headless]
    before = [server_facts(fetch(f"{d.url}/metrics").body) for d in decodes]
    body = {
        "model": plan.served_model_name,
        "messages": [{"role": "user", "content": PROOF_PROMPT}],
        "max_tokens": 8,
        "temperature": 0,
    }
    a = fetch(
        f"{plan.endpoint}/v1/chat/completions", body=body, timeout=300.0, headers=dict(headers)
    )
    text = completion_text(a.body) if a.ok else ""
    if not a.ok or not text:
        return KVProof(failure=f"{a.describe()} {a.body[:500]}")
    after = [server_facts(fetch(f"{d.url}/metrics").body) for d in decodes]
    delta = total(a2 - b for a2, b in zip(after, before, strict=True))
    return KVProof(text=text, verdict=kv_verdict(delta, prompt_tokens(a.body)))
