"""pdboot bench: AIPerf's command line, its real output files (captured, see the fixture
README), the refusal rules, the side-by-side table and the chart."""

from __future__ import annotations

import itertools
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pdboot.bench import chart as benchchart
from pdboot.bench import results as bench_results
from pdboot.bench import run as bench

FIX = Path(__file__).parent / "fixtures" / "aiperf-0.13.0"


def _load(name: str) -> bench_results.RunResult:
    d = FIX / name
    summary = d / bench_results.SUMMARY_FILE
    return bench_results.parse_aiperf(summary.read_text() if summary.exists() else None,
                              (d / bench_results.RECORDS_FILE).read_text())


def test_argv_is_streaming_offline_friendly_and_sized() -> None:
    t = bench.Target("pd", "router", "http://10.0.0.1:8000")
    argv = bench.aiperf_argv(["aiperf"], t, "Qwen/Qwen3-0.6B", 4, "/tok", Path("/out"),
                             bench.LoadShape(isl=256, osl=64, requests_per_level=20))
    assert argv[:2] == ["aiperf", "profile"]
    pairs = dict(itertools.pairwise(argv))
    assert pairs["--url"] == "http://10.0.0.1:8000" and pairs["--tokenizer"] == "/tok"
    assert pairs["--concurrency"] == "4" and pairs["--isl"] == "256" and pairs["--osl"] == "64"
    assert pairs["--request-count"] == "20" and pairs["--artifact-dir"] == "/out"
    assert "--streaming" in argv and pairs["--endpoint-type"] == "completions"
    assert pairs["--extra-inputs"] == "ignore_eos:true" and pairs["--ui"] == "none"
    no_count = bench.aiperf_argv(["aiperf"], t, "m", 1, "/tok", Path("/o"), bench.LoadShape())
    assert "--request-count" not in no_count


def test_healthy_run_parsed_from_real_output() -> None:
    r = _load("pd-c4")
    assert r.has_summary and r.ok_requests == 8 and r.failed_requests == 0
    assert r.output_tokens > 0 and r.output_tok_s > 0 and r.request_s > 0
    assert set(r.ttft_ms) == {"p50", "p90", "p99"} and set(r.itl_ms) == {"p50", "p90", "p99"}
    assert r.ttft_ms["p50"] <= r.ttft_ms["p99"]
    assert bench_results.refusal(r) is None


def test_partial_failure_is_refused_although_aiperf_exited_0() -> None:
    r = _load("partial-failure")
    assert (r.ok_requests, r.failed_requests) == (4, 4)
    why = bench_results.refusal(r)
    assert why is not None and why.startswith("4 of 8 requests failed")
    assert "ClientConnectorError" in why


def test_all_failed_run_has_no_summary_and_is_refused() -> None:
    r = _load("all-failed")
    assert not r.has_summary and (r.ok_requests, r.failed_requests) == (0, 6)
    why = bench_results.refusal(r)
    assert why is not None and "6 of 6 requests failed" in why
    assert "does not exist" in why


def test_zero_tokens_is_refused() -> None:
    # the healthy capture with its token totals zeroed: what a run of empty answers reports
    s = json.loads((FIX / "pd-c4" / bench_results.SUMMARY_FILE).read_text())
    s["total_output_tokens"]["avg"] = 0.0
    why = bench_results.refusal(bench_results.parse_aiperf(json.dumps(s), None))
    assert why is not None and "no tokens" in why and "srt-slurm#429" in why


def test_missing_latencies_are_refused() -> None:
    s = json.loads((FIX / "pd-c4" / bench_results.SUMMARY_FILE).read_text())
    del s["inter_token_latency"]
    refused = bench_results.refusal(bench_results.parse_aiperf(json.dumps(s), None))
    assert "TTFT/ITL" in (refused or "")


def _cells(tmp: Path, failing_rc: int = 0) -> list[bench_results.Cell]:
    """run_bench with a runner that lays down the captured files instead of running aiperf
    (the files are real; only the process is replaced)."""
    def runner(argv: list[str]) -> tuple[int, str]:
        out = Path(argv[argv.index("--artifact-dir") + 1])
        src = FIX / ("partial-failure" if "-c16" in str(out) and "baseline" in str(out)
                     else "pd-c4")
        for f in src.iterdir():
            (out / f.name).write_text(f.read_text())
        return failing_rc, "done\n"

    targets = [bench.Target("pd", "router", "http://r:8000"),
               bench.Target("baseline", "decode alone", "http://d:8200")]
    return bench.run_bench(targets, "m", "/tok", [1, 16], tmp, bench.LoadShape(), runner,
                           ["aiperf"])


def test_run_bench_lays_out_artifacts_and_refuses_per_cell(tmp_path: Path) -> None:
    cells = _cells(tmp_path)
    assert [(c.role, c.concurrency) for c in cells] == [
        ("pd", 1), ("baseline", 1), ("pd", 16), ("baseline", 16)]
    assert (tmp_path / "baseline-c16" / bench_results.SUMMARY_FILE).exists()
    assert [c.refused is None for c in cells] == [True, True, True, False]
    rows = bench_results.table_rows(cells)
    assert [r[0] for r in rows] == ["1", "16"]
    assert rows[1][4] == "REFUSED" and "requests failed" in rows[1][5]
    assert len(rows[0]) == len(bench_results.TABLE_HEADER)
    saved = json.loads(bench_results.results_json(cells, {"model": "m"}))
    assert saved["meta"]["model"] == "m" and len(saved["runs"]) == 4


def test_nonzero_exit_with_clean_files_is_still_refused(tmp_path: Path) -> None:
    cells = _cells(tmp_path, failing_rc=3)
    assert all(c.refused and "aiperf exited 3" in c.refused for c in cells
               if c.concurrency == 1)


def test_chart_is_valid_svg_with_both_lines_and_refusals(tmp_path: Path) -> None:
    svg = benchchart.svg_chart(_cells(tmp_path), "bench <m>")
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    lines = root.findall(f"{ns}polyline")
    assert len(lines) == 6  # 3 panels x (P/D, alone)
    assert "refused: baseline c=16" in svg and "bench &lt;m&gt;" in svg


@pytest.mark.parametrize("found", [True, False])
def test_aiperf_command_found_or_not(monkeypatch: pytest.MonkeyPatch, found: bool) -> None:
    monkeypatch.delenv("PDBOOT_AIPERF", raising=False)
    monkeypatch.setattr(bench.shutil, "which", lambda _: "/x/aiperf" if found else None)
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda _: None)
    assert bench.aiperf_command() == (["/x/aiperf"] if found else None)


INVENTORIES = Path(__file__).parent / "inventories"


def test_targets_are_the_router_and_one_decode_engine() -> None:
    from pdboot.inventory.load import load_inventory
    from pdboot.plan.build import build_plan

    plan = build_plan(load_inventory(INVENTORIES / "2p2d.yaml"))
    pd, base = bench.targets(plan)
    assert (pd.role, pd.url) == ("pd", plan.router.url)
    decodes = [s for s in plan.services() if s.role == "decode"]
    assert (base.role, base.url, base.name) == ("baseline", decodes[0].url,
                                                f"decode@{decodes[0].host}")
    assert bench.targets(plan, "http://x:1")[1] == bench.Target("baseline", "baseline",
                                                                  "http://x:1")


def test_cli_without_aiperf_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from pdboot.cli import app

    monkeypatch.setattr(bench, "aiperf_command", lambda: None)
    r = CliRunner().invoke(app, ["bench", str(INVENTORIES / "1p1d.yaml"), "--tokenizer", "/t"])
    # pdboot is not on PyPI: a hint naming `pdboot[bench]` would install someone else's package
    assert r.exit_code == 2 and f"pip install 'aiperf=={bench.AIPERF_VERSION}'" in r.output
    assert "pdboot[bench]" not in r.output


def test_one_aiperf_version_for_the_extra_setup_and_tests() -> None:
    # the captures under fixtures/aiperf-0.13.0 are that version's files: all three must agree
    import re

    from tests.conftest import AIPERF_VERSION

    root = Path(__file__).parents[2]
    extra = re.search(r'bench = \["aiperf==([\d.]+)"\]', (root / "pyproject.toml").read_text())
    setup = re.search(r"^AIPERF_VERSION=([\d.]+)$", (root / ".ci/setup").read_text(), re.M)
    assert extra and setup
    assert extra.group(1) == setup.group(1) == AIPERF_VERSION == FIX.name.split("-")[1]
    assert bench.AIPERF_VERSION == AIPERF_VERSION
