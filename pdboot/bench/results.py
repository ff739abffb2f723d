"""What one ``pdboot bench`` sweep measured (pure): AIPerf's real output files
(``profile_export_aiperf.json``, ``profile_export.jsonl``) parsed into a ``RunResult``, the
refusal rules (a run whose requests failed or produced no tokens is refused, not reported:
AIPerf itself exits 0 when half the requests failed, srt-slurm#429 is the same trap), the
table and the results file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pdboot.bench.goodput import Point, Targets, Verdict, count_good

SUMMARY_FILE = "profile_export_aiperf.json"
RECORDS_FILE = "profile_export.jsonl"
PCTS = ("p50", "p90", "p99")


@dataclass(frozen=True)
class RunResult:
    """One AIPerf run, from its files. Latencies in ms, throughput in tokens/s."""

    ok_requests: int = 0
    failed_requests: int = 0
    output_tokens: float = 0.0
    ttft_ms: dict[str, float] = field(default_factory=dict)
    itl_ms: dict[str, float] = field(default_factory=dict)
    output_tok_s: float = 0.0
    request_s: float = 0.0
    errors: tuple[str, ...] = ()
    # of failed_requests, those answered 429: pdboot's proxy limiter's status
    # (limit_req_status / limit_conn_status, plan/proxy.py), told apart from the engines'
    limited_requests: int = 0
    has_summary: bool = False
    duration_s: float = 0.0
    # goodput (goodput.py): requests that met both targets, per second, and their tokens/s
    good_requests: int = 0
    goodput_req_s: float = 0.0
    goodput_tok_s: float = 0.0
    good_judged_by: str = ""  # "aiperf" (its per-request verdicts) or "pdboot"


def _avg(summary: dict[str, Any], key: str) -> float:
    v = summary.get(key)
    return float(v.get("avg", 0.0)) if isinstance(v, dict) else 0.0


def _pcts(summary: dict[str, Any], key: str) -> dict[str, float]:
    v = summary.get(key)
    if not isinstance(v, dict):
        return {}
    return {p: float(v[p]) for p in PCTS if isinstance(v.get(p), (int, float))}


LIMITED_STATUS = 429  # what plan/proxy.py's limit_req_status and limit_conn_status answer


def _limited(errors: list[tuple[int | None, int]]) -> int:
    return sum(n for code, n in errors if code == LIMITED_STATUS)


def _code(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _record_errors(records: str) -> tuple[int, int, list[str]]:
    """(ok, failed, error texts) from ``profile_export.jsonl`` (one JSON record a line)."""
    ok = failed = 0
    errs: list[str] = []
    for line in records.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        err = rec.get("error") if isinstance(rec, dict) else None
        if err:
            failed += 1
            errs.append(f"{err.get('code')} {err.get('type')}: {err.get('message')}")
        elif isinstance(rec, dict):
            ok += 1
    return ok, failed, errs


def parse_aiperf(
    summary_text: str | None, records_text: str | None, targets: Targets | None = None
) -> RunResult:
    """The facts of one run. AIPerf writes no summary when every request failed; the
    per-request records then still say why. Goodput from the per-request records against
    ``targets`` (AIPerf's own verdicts where it wrote them), over the window AIPerf's own
    throughputs divide by."""
    if not summary_text:
        ok, failed, errs = _record_errors(records_text or "")
        limited = sum(1 for e in errs if e.startswith(f"{LIMITED_STATUS} "))
        return RunResult(ok, failed, errors=tuple(dict.fromkeys(errs)), limited_requests=limited)
    s = json.loads(summary_text)
    errors = []
    codes: list[tuple[int | None, int]] = []
    for e in s.get("error_summary") or []:
        d = e.get("error_details") or {}
        errors.append(f"{e.get('count')} x {d.get('code') or d.get('type')}: {d.get('message')}")
        codes.append((_code(d.get("code")), _code(e.get("count")) or 0))
    # AIPerf's throughputs and its goodput divide by the window from the first request to the
    # last answer (start_time..end_time), not by its `benchmark_duration`: the same here
    n, rate = _avg(s, "request_count"), _avg(s, "request_throughput")
    duration = n / rate if rate > 0 else _avg(s, "benchmark_duration")
    good = count_good(records_text or "", targets or Targets())
    aiperf_goodput = s.get("goodput")
    return RunResult(
        ok_requests=int(_avg(s, "request_count")),
        failed_requests=int(_avg(s, "error_request_count")),
        output_tokens=_avg(s, "total_output_tokens"),
        ttft_ms=_pcts(s, "time_to_first_token"),
        itl_ms=_pcts(s, "inter_token_latency"),
        output_tok_s=_avg(s, "output_token_throughput"),
        request_s=_avg(s, "request_throughput"),
        errors=tuple(errors),
        limited_requests=_limited(codes),
        has_summary=True,
        duration_s=duration,
        good_requests=good.good,
        goodput_req_s=(
            _avg(s, "goodput")
            if isinstance(aiperf_goodput, dict) and good.judged_by == "aiperf"
            else (good.good / duration if duration > 0 else 0.0)
        ),
        goodput_tok_s=good.good_tokens / duration if duration > 0 else 0.0,
        good_judged_by=good.judged_by if records_text else "",
    )


def refusal(r: RunResult) -> str | None:
    """Why this run must not be reported (None: it may)."""
    total = r.ok_requests + r.failed_requests
    if r.failed_requests:
        first = f"; first: {r.errors[0]}" if r.errors else ""
        limited = (
            f" ({r.limited_requests} limited by the proxy: 429; a benchmark client from one "
            "address needs router.proxy_limits above its concurrency and rate)"
            if r.limited_requests
            else ""
        )
        return f"{r.failed_requests} of {total} requests failed{limited}{first}"
    if r.ok_requests == 0:
        return "no request completed"
    if r.output_tokens <= 0:
        return "the requests produced no tokens (a benchmark of nothing: srt-slurm#429)"
    if not r.ttft_ms or not r.itl_ms:
        return "no TTFT/ITL in the generator's summary (streaming off, or one-token answers)"
    return None


@dataclass(frozen=True)
class Cell:
    role: str
    target: str
    concurrency: int
    result: RunResult
    refused: str | None
    artifacts: str
    gpus: int = 1  # the GPUs this side uses (goodput.py: pd_gpus, baseline_gpus)

    def point(self) -> Point:
        r, g = self.result, max(1, self.gpus)
        return Point(self.concurrency, r.goodput_req_s / g, r.goodput_tok_s / g, r.output_tok_s / g)


def merge(parts: Sequence[Cell], concurrency: int, gpus: int, artifacts: str) -> Cell:
    """Independent engines behind a load balancer, each measured at its share: requests,
    tokens and rates add up; a latency percentile is the worst engine's (the records are not
    pooled, so this errs against the baseline, never for it); one refused part refuses all."""
    rs = [c.result for c in parts]

    def worst(get: Callable[[RunResult], dict[str, float]]) -> dict[str, float]:
        keys = set.intersection(*(set(get(r)) for r in rs)) if rs else set()
        return {k: max(get(r)[k] for r in rs) for k in PCTS if k in keys}

    merged = RunResult(
        ok_requests=sum(r.ok_requests for r in rs),
        failed_requests=sum(r.failed_requests for r in rs),
        limited_requests=sum(r.limited_requests for r in rs),
        output_tokens=sum(r.output_tokens for r in rs),
        ttft_ms=worst(lambda r: r.ttft_ms),
        itl_ms=worst(lambda r: r.itl_ms),
        output_tok_s=sum(r.output_tok_s for r in rs),
        request_s=sum(r.request_s for r in rs),
        errors=tuple(e for r in rs for e in r.errors),
        has_summary=bool(rs) and all(r.has_summary for r in rs),
        duration_s=max((r.duration_s for r in rs), default=0.0),
        good_requests=sum(r.good_requests for r in rs),
        goodput_req_s=sum(r.goodput_req_s for r in rs),
        goodput_tok_s=sum(r.goodput_tok_s for r in rs),
        good_judged_by=",".join(sorted({r.good_judged_by for r in rs if r.good_judged_by})),
    )
    why = next((f"{c.target}: {c.refused}" for c in parts if c.refused), None)
    if not parts:
        why = "no engine measured"
    role = parts[0].role if parts else "baseline"
    name = "+".join(c.target for c in parts)
    return Cell(role, name, concurrency, merged, why, artifacts, gpus)


def points(cells: Sequence[Cell], role: str) -> list[Point]:
    """One side's accepted runs, per GPU, by concurrency (a refused run is no figure)."""
    ok = sorted((c for c in cells if c.role == role and not c.refused), key=lambda c: c.concurrency)
    return [c.point() for c in ok]


SIDES = {"pd": "P/D", "baseline": "alone"}

TABLE_HEADER = [
    "conc",
    "side",
    "GPUs",
    "TTFT ms p50/p99",
    "ITL ms p50/p99",
    "tok/s",
    "tok/s per GPU",
    "good/s (%)",
    "good/s per GPU",
]


def table_rows(cells: Sequence[Cell]) -> list[list[str]]:
    """A row per concurrency and side (P/D, then the engine serving alone: the same GPUs as
    independent engines, compared per GPU); good/s per GPU: goodput, requests/s that met both
    targets, per GPU."""
    rows: list[list[str]] = []
    for c in sorted({c.concurrency for c in cells}):
        for role, side in SIDES.items():
            cell = next((x for x in cells if x.concurrency == c and x.role == role), None)
            if cell is not None:
                rows.append([str(c), side, str(cell.gpus), *_cell_text(cell)])
    return rows


def _cell_text(cell: Cell) -> list[str]:
    if cell.refused:  # the reason follows the table, one line each
        return ["REFUSED", "", "", "", "", ""]
    r, p = cell.result, cell.point()
    pct = 100 * r.good_requests / r.ok_requests if r.ok_requests else 0.0
    return [
        f"{r.ttft_ms.get('p50', 0):.1f} / {r.ttft_ms.get('p99', 0):.1f}",
        f"{r.itl_ms.get('p50', 0):.2f} / {r.itl_ms.get('p99', 0):.2f}",
        f"{r.output_tok_s:.0f}",
        f"{p.tok_s_per_gpu:.0f}",
        f"{r.goodput_req_s:.3g} ({pct:.0f}%)",
        f"{p.goodput_per_gpu:.3g}",
    ]


def results_json(
    cells: Sequence[Cell], meta: dict[str, Any], verdict: Verdict | None = None
) -> str:
    """Every run with its per-GPU figures, and the verdict (goodput.py)."""
    runs = [{**asdict(c), "per_gpu": asdict(c.point())} for c in cells]
    doc: dict[str, Any] = {"meta": meta, "runs": runs}
    if verdict is not None:
        doc["verdict"] = asdict(verdict)
    return json.dumps(doc, indent=1)
