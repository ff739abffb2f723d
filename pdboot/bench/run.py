"""``pdboot bench``: what P/D buys here, measured by a well-kept load generator (NVIDIA AIPerf,
the optional ``bench`` extra), never by a load loop of our own.

The same synthetic load goes to the router (P/D) and, as the baseline, straight to one decode
engine that then prefills locally (one engine serving alone on the same hardware), at a few
concurrency levels. Pure here: the AIPerf command line; its results are judged in
``results``, drawn in ``chart``. ``run_bench`` is the thin I/O shell.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pdboot.bench.chart import svg_chart
from pdboot.bench.goodput import Targets, Verdict, baseline_gpus, pd_gpus, verdict
from pdboot.bench.results import (
    RECORDS_FILE,
    SUMMARY_FILE,
    Cell,
    merge,
    parse_aiperf,
    points,
    refusal,
    results_json,
)
from pdboot.plan.model import Plan
from pdboot.transport.connection import LocalConnection, RemoteError


@dataclass(frozen=True)
class Target:
    """``role`` "pd" (the router) or "baseline" (one decode engine prefilling locally)."""

    role: str
    name: str
    url: str
    gpus: int = 1  # the GPUs behind it (goodput.py): per-GPU figures divide by these


# The AIPerf whose output files pdboot reads (pyproject's `bench` extra and .ci/setup agree:
# tests/unit/bench/test_bench.py). pdboot is not on PyPI: the hint names AIPerf itself.
AIPERF_VERSION = "0.13.0"


@dataclass(frozen=True)
class LoadShape:
    isl: int = 512
    osl: int = 128
    requests_per_level: int = 0  # 0: AIPerf's own default, max(10, 2 x concurrency)
    seed: int = 1234
    # goodput's TTFT/ITL targets, handed to AIPerf's --goodput
    targets: Targets = field(default_factory=Targets)


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


def aiperf_argv(
    cmd: Sequence[str],
    target: Target,
    model: str,
    concurrency: int,
    tokenizer: str,
    out_dir: Path,
    shape: LoadShape,
) -> list[str]:
    """One ``aiperf profile`` run: streaming completions (TTFT and ITL need streaming),
    ``ignore_eos`` so every request produces ``osl`` tokens, no UI, no GPU telemetry or
    server-metrics scraping (pdboot reads /metrics itself).

    ``tokenizer``: a local tokenizer directory or a name in the local HF cache; AIPerf needs
    one to size prompts. Do not set HF_HUB_OFFLINE with a local path: AIPerf 0.13.0 then
    looks the path up in the hub cache and fails (HFValidationError).
    """
    argv = [
        *cmd,
        "profile",
        "--model",
        model,
        "--url",
        target.url,
        "--endpoint-type",
        "completions",
        "--streaming",
        "--tokenizer",
        tokenizer,
        "--concurrency",
        str(concurrency),
        "--isl",
        str(shape.isl),
        "--osl",
        str(shape.osl),
        "--extra-inputs",
        "ignore_eos:true",
        "--random-seed",
        str(shape.seed),
        "--ui",
        "none",
        "--artifact-dir",
        str(out_dir),
        "--no-server-metrics",
        "--no-gpu-telemetry",
        "--workers-max",
        str(max(1, min(concurrency, 8))),
        "--goodput",
        shape.targets.aiperf_arg(),
    ]
    if shape.requests_per_level:
        argv += ["--request-count", str(shape.requests_per_level)]
    return argv


Runner = Callable[[list[str]], tuple[int, str]]


def run_cell(
    runner: Runner,
    argv: list[str],
    target: Target,
    concurrency: int,
    out_dir: Path,
    targets: Targets | None = None,
) -> Cell:
    """Run AIPerf once and judge its files (the generator's exit code alone says nothing:
    it is 0 with half the requests failed, 1 with all)."""
    rc, log = runner(argv)
    summary, records = out_dir / SUMMARY_FILE, out_dir / RECORDS_FILE
    result = parse_aiperf(
        summary.read_text() if summary.exists() else None,
        records.read_text() if records.exists() else None,
        targets,
    )
    why = refusal(result)
    if why is None and rc != 0:
        why = f"aiperf exited {rc}: {log.strip().splitlines()[-1] if log.strip() else ''}"
    return Cell(target.role, target.name, concurrency, result, why, str(out_dir), target.gpus)


def local_runner(timeout_s: float) -> Runner:
    """AIPerf on this machine, through the local host's connection (transport/: the one
    place pdboot starts a process)."""
    here = LocalConnection("this machine", command_timeout=timeout_s)

    def run(argv: list[str]) -> tuple[int, str]:
        try:
            p = here.run(argv)
        except RemoteError as e:
            if e.kind != "timeout":
                raise
            return 124, f"timed out after {timeout_s:.0f} s"
        return p.rc, p.stdout + p.stderr

    return run


def shares(level: int, n: int) -> list[int]:
    """A load balancer's split of ``level`` concurrent requests over ``n`` engines."""
    return [level // n + (1 if i < level % n else 0) for i in range(n)]


def run_bench(
    targets: Sequence[Target],
    model: str,
    tokenizer: str,
    levels: Sequence[int],
    out_root: Path,
    shape: LoadShape,
    runner: Runner,
    cmd: Sequence[str],
) -> list[Cell]:
    """Every side at every level, artifacts under ``out_root/<role>-c<N>/``. Several targets
    of one role are independent engines: each is measured alone at its share of the level
    (``engine<i>/`` below), one after the other (they share no GPU, so running them together
    would only add the client's load), and their figures are merged (``results.merge``)."""
    cells = []
    roles = list(dict.fromkeys(t.role for t in targets))
    for level in levels:
        for role in roles:
            group = [t for t in targets if t.role == role]
            out_dir = out_root / f"{role}-c{level}"
            out_dir.mkdir(parents=True, exist_ok=True)
            if len(group) == 1:
                argv = aiperf_argv(cmd, group[0], model, level, tokenizer, out_dir, shape)
                cells.append(run_cell(runner, argv, group[0], level, out_dir, shape.targets))
                continue
            parts = []
            for i, (t, share) in enumerate(zip(group, shares(level, len(group)), strict=True)):
                if share == 0:
                    continue
                sub = out_dir / f"engine{i + 1}"
                sub.mkdir(exist_ok=True)
                argv = aiperf_argv(cmd, t, model, share, tokenizer, sub, shape)
                parts.append(run_cell(runner, argv, t, share, sub, shape.targets))
            gpus = sum(t.gpus for t in group)
            cells.append(merge(parts, level, gpus, str(out_dir)))
    return cells


def targets(plan: Plan, baseline_url: str | None = None) -> list[Target]:
    """The router (P/D: every engine's GPUs), and the first decode engine as the engine
    serving alone (sent no ``kv_transfer_params``, it prefills locally: one of the same GPUs'
    independent engines, compared per GPU). ``baseline_url``: comma-separated URLs of
    independent engines instead, each taken to use as many GPUs as the first decode engine."""
    decodes = [s for s in plan.services() if s.role == "decode"]
    urls = [u.strip() for u in (baseline_url or "").split(",") if u.strip()]
    # the public endpoint (the proxy in front of the router), as clients reach it
    out = [Target("pd", "router", plan.endpoint, pd_gpus(plan))]
    if len(urls) > 1:
        for i, u in enumerate(urls):
            out.append(Target("baseline", f"baseline{i + 1}", u, baseline_gpus(plan)))
    elif urls or decodes:
        name = "baseline" if urls else f"decode@{decodes[0].host}"
        out.append(
            Target("baseline", name, urls[0] if urls else decodes[0].url, baseline_gpus(plan))
        )
    return out


@dataclass(frozen=True)
class BenchReport:
    cells: list[Cell]
    results: Path
    chart: Path
    verdict: Verdict

    @property
    def refused(self) -> list[Cell]:
        return [c for c in self.cells if c.refused]


def bench(
    plan: Plan,
    tokenizer: str,
    levels: Sequence[int],
    out_root: Path,
    shape: LoadShape,
    cmd: Sequence[str],
    timeout_s: float = 900,
    baseline_url: str | None = None,
) -> BenchReport:
    """Run the whole comparison; save ``results.json`` and ``chart.svg`` under out_root."""

    tgts = targets(plan, baseline_url)
    cells = run_bench(
        tgts,
        plan.served_model_name,
        tokenizer,
        levels,
        out_root,
        shape,
        local_runner(timeout_s),
        cmd,
    )
    meta = {
        "model": plan.served_model_name,
        "deployment": plan.deployment,
        "targets": [asdict(t) for t in tgts],
        "load": asdict(shape),
        "levels": list(levels),
        "generator": "aiperf",
        "goodput_targets": str(shape.targets),
        "per_gpu": "P/D divides by every engine's GPUs (prefill + decode), the baseline by "
        "its engine's: its rate per GPU is what the same GPUs give as independent engines "
        "behind a load balancer; an engine with `gpus: all` or `device: cpu` counts as 1",
    }
    v = verdict(points(cells, "pd"), points(cells, "baseline"), shape.targets)
    results = out_root / "results.json"
    results.write_text(results_json(cells, meta, v))
    chart = out_root / "chart.svg"
    title = f"pdboot bench: {plan.deployment} ({plan.served_model_name})"
    chart.write_text(svg_chart(cells, title, v, shape.targets))
    return BenchReport(cells, results, chart, v)
