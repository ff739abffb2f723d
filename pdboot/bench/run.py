"""``pdboot bench``: what P/D buys here, measured by a well-kept load generator (NVIDIA AIPerf,
the optional ``bench`` extra), never by a load loop of our own.

The same synthetic load goes to the router (P/D) and, as the baseline, straight to one decode
engine that then prefills locally (one engine serving alone on the same hardware), at a few
concurrency levels. A run whose requests failed or produced no tokens is refused, not reported:
AIPerf itself exits 0 when half the requests failed (srt-slurm#429 is the same trap).

Pure parts: the AIPerf command line, the parsing of its real output files
(``profile_export_aiperf.json``, ``profile_export.jsonl``), the refusal rules, the table and the
SVG chart. ``run_bench`` is the thin I/O shell.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pdboot.plan.model import Plan

SUMMARY_FILE = "profile_export_aiperf.json"
RECORDS_FILE = "profile_export.jsonl"
DEFAULT_CONCURRENCY = (1, 4, 16)
PCTS = ("p50", "p90", "p99")


@dataclass(frozen=True)
class Target:
    """``role`` "pd" (the router) or "baseline" (one decode engine prefilling locally)."""

    role: str
    name: str
    url: str


@dataclass(frozen=True)
class LoadShape:
    isl: int = 512
    osl: int = 128
    requests_per_level: int = 0  # 0: AIPerf's own default, max(10, 2 x concurrency)
    seed: int = 1234


def aiperf_command() -> list[str] | None:
    """How to start AIPerf here: ``$PDBOOT_AIPERF`` (AIPerf installed in its own virtualenv:
    its dependencies are many), its console script, else ``python -m aiperf``; None when the
    ``bench`` extra is not installed."""
    exe = os.environ.get("PDBOOT_AIPERF") or shutil.which("aiperf")
    if exe:
        return [exe]
    if importlib.util.find_spec("aiperf") is not None:
        return [sys.executable, "-m", "aiperf"]
    return None


def aiperf_argv(cmd: Sequence[str], target: Target, model: str, concurrency: int,
                tokenizer: str, out_dir: Path, shape: LoadShape) -> list[str]:
    """One ``aiperf profile`` run: streaming completions (TTFT and ITL need streaming),
    ``ignore_eos`` so every request produces ``osl`` tokens, no UI, no GPU telemetry or
    server-metrics scraping (pdboot reads /metrics itself).

    ``tokenizer``: a local tokenizer directory or a name in the local HF cache; AIPerf needs
    one to size prompts. Do not set HF_HUB_OFFLINE with a local path: AIPerf 0.13.0 then
    looks the path up in the hub cache and fails (HFValidationError).
    """
    argv = [*cmd, "profile", "--model", model, "--url", target.url,
            "--endpoint-type", "completions", "--streaming", "--tokenizer", tokenizer,
            "--concurrency", str(concurrency), "--isl", str(shape.isl),
            "--osl", str(shape.osl), "--extra-inputs", "ignore_eos:true",
            "--random-seed", str(shape.seed), "--ui", "none", "--artifact-dir", str(out_dir),
            "--no-server-metrics", "--no-gpu-telemetry",
            "--workers-max", str(max(1, min(concurrency, 8)))]
    if shape.requests_per_level:
        argv += ["--request-count", str(shape.requests_per_level)]
    return argv


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
        errors.append(f"{e.get('count')} x {d.get('code') or d.get('type')}: "
                      f"{d.get('message')}")
    return RunResult(
        ok_requests=int(_avg(s, "request_count")),
        failed_requests=int(_avg(s, "error_request_count")),
        output_tokens=_avg(s, "total_output_tokens"),
        ttft_ms=_pcts(s, "time_to_first_token"), itl_ms=_pcts(s, "inter_token_latency"),
        output_tok_s=_avg(s, "output_token_throughput"),
        request_s=_avg(s, "request_throughput"), errors=tuple(errors), has_summary=True)


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


TABLE_HEADER = ["conc", "P/D TTFT p50/p99 ms", "P/D ITL p50/p99 ms", "P/D out tok/s",
                "alone TTFT p50/p99 ms", "alone ITL p50/p99 ms", "alone out tok/s"]


def _cell_text(cell: Cell | None) -> list[str]:
    if cell is None:
        return ["-", "-", "-"]
    if cell.refused:
        return ["REFUSED", cell.refused, ""]
    r = cell.result
    return [f"{r.ttft_ms.get('p50', 0):.1f} / {r.ttft_ms.get('p99', 0):.1f}",
            f"{r.itl_ms.get('p50', 0):.2f} / {r.itl_ms.get('p99', 0):.2f}",
            f"{r.output_tok_s:.0f}"]


def results_json(cells: Sequence[Cell], meta: dict[str, Any]) -> str:
    return json.dumps({"meta": meta, "runs": [asdict(c) for c in cells]}, indent=1)


Runner = Callable[[list[str]], tuple[int, str]]


def run_cell(runner: Runner, argv: list[str], target: Target, concurrency: int,
             out_dir: Path) -> Cell:
    """Run AIPerf once and judge its files (the generator's exit code alone says nothing:
    it is 0 with half the requests failed, 1 with all)."""
    rc, log = runner(argv)
    summary, records = out_dir / SUMMARY_FILE, out_dir / RECORDS_FILE
    result = parse_aiperf(summary.read_text() if summary.exists() else None,
                          records.read_text() if records.exists() else None)
    why = refusal(result)
    if why is None and rc != 0:
        why = f"aiperf exited {rc}: {log.strip().splitlines()[-1] if log.strip() else ''}"
    return Cell(target.role, target.name, concurrency, result, why, str(out_dir))


def subprocess_runner(timeout_s: float) -> Runner:
    def run(argv: list[str]) -> tuple[int, str]:
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                               check=False)
        except subprocess.TimeoutExpired:
            return 124, f"timed out after {timeout_s:.0f} s"
        return p.returncode, p.stdout + p.stderr
    return run


def run_bench(targets: Sequence[Target], model: str, tokenizer: str, levels: Sequence[int],
              out_root: Path, shape: LoadShape, runner: Runner,
              cmd: Sequence[str]) -> list[Cell]:
    """Every target at every level, artifacts under ``out_root/<role>-c<N>/``."""
    cells = []
    for level in levels:
        for t in targets:
            out_dir = out_root / f"{t.role}-c{level}"
            out_dir.mkdir(parents=True, exist_ok=True)
            argv = aiperf_argv(cmd, t, model, level, tokenizer, out_dir, shape)
            cells.append(run_cell(runner, argv, t, level, out_dir))
    return cells


def targets(plan: Plan, baseline_url: str | None = None) -> list[Target]:
    """The router, and the first decode engine as the engine serving alone (sent no
    ``kv_transfer_params``, it prefills locally: the single-instance baseline)."""
    decodes = [s for s in plan.services() if s.role == "decode"]
    base = baseline_url or (decodes[0].url if decodes else None)
    out = [Target("pd", "router", plan.router.url)]
    if base:
        name = f"decode@{decodes[0].host}" if decodes and not baseline_url else "baseline"
        out.append(Target("baseline", name, base))
    return out


@dataclass(frozen=True)
class BenchReport:
    cells: list[Cell]
    results: Path
    chart: Path

    @property
    def refused(self) -> list[Cell]:
        return [c for c in self.cells if c.refused]


def bench(plan: Plan, tokenizer: str, levels: Sequence[int], out_root: Path,
          shape: LoadShape, cmd: Sequence[str], timeout_s: float = 900,
          baseline_url: str | None = None) -> BenchReport:
    """Run the whole comparison; save ``results.json`` and ``chart.svg`` under out_root."""
    from pdboot.bench.chart import svg_chart

    tgts = targets(plan, baseline_url)
    cells = run_bench(tgts, plan.served_model_name, tokenizer, levels, out_root, shape,
                      subprocess_runner(timeout_s), cmd)
    meta = {"model": plan.served_model_name, "deployment": plan.deployment,
            "targets": [asdict(t) for t in tgts], "load": asdict(shape),
            "levels": list(levels), "generator": "aiperf"}
    results = out_root / "results.json"
    results.write_text(results_json(cells, meta))
    chart = out_root / "chart.svg"
    chart.write_text(svg_chart(cells, f"pdboot bench: {plan.deployment} "
                                      f"({plan.served_model_name})"))
    return BenchReport(cells, results, chart)
