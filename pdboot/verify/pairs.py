"""The P/D probe a roll runs through every pair an engine creates when it joins, before the
router may send it a client: the new prefill with every decode, every prefill with the new
decode. Defence in depth behind plan/nixl_compat.py: a factor pdboot does not know about
(a build it could not read, a variable that reaches the hash) must not turn a roll into an
outage, so the pair itself is asked.

Each probe is the router's P/D flow by hand (as pdcheck.measure_pair): the prefill with
``do_remote_decode``, then the decode with the prefill's ``kv_transfer_params``, one
``X-Request-Id`` for both. A pair that does not answer, or whose decode's failed-transfer
counter grew, fails; the decode's logs say why (diagnose.py names a compatibility hash
mismatch). Nothing here prints or raises."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pdboot.plan.model import Plan, Service
from pdboot.transport.http import HttpFn
from pdboot.verify.metrics import engine_facts, merged
from pdboot.verify.pdcheck import PREFILL_PARAMS, kv_params

PAIR_PROMPT = "pdboot pair probe: name three colours."
TIMEOUT_S = 120.0


@dataclass(frozen=True)
class PairCheck:
    prefill: str
    decode: str
    error: str = ""  # "" when the pair moved KV and answered

    @property
    def ok(self) -> bool:
        return not self.error

    def describe(self) -> str:
        verdict = "ok" if self.ok else f"FAILED: {self.error}"
        return f"{self.prefill} -> {self.decode}: {verdict}"


def new_pairs(
    joining: Sequence[Service], prefills: Sequence[Service], decodes: Sequence[Service]
) -> list[tuple[Service, Service]]:
    """The pairs the joining engines create with the serving ones (and with each other)."""
    pre = {s.key: s for s in prefills}
    dec = {s.key: s for s in decodes}
    for s in joining:
        (pre if s.role == "prefill" else dec)[s.key] = s
    joined = {s.key for s in joining}
    return [
        (p, d) for p in pre.values() for d in dec.values() if p.key in joined or d.key in joined
    ]


def _failed_transfers(fetch: HttpFn, svc: Service) -> float | None:
    a = fetch(f"{svc.url}/metrics", timeout=10.0)
    if not a.ok:
        return None
    return merged(engine_facts(a.body)).failed_transfers


def probe_pair(
    plan: Plan, fetch: HttpFn, headers: Mapping[str, str], pre: Service, dec: Service
) -> PairCheck:
    rid = f"pdboot-pair-{uuid.uuid4().hex}"
    hdrs = {**headers, "X-Request-Id": rid}
    req = {
        "model": plan.served_model_name,
        "prompt": f"{rid} {PAIR_PROMPT}",  # unique: no prefix cache skips the prefill
        "max_tokens": 2,
        "temperature": 0,
        "stream": False,
    }
    before = _failed_transfers(fetch, dec)
    a = fetch(
        f"{pre.url}/v1/completions",
        timeout=TIMEOUT_S,
        headers=hdrs,
        body={**req, "max_tokens": 1, "kv_transfer_params": PREFILL_PARAMS},
    )
    params, _ = kv_params(a.body) if a.ok else (None, 0)
    if params is None:
        why = f"the prefill gave no kv_transfer_params ({a.describe()} {a.body[:200]})"
        return PairCheck(pre.key, dec.key, why.strip())
    b = fetch(
        f"{dec.url}/v1/completions",
        timeout=TIMEOUT_S,
        headers=hdrs,
        body={**req, "kv_transfer_params": params},
    )
    if not b.ok:
        return PairCheck(pre.key, dec.key, f"the decode answered {b.describe()} {b.body[:200]}")
    after = _failed_transfers(fetch, dec)
    if before is not None and after is not None and after > before:
        return PairCheck(
            pre.key, dec.key, f"the decode's KV transfers failed ({after - before:g} more)"
        )
    return PairCheck(pre.key, dec.key)


def check_pairs(
    plan: Plan,
    fetch: HttpFn,
    headers: Mapping[str, str],
    joining: Sequence[Service],
    serving: Sequence[Service],
) -> list[PairCheck]:
    """Every pair the joining engines create with ``serving`` (the engines that answer now)."""
    prefills = [s for s in serving if s.role == "prefill" and not s.headless]
    decodes = [s for s in serving if s.role == "decode" and not s.headless]
    pairs = new_pairs([s for s in joining if not s.headless], prefills, decodes)
    return [probe_pair(plan, fetch, headers, p, d) for p, d in pairs]


__all__ = ["PairCheck", "check_pairs", "new_pairs", "probe_pair"]
