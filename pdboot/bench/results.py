"""What one ``pdboot bench`` sweep measured (pure): AIPerf's real output files
(``profile_export_aiperf.json``, ``profile_export.jsonl``) parsed into a ``RunResult``, the
refusal rules (a run whose requests failed or produced no tokens is refused, not reported:
AIPerf itself exits 0 when half the requests failed, srt-slurm#429 is the same trap), the
table and the results file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

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
    has_summary: bool = False


def _avg(summary: dict[str, Any], key: str) -> float:
    v = summary.get(key)
    return float(v.get("avg", 0.0)) if isinstance(v, dict) else 0.0


def _pcts(summary: dict[str, Any], key: str) -> dict[str, float]:
    v = summary.get(key)
    if not isinstance(v, dict):
        return {}
    return {p: float(v[p]) for p in PCTS if isinstance(v.get(p), (int, float))}


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


def parse_aiperf(summary_text: str | None, records_text: str | None) -> RunResult:
    """The facts of one run. AIPerf writes no summary when every request failed; the
    per-request records then still say why."""
    if not summary_text:
        ok, failed, errs = _record_errors(records_text or "")
        return RunResult(ok, failed, errors=tuple(dict.fromkeys(errs)))
    s = json.loads(summary_text)
    errors = []
    for e in s.get("error_summary") or []:
        d = e.get("error_details") or {}
        errors.append(f"{e.get('count')} x {d.get('code') or d.get('type')}: {d.get('message')}")
    return RunResult(
        ok_requests=int(_avg(s, "request_count")),
        failed_requests=int(_avg(s, "error_request_count")),
        output_tokens=_avg(s, "total_output_tokens"),
        ttft_ms=_pcts(s, "time_to_first_token"),
        itl_ms=_pcts(s, "inter_token_latency"),
        output_tok_s=_avg(s, "output_token_throughput"),
        request_s=_avg(s, "request_throughput"),
        errors=tuple(errors),
        has_summary=True,
    )


def refusal(r: RunResult) -> str | None:
    """Why this run must not be reported (None: it may)."""
    total = r.ok_requests + r.failed_requests
    if r.failed_requests:
        first = f"; first: {r.errors[0]}" if r.errors else ""
        return f"{r.failed_requests} of {total} requests failed{first}"
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


def table_rows(cells: Sequence[Cell]) -> list[list[str]]:
    """Concurrency, then P/D and baseline side by side: TTFT p50/p99, ITL p50/p99, tok/s."""
    rows: list[list[str]] = []
    for c in sorted({c.concurrency for c in cells}):
        row = [str(c)]
        for role in ("pd", "baseline"):
            cell = next((x for x in cells if x.concurrency == c and x.role == role), None)
            row += _cell_text(cell)
        rows.append(row)
    return rows


TABLE_HEADER = [
    "conc",
    "P/D TTFT p50/p99 ms",
    "P/D ITL p50/p99 ms",
    "P/D out tok/s",
    "alone TTFT p50/p99 ms",
    "alone ITL p50/p99 ms",
    "alone out tok/s",
]


def _cell_text(cell: Cell | None) -> list[str]:
    if cell is None:
        return ["-", "-", "-"]
    if cell.refused:
        return ["REFUSED", cell.refused, ""]
    r = cell.result
    return [
        f"{r.ttft_ms.get('p50', 0):.1f} / {r.ttft_ms.get('p99', 0):.1f}",
        f"{r.itl_ms.get('p50', 0):.2f} / {r.itl_ms.get('p99', 0):.2f}",
        f"{r.output_tok_s:.0f}",
    ]


def results_json(cells: Sequence[Cell], meta: dict[str, Any]) -> str:
    return json.dumps({"meta": meta, "runs": [asdict(c) for c in cells]}, indent=1)
