"""Goodput and per-GPU figures (pure): what decides whether P/D pays off on these hosts.

Goodput (DistServe's): requests per second that met both latency targets, TTFT and ITL, and
the output tokens/s of those requests. AIPerf 0.13.0 judges each request itself when given
``--goodput`` (a ``good_request_count`` of 0 or 1 in every record of ``profile_export.jsonl``,
``good_request_count`` and ``goodput`` in its summary); pdboot passes the targets and keeps
AIPerf's judgement, and judges a record itself only where AIPerf wrote none.

Per GPU: a P/D deployment uses every engine's GPUs (prefill and decode); the baseline, one
engine serving alone, uses its own. Dividing both by their GPUs compares them as the same
GPUs would serve: k independent engines behind a load balancer give k times one engine's
rate, so one engine's rate per GPU is theirs too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pdboot.plan.model import Plan, Service


@dataclass(frozen=True)
class Targets:
    """The latency targets a request must meet to count as good (both, in ms)."""

    ttft_ms: float = 2000.0
    itl_ms: float = 50.0

    def aiperf_arg(self) -> str:
        """AIPerf's ``--goodput`` value: metric tags, values in their display unit (ms)."""
        return f"time_to_first_token:{self.ttft_ms:g} inter_token_latency:{self.itl_ms:g}"

    def __str__(self) -> str:
        return f"TTFT <= {self.ttft_ms:g} ms, ITL <= {self.itl_ms:g} ms"


def _value(metrics: dict[str, Any], key: str) -> float | None:
    m = metrics.get(key)
    v = m.get("value") if isinstance(m, dict) else None
    return float(v) if isinstance(v, (int, float)) else None


def is_good(metrics: dict[str, Any], targets: Targets) -> bool:
    """One request's verdict from its record's metrics, as AIPerf makes it: a request without
    a TTFT or an ITL (one token) is not good."""
    ttft, itl = _value(metrics, "time_to_first_token"), _value(metrics, "inter_token_latency")
    if ttft is None or itl is None:
        return False
    return ttft <= targets.ttft_ms and itl <= targets.itl_ms


@dataclass(frozen=True)
class GoodCount:
    good: int = 0
    good_tokens: float = 0.0
    judged_by: str = "aiperf"  # "aiperf": every record carried AIPerf's verdict; else "pdboot"


def count_good(records_text: str, targets: Targets) -> GoodCount:
    """Good requests (and their output tokens) among the profiling phase's successful
    records of ``profile_export.jsonl``."""
    good, tokens, own = 0, 0.0, False
    for line in records_text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict) or rec.get("error"):
            continue
        meta = rec.get("metadata") or {}
        if meta.get("benchmark_phase", "profiling") != "profiling":
            continue
        metrics = rec.get("metrics") or {}
        flag = _value(metrics, "good_request_count")
        if flag is None:
            own = True
        if (flag == 1) if flag is not None else is_good(metrics, targets):
            good += 1
            tokens += _value(metrics, "output_token_count") or 0.0
    return GoodCount(good, tokens, "pdboot" if own else "aiperf")


def _flag(command: Sequence[str], name: str) -> int:
    for i, arg in enumerate(command[:-1]):
        if arg == name and command[i + 1].isdigit():
            return int(command[i + 1])
    return 1


def engine_gpus(s: Service) -> int:
    """The GPUs one engine uses: an explicit list counts its GPUs; ``all`` (the host's count
    is not in the plan) counts what vLLM occupies, tensor x pipeline parallel x local data
    parallel ranks; a ``device: cpu`` engine counts as one (its cores are not GPUs): the
    engine is then the unit, on both sides alike."""
    if isinstance(s.gpus, tuple) and s.gpus:
        return len(s.gpus)
    if s.gpus == "all":
        flags = ("--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size-local")
        n = 1
        for f in flags:
            n *= _flag(s.command, f)
        return n
    return 1


def pd_gpus(plan: Plan) -> int:
    """Every engine's GPUs, prefill and decode (data-parallel followers included)."""
    return sum(engine_gpus(s) for s in plan.engines) or 1


def baseline_gpus(plan: Plan) -> int:
    """The GPUs behind the first decode engine's URL: its own, and its data-parallel
    followers' (their head serves their ranks)."""
    decodes = plan.decode_engines
    if not decodes:
        return 1
    head = decodes[0]
    followers = [s for s in plan.engines if s.headless and s.head_url == head.url]
    return engine_gpus(head) + sum(engine_gpus(s) for s in followers)


@dataclass(frozen=True)
class Point:
    """One side's figures at one concurrency, per GPU."""

    concurrency: int
    goodput_per_gpu: float  # good requests/s per GPU
    good_tok_s_per_gpu: float
    tok_s_per_gpu: float


@dataclass(frozen=True)
class Verdict:
    text: str  # the headline: who wins, by how much
    ratio: float | None  # P/D's best goodput per GPU over the independent engines'
    pd: Point | None
    baseline: Point | None
    detail: str = ""  # where each side peaked, and the targets

    @property
    def line(self) -> str:
        return f"{self.text} ({self.detail})" if self.detail else self.text


def best(points: Sequence[Point]) -> Point | None:
    """The highest goodput per GPU (the capacity under the targets), else the highest
    throughput per GPU."""
    return max(points, key=lambda p: (p.goodput_per_gpu, p.tok_s_per_gpu), default=None)


def _at(name: str, p: Point) -> str:
    return f"{name} {p.goodput_per_gpu:.3g} good req/s per GPU at c={p.concurrency}"


def verdict(pd: Sequence[Point], base: Sequence[Point], targets: Targets) -> Verdict:
    """Does P/D beat the same GPUs serving as independent engines? Best against best (each
    side at the concurrency where its goodput per GPU peaks: the capacity under the
    targets); 5% either way is called even: run-to-run noise is about that."""
    p, b = best(pd), best(base)
    if p is None or b is None:
        missing = "P/D" if p is None else "the independent engines"
        return Verdict(f"no verdict: no accepted run for {missing}", None, p, b, str(targets))
    detail = f"{_at('P/D', p)}, independent {_at('', b).strip()}; {targets}"
    if p.goodput_per_gpu == 0 and b.goodput_per_gpu == 0:
        text = "no verdict: no request met the targets on either side"
        return Verdict(text, None, p, b, str(targets))
    if b.goodput_per_gpu == 0:
        text = "P/D wins: the same GPUs as independent engines met the targets with no request"
        return Verdict(text, None, p, b, detail)
    ratio = p.goodput_per_gpu / b.goodput_per_gpu
    if ratio >= 1.05:
        text = f"P/D: {ratio:.2f}x the goodput per GPU of the same GPUs as independent engines"
    elif ratio <= 0.95:
        text = f"P/D does not pay off here: {ratio:.2f}x the goodput per GPU of independent engines"
    else:
        text = f"P/D and independent engines even: {ratio:.2f}x the goodput per GPU"
    return Verdict(text, ratio, p, b, detail)
