"""What `up` checks after the KV proof: the correctness gate (same answer through P/D as
from one decode alone) and the KV path's speed per prefill->decode pair.

Thin I/O over pdboot.verify.gate and pdboot.verify.metrics (pure): requests go through the caller's
HttpFn with the deployment's API key header; nothing here prints.

Speed: the router picks pairs itself and vLLM's NIXL metrics carry no peer label, so pdboot
does the router's P/D flow by hand for each pair it measures (prefill with
``do_remote_decode``, then the decode with the prefill's ``kv_transfer_params``, the same
``X-Request-Id`` to both) and reads that decode's NIXL histogram deltas
(``vllm:nixl_bytes_transferred``, ``vllm:nixl_xfer_time_seconds``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from pdboot.events import GateVerdict, PairSpeedLine
from pdboot.plan.model import Plan, Service
from pdboot.transport.http import HttpFn
from pdboot.verify.gate import GateOutcome, run_gate
from pdboot.verify.metrics import (
    PairSpeed,
    SpeedVerdict,
    engine_facts,
    merged,
    pair_speed,
    speed_verdict,
)

# Words of the speed prompt. KV per token is 2 x layers x kv_heads x head_dim x dtype bytes:
# ~128 KB for an 8B Llama-class model (32 x 8 x 128 x 2 x 2), so ~1000 tokens move ~130 MB;
# a 0.5B model (~12 KB/token) still moves ~12 MB. Short enough for any max_model_len >= 2048.
SPEED_WORDS = 900
PREFILL_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
_VOCAB = (
    "amber",
    "basalt",
    "cedar",
    "delta",
    "ember",
    "fjord",
    "granite",
    "harbor",
    "island",
    "juniper",
    "kelp",
    "lagoon",
    "meadow",
    "nectar",
    "orchard",
    "prairie",
)


def speed_prompt(words: int = SPEED_WORDS) -> str:
    """A deterministic prompt of ``words`` words that no cache on the path holds (a fresh
    request id per call is not enough: prefix caching would skip the prefill)."""
    salt = uuid.uuid4().hex[:8]
    body = " ".join(_VOCAB[(i * 7 + i // 16) % len(_VOCAB)] for i in range(words - 1))
    return f"{salt} {body}"


def run_up_gate(plan: Plan, fetch: HttpFn, headers: Mapping[str, str]) -> GateOutcome:
    """The gate through the router and straight to the first decode engine."""
    decode = first_decode(plan)

    def post(url: str, body: dict[str, Any]) -> tuple[int, str]:
        a = fetch(url, body=body, timeout=300.0, headers=dict(headers))
        return a.status, a.body if a.status else a.error

    outcome = run_gate(post, plan.endpoint, decode.url, plan.served_model_name)
    return replace(outcome, device=plan.device)


def gate_event(outcome: GateOutcome, decode: str) -> GateVerdict:
    level: Literal["ok", "warn", "fail"] = (
        "ok" if outcome.level == "ok" else "warn" if outcome.level == "warn" else "fail"
    )
    return GateVerdict(
        level,
        outcome.verdict,
        outcome.common,
        outcome.pd_text,
        outcome.direct_text,
        decode,
        outcome.message(),
    )


def first_decode(plan: Plan) -> Service:
    return next(s for s in plan.services() if s.role == "decode")


def speed_pairs(plan: Plan) -> list[tuple[Service, Service]]:
    """Enough pairs that every prefill and every decode is measured once (all P x D pairs
    would be P*D long requests; the link is per host, and each host appears)."""
    pre = [s for s in plan.services() if s.role == "prefill"]
    dec = [s for s in plan.services() if s.role == "decode"]
    if not pre or not dec:
        return []
    return [(pre[i % len(pre)], dec[i % len(dec)]) for i in range(max(len(pre), len(dec)))]


@dataclass(frozen=True)
class PairResult:
    prefill: str
    decode: str
    verdict: SpeedVerdict | None
    error: str = ""
    tokens: int = 0
    link_gbps: float | None = None
    speed: PairSpeed | None = None

    def event(self) -> PairSpeedLine:
        v, sp = self.verdict, self.speed
        mb = sp.nbytes / 1e6 if sp is not None else 0.0
        gbps = sp.gbps if sp is not None and v is not None and v.judged else None
        line = v.line if v is not None else f"{self.prefill} -> {self.decode}: {self.error}"
        flag = v.flag if v is not None else None
        return PairSpeedLine(
            self.prefill,
            self.decode,
            gbps,
            self.link_gbps,
            mb,
            line,
            flag.code if flag else "",
            flag.message if flag else "",
        )


def _facts(fetch: HttpFn, svc: Service) -> Any:
    a = fetch(f"{svc.url}/metrics", timeout=10.0)
    if not a.ok:
        raise OSError(f"{svc.key} /metrics: {a.describe()}")
    return merged(engine_facts(a.body))


def _kv_params(raw: str) -> tuple[dict[str, Any] | None, int]:
    try:
        doc = json.loads(raw)
        params = doc.get("kv_transfer_params")
        tokens = int(doc.get("usage", {}).get("prompt_tokens", 0))
    except (ValueError, AttributeError, TypeError):
        return None, 0
    return (params if isinstance(params, dict) else None), tokens


def measure_pair(
    plan: Plan, fetch: HttpFn, headers: Mapping[str, str], pair: tuple[Service, Service]
) -> tuple[PairSpeed, int]:
    """One long request over this pair; the decode's KV bytes/seconds delta. Raises OSError
    with the reason when a step fails."""
    pre, dec = pair
    rid = f"pdboot-speed-{uuid.uuid4().hex}"
    hdrs = {**headers, "X-Request-Id": rid}
    req = {
        "model": plan.served_model_name,
        "prompt": speed_prompt(),
        "max_tokens": 2,
        "temperature": 0,
        "stream": False,
    }
    before = _facts(fetch, dec)
    a = fetch(
        f"{pre.url}/v1/completions",
        timeout=300.0,
        headers=hdrs,
        body={**req, "max_tokens": 1, "kv_transfer_params": PREFILL_PARAMS},
    )
    params, tokens = _kv_params(a.body) if a.ok else (None, 0)
    if params is None:
        raise OSError(f"prefill {pre.key} gave no kv_transfer_params ({a.describe()})")
    b = fetch(
        f"{dec.url}/v1/completions",
        timeout=300.0,
        headers=hdrs,
        body={**req, "kv_transfer_params": params},
    )
    if not b.ok:
        raise OSError(f"decode {dec.key}: {b.describe()} {b.body[:200]}")
    delta = _facts(fetch, dec) - before
    return pair_speed(pre.key, dec.key, delta), tokens


def link_rate(
    pre: Service, dec: Service, port_gbps: Mapping[str, float], declared: float | None
) -> float | None:
    """The slower end's RDMA port rate (preflight) when both ends use RDMA and preflight
    read both rates, else the inventory's ``requirements.link_gbps`` (device: cpu without
    RDMA: the TCP link's rate, never a port rate)."""
    if pre.rdma and dec.rdma:
        rates = [port_gbps[h] for h in (pre.host, dec.host) if h in port_gbps]
        if len(rates) == 2:
            return min(rates)
    return declared


def check_speed(
    plan: Plan,
    fetch: HttpFn,
    headers: Mapping[str, str],
    port_gbps: Mapping[str, float],
    declared: float | None,
    connector: str,
) -> list[PairResult]:
    """Measure every pair of speed_pairs; a pair that fails is reported, not raised."""
    out: list[PairResult] = []
    for pre, dec in speed_pairs(plan):
        try:
            speed, tokens = measure_pair(plan, fetch, headers, (pre, dec))
        except OSError as e:
            out.append(PairResult(pre.key, dec.key, None, str(e)))
            continue
        same = pre.host == dec.host
        rdma = bool(pre.rdma and dec.rdma)
        link = link_rate(pre, dec, port_gbps, declared)
        v = speed_verdict(
            speed, link, same_host=same, rdma=rdma, connector=connector, device=pre.device
        )
        out.append(PairResult(pre.key, dec.key, v, "", tokens, link, speed))
    return out
