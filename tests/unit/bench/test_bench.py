"""pdboot bench: AIPerf's command line, its real output files (captured, see the fixture
README), the refusal rules, the side-by-side table and the chart."""

from __future__ import annotations

import itertools
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pdboot.bench import chart as benchchart
from pdboot.bench import goodput as gp
from pdboot.bench import results as bench_results
from pdboot.bench import run as bench
from tests.unit.paths import FIXTURES, INVENTORIES, ROOT

FIX = FIXTURES / "aiperf-0.13.0"


def _load(name: str) -> bench_results.RunResult:
    d = FIX / name
    summary = d / bench_results.SUMMARY_FILE
    return bench_results.parse_aiperf(
        summary.read_text() if summary.exists() else None,
        (d / bench_results.RECORDS_FILE).read_text(),
    )


def test_argv_is_streaming_offline_friendly_and_sized() -> None:
    t = bench.Target("pd", "router", "http://10.0.0.1:8000")
    argv = bench.aiperf_argv(
        ["aiperf"],
        t,
        "Qwen/Qwen3-0.6B",
        4,
        "/tok",
        Path("/out"),
        bench.LoadShape(isl=256, osl=64, requests_per_level=20),
    )
    assert argv[:2] == ["aiperf", "profile"]
    pairs = dict(itertools.pairwise(argv))
    assert pairs["--url"] == "http://10.0.0.1:8000" and pairs["--tokenizer"] == "/tok"
    assert pairs["--concurrency"] == "4" and pairs["--isl"] == "256" and pairs["--osl"] == "64"
    assert pairs["--request-count"] == "20" and pairs["--artifact-dir"] == "/out"
    assert "--streaming" in argv and pairs["--endpoint-type"] == "completions"
    assert pairs["--extra-inputs"] == "ignore_eos:true" and pairs["--ui"] == "none"
    # AIPerf judges every request against the goodput targets itself (ms, its display unit)
    assert pairs["--goodput"] == "time_to_first_token:2000 inter_token_latency:50"
    tight = bench.LoadShape(targets=gp.Targets(ttft_ms=350.5, itl_ms=12))
    tight_argv = bench.aiperf_argv(["aiperf"], t, "m", 1, "/tok", Path("/o"), tight)
    assert dict(itertools.pairwise(tight_argv))["--goodput"] == (
        "time_to_first_token:350.5 inter_token_latency:12"
    )
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
        src = FIX / (
            "partial-failure" if "-c16" in str(out) and "baseline" in str(out) else "pd-c4"
        )
        for f in src.iterdir():
            (out / f.name).write_text(f.read_text())
        return failing_rc, "done\n"

    targets = [
        bench.Target("pd", "router", "http://r:8000", 3),
        bench.Target("baseline", "decode alone", "http://d:8200", 1),
    ]
    return bench.run_bench(
        targets, "m", "/tok", [1, 16], tmp, bench.LoadShape(), runner, ["aiperf"]
    )


def test_run_bench_lays_out_artifacts_and_refuses_per_cell(tmp_path: Path) -> None:
    cells = _cells(tmp_path)
    assert [(c.role, c.concurrency) for c in cells] == [
        ("pd", 1),
        ("baseline", 1),
        ("pd", 16),
        ("baseline", 16),
    ]
    assert (tmp_path / "baseline-c16" / bench_results.SUMMARY_FILE).exists()
    assert [c.refused is None for c in cells] == [True, True, True, False]
    rows = bench_results.table_rows(cells)
    assert [r[:3] for r in rows] == [
        ["1", "P/D", "3"],
        ["1", "alone", "1"],
        ["16", "P/D", "3"],
        ["16", "alone", "1"],
    ]
    assert rows[3][3] == "REFUSED" and "requests failed" in (cells[3].refused or "")
    assert all(len(r) == len(bench_results.TABLE_HEADER) for r in rows)
    # per GPU: the same run's tokens/s over 3 GPUs (P/D) and over 1 (the engine alone)
    r = cells[0].result
    assert rows[0][5] == f"{r.output_tok_s:.0f}" and rows[0][6] == f"{r.output_tok_s / 3:.0f}"
    assert rows[1][6] == f"{r.output_tok_s:.0f}"
    v = gp.verdict(
        bench_results.points(cells, "pd"), bench_results.points(cells, "baseline"), gp.Targets()
    )
    saved = json.loads(bench_results.results_json(cells, {"model": "m"}, v))
    assert saved["meta"]["model"] == "m" and len(saved["runs"]) == 4
    assert saved["runs"][0]["per_gpu"]["tok_s_per_gpu"] == pytest.approx(r.output_tok_s / 3)
    assert saved["runs"][0]["result"]["goodput_req_s"] == pytest.approx(r.request_s)
    # the same files on both sides: P/D on 3 GPUs is a third of one engine per GPU
    assert saved["verdict"]["ratio"] == pytest.approx(1 / 3)
    assert saved["verdict"]["text"].startswith("P/D does not pay off here: 0.33x")


def test_nonzero_exit_with_clean_files_is_still_refused(tmp_path: Path) -> None:
    cells = _cells(tmp_path, failing_rc=3)
    assert all(c.refused and "aiperf exited 3" in c.refused for c in cells if c.concurrency == 1)


def test_chart_is_valid_svg_with_the_verdict_both_lines_and_refusals(tmp_path: Path) -> None:
    cells = _cells(tmp_path)
    v = gp.verdict(
        bench_results.points(cells, "pd"), bench_results.points(cells, "baseline"), gp.Targets()
    )
    svg = benchchart.svg_chart(cells, "bench <m>", v, gp.Targets())
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    lines = root.findall(f"{ns}polyline")
    assert len(lines) == 8  # 4 panels x (P/D, alone)
    assert "refused: baseline c=16" in svg and "bench &lt;m&gt;" in svg
    # the verdict is the first line a reader sees, in the losing colour, and the SVG's title
    first = root.findall(f"{ns}text")[0]
    assert first.text == v.text and first.get("fill") == "#b22222"
    assert root.findall(f"{ns}text")[1].text == v.detail
    assert (root.findtext(f"{ns}title") or "").startswith("P/D does not pay off here")
    assert "P/D through the router (3 GPUs)" in svg and "TTFT &lt;= 2000 ms" in svg
    # the targets are drawn dashed on the latency panels
    assert "target 2000" in svg and "target 50" in svg


@pytest.mark.parametrize("found", [True, False])
def test_aiperf_command_found_or_not(monkeypatch: pytest.MonkeyPatch, found: bool) -> None:
    monkeypatch.delenv("PDBOOT_AIPERF", raising=False)
    monkeypatch.setattr(bench.shutil, "which", lambda _: "/x/aiperf" if found else None)
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda _: None)
    assert bench.aiperf_command() == (["/x/aiperf"] if found else None)


def test_targets_are_the_router_and_one_decode_engine() -> None:
    from pdboot.inventory.load import load_inventory
    from pdboot.plan.build import build_plan

    plan = build_plan(load_inventory(INVENTORIES / "2p2d.yaml"))
    pd, base = bench.targets(plan)
    assert (pd.role, pd.url) == ("pd", plan.endpoint)  # the proxy: the router is on loopback
    decodes = [s for s in plan.services() if s.role == "decode"]
    assert (base.role, base.url, base.name) == (
        "baseline",
        decodes[0].url,
        f"decode@{decodes[0].host}",
    )
    assert bench.targets(plan, "http://x:1")[1] == bench.Target(
        "baseline", "baseline", "http://x:1", base.gpus
    )
    # per GPU: P/D counts every engine's GPUs, the baseline its one decode engine's
    assert pd.gpus == sum(gp.engine_gpus(s) for s in plan.engines)
    assert base.gpus == gp.engine_gpus(decodes[0])


def test_cli_without_aiperf_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from pdboot.cli.main import app

    monkeypatch.setattr(bench, "aiperf_command", lambda: None)
    r = CliRunner().invoke(app, ["bench", str(INVENTORIES / "1p1d.yaml"), "--tokenizer", "/t"])
    # pdboot is not on PyPI: a hint naming `pdboot[bench]` would install someone else's package
    assert r.exit_code == 2 and f"pip install 'aiperf=={bench.AIPERF_VERSION}'" in r.output
    assert "pdboot[bench]" not in r.output


def test_one_aiperf_version_for_the_extra_setup_and_tests() -> None:
    # the captures under fixtures/aiperf-0.13.0 are that version's files: all three must agree
    import re

    from tests.conftest import AIPERF_VERSION

    root = ROOT
    extra = re.search(r'bench = \["aiperf==([\d.]+)"\]', (root / "pyproject.toml").read_text())
    setup = re.search(r"^AIPERF_VERSION=([\d.]+)$", (root / ".ci/setup").read_text(), re.M)
    assert extra and setup
    assert extra.group(1) == setup.group(1) == AIPERF_VERSION == FIX.name.split("-")[1]
    assert bench.AIPERF_VERSION == AIPERF_VERSION


# Goodput, per GPU and the verdict (pdboot/bench/goodput.py). The capture's targets (TTFT 35 ms,
# ITL 2.0 ms) split its 12 requests: 2 good, 1 with ITL missed, 9 with TTFT missed.
MIXED = FIX / "goodput-mixed-c4"
MIXED_TARGETS = gp.Targets(ttft_ms=35, itl_ms=2.0)


def _mixed_records(strip_aiperf_verdicts: bool) -> str:
    lines = (MIXED / bench_results.RECORDS_FILE).read_text().splitlines()
    if not strip_aiperf_verdicts:
        return "\n".join(lines)
    recs = [json.loads(line) for line in lines]
    for r in recs:
        del r["metrics"]["good_request_count"]
    return "\n".join(json.dumps(r) for r in recs)


def test_goodput_is_aiperfs_own_from_its_real_files() -> None:
    summary = json.loads((MIXED / bench_results.SUMMARY_FILE).read_text())
    r = bench_results.parse_aiperf(
        (MIXED / bench_results.SUMMARY_FILE).read_text(), _mixed_records(False), MIXED_TARGETS
    )
    assert r.good_judged_by == "aiperf" and bench_results.refusal(r) is None
    assert r.ok_requests == 12 and r.good_requests == summary["good_request_count"]["avg"] == 2
    assert r.goodput_req_s == pytest.approx(summary["goodput"]["avg"])
    # good tokens over the window AIPerf's own throughputs use: the two good records' tokens
    window = r.ok_requests / r.request_s
    assert r.goodput_tok_s == pytest.approx((48 + 56) / window)
    assert r.goodput_req_s == pytest.approx(2 / window)


def test_pdboots_own_judgement_matches_aiperfs_per_request() -> None:
    recs = [json.loads(line) for line in _mixed_records(False).splitlines()]
    for rec in recs:
        assert gp.is_good(rec["metrics"], MIXED_TARGETS) == (
            rec["metrics"]["good_request_count"]["value"] == 1
        ), rec["metrics"]
    stripped = _mixed_records(True)
    own = gp.count_good(stripped, MIXED_TARGETS)
    assert (own.good, own.good_tokens, own.judged_by) == (2, 48 + 56, "pdboot")
    r = bench_results.parse_aiperf(
        (MIXED / bench_results.SUMMARY_FILE).read_text(), stripped, MIXED_TARGETS
    )
    summary = json.loads((MIXED / bench_results.SUMMARY_FILE).read_text())
    assert r.goodput_req_s == pytest.approx(summary["goodput"]["avg"])


@pytest.mark.parametrize(
    ("ttft", "itl", "good"),
    [
        (35, 2.0, 2),  # both targets: 2 (an "or" would give 12)
        (35, 50, 3),  # TTFT alone decides: 13.2, 15.1, 10.4 ms
        (2000, 2.0, 11),  # ITL alone decides: one request at 2.64 ms misses
        (2000, 50, 12),
        (10, 0.2, 0),  # below every request (a ">=" would count them)
    ],
)
def test_goodput_counts_requests_meeting_both_targets(ttft: float, itl: float, good: int) -> None:
    assert gp.count_good(_mixed_records(True), gp.Targets(ttft, itl)).good == good


def test_failed_and_warmup_records_are_never_good() -> None:
    failed = (FIX / "all-failed" / bench_results.RECORDS_FILE).read_text()
    assert gp.count_good(failed, gp.Targets()).good == 0
    rec = json.loads(_mixed_records(True).splitlines()[0])
    rec["metadata"]["benchmark_phase"] = "warmup"
    assert gp.count_good(json.dumps(rec), gp.Targets()).good == 0
    one_token = {"metrics": {"time_to_first_token": {"value": 5.0}}}
    assert not gp.is_good(one_token["metrics"], gp.Targets())


def test_per_gpu_divides_by_each_sides_gpus() -> None:
    r = bench_results.parse_aiperf(
        (MIXED / bench_results.SUMMARY_FILE).read_text(), _mixed_records(False), MIXED_TARGETS
    )
    pd = bench_results.Cell("pd", "router", 4, r, None, "", gpus=4).point()
    alone = bench_results.Cell("baseline", "d", 4, r, None, "", gpus=1).point()
    assert pd.goodput_per_gpu == pytest.approx(r.goodput_req_s / 4)
    assert pd.tok_s_per_gpu == pytest.approx(r.output_tok_s / 4)
    assert pd.good_tok_s_per_gpu == pytest.approx(r.goodput_tok_s / 4)
    assert alone.goodput_per_gpu == pytest.approx(r.goodput_req_s)


def test_gpus_per_side_from_the_plan() -> None:
    from pdboot.inventory.load import load_inventory
    from pdboot.plan.build import build_plan
    from pdboot.plan.model import Plan

    def plan(name: str) -> Plan:
        return build_plan(load_inventory(INVENTORIES / f"{name}.yaml"))

    # 2 prefills on GPUs [0, 1], 2 decodes with `gpus: all` at tensor parallel 4
    assert (gp.pd_gpus(plan("2p2d")), gp.baseline_gpus(plan("2p2d"))) == (2 * 2 + 2 * 4, 4)
    # a data-parallel decode head serves its follower's ranks too: 2 + 2 GPUs behind its URL
    assert (gp.pd_gpus(plan("dp")), gp.baseline_gpus(plan("dp"))) == (6, 4)
    # device: cpu: an engine counts as one
    assert (gp.pd_gpus(plan("cpu-1p1d")), gp.baseline_gpus(plan("cpu-1p1d"))) == (2, 1)


def _pt(c: int, goodput: float, tok: float = 100.0) -> gp.Point:
    return gp.Point(c, goodput, goodput * 16, tok)


def test_verdict_both_ways_and_undecided() -> None:
    t = gp.Targets()
    win = gp.verdict([_pt(4, 2.0), _pt(16, 7.0)], [_pt(4, 5.0), _pt(16, 3.0)], t)
    assert win.ratio == pytest.approx(1.4)
    assert win.text.startswith(
        "P/D: 1.40x the goodput per GPU of the same GPUs as independent engines"
    )
    assert win.pd == _pt(16, 7.0) and win.baseline == _pt(4, 5.0)
    assert win.detail == (
        "P/D 7 good req/s per GPU at c=16, independent 5 good req/s per GPU "
        "at c=4; TTFT <= 2000 ms, ITL <= 50 ms"
    )
    assert win.line == f"{win.text} ({win.detail})"
    lose = gp.verdict([_pt(4, 2.0)], [_pt(4, 2.5)], t)
    assert lose.text.startswith("P/D does not pay off here: 0.80x") and lose.ratio == 0.8
    # a P/D that loses at its best but beats the baseline's worst level still loses
    assert gp.verdict([_pt(4, 2.0)], [_pt(1, 1.0), _pt(4, 2.5)], t).ratio == 0.8
    assert gp.verdict([_pt(4, 2.0)], [_pt(4, 2.05)], t).text.startswith("P/D and independent")
    none_good = gp.verdict([_pt(4, 0.0)], [_pt(4, 0.0)], t)
    assert none_good.ratio is None and "no request met the targets" in none_good.text
    assert none_good.detail == "TTFT <= 2000 ms, ITL <= 50 ms"
    only_pd = gp.verdict([_pt(4, 1.0)], [_pt(4, 0.0)], t)
    assert only_pd.text.startswith("P/D wins") and only_pd.ratio is None
    assert gp.verdict([_pt(4, 1.0)], [], t).text.startswith("no verdict")
    assert benchchart.verdict_color(win) != benchchart.verdict_color(lose)


def test_several_baseline_urls_are_independent_engines_whose_figures_add_up(tmp_path: Path) -> None:
    """`--baseline-url A,B`: each engine measured alone at its share of the level (a load
    balancer's split), the figures summed, the latencies the worst engine's, per GPU over
    both engines' GPUs; one engine's failures refuse the pair."""
    from pdboot.inventory.load import load_inventory
    from pdboot.plan.build import build_plan

    plan = build_plan(load_inventory(INVENTORIES / "2p2d.yaml"))
    tgts = bench.targets(plan, "http://a:1, http://b:2")
    assert [(t.role, t.name, t.url, t.gpus) for t in tgts[1:]] == [
        ("baseline", "baseline1", "http://a:1", 4),
        ("baseline", "baseline2", "http://b:2", 4),
    ]
    assert bench.shares(5, 2) == [3, 2] and bench.shares(1, 2) == [1, 0]
    seen: list[tuple[str, str]] = []

    def runner(argv: list[str]) -> tuple[int, str]:
        out = Path(argv[argv.index("--artifact-dir") + 1])
        seen.append((argv[argv.index("--url") + 1], argv[argv.index("--concurrency") + 1]))
        src = FIX / ("partial-failure" if "c8" in str(out) and "engine2" in str(out) else "pd-c4")
        for f in src.iterdir():
            (out / f.name).write_text(f.read_text())
        return 0, ""

    cells = bench.run_bench(
        tgts[1:], "m", "/tok", [1, 4, 8], tmp_path, bench.LoadShape(), runner, ["aiperf"]
    )
    assert seen == [
        ("http://a:1", "1"),
        ("http://a:1", "2"),
        ("http://b:2", "2"),
        ("http://a:1", "4"),
        ("http://b:2", "4"),
    ]
    assert [(c.role, c.concurrency, c.gpus) for c in cells] == [
        ("baseline", 1, 8),
        ("baseline", 4, 8),
        ("baseline", 8, 8),
    ]
    one = _load("pd-c4")
    both = cells[1]
    assert (tmp_path / "baseline-c4" / "engine2" / bench_results.SUMMARY_FILE).exists()
    assert both.refused is None and both.target == "baseline1+baseline2"
    assert both.result.ok_requests == 2 * one.ok_requests
    assert both.result.output_tok_s == pytest.approx(2 * one.output_tok_s)
    assert both.result.goodput_req_s == pytest.approx(2 * one.goodput_req_s)
    assert both.result.ttft_ms == one.ttft_ms  # the worst of two equal engines
    # two engines on 8 GPUs: the rate of one engine on 4 per GPU
    assert both.point().goodput_per_gpu == pytest.approx(one.goodput_req_s / 4)
    # at level 1 one engine got the only request; the idle one's GPUs still count
    assert cells[0].point().tok_s_per_gpu == pytest.approx(one.output_tok_s / 8)
    assert cells[2].refused and cells[2].refused.startswith("baseline2: 4 of 8 requests failed")


def test_requests_the_proxy_limited_are_counted_and_named() -> None:
    """429 is the proxy limiter's status (plan/proxy.py): counted apart, said in the refusal;
    a healthy run limits none."""
    assert _load("pd-c4").limited_requests == 0
    s = json.loads((FIX / "pd-c4" / bench_results.SUMMARY_FILE).read_text())
    s["error_request_count"] = {"avg": 3.0}
    s["error_summary"] = [
        {"count": 2, "error_details": {"code": 429, "message": "Too Many Requests"}},
        {"count": 1, "error_details": {"code": 500, "message": "boom"}},
    ]
    r = bench_results.parse_aiperf(json.dumps(s), None)
    assert (r.failed_requests, r.limited_requests) == (3, 2)
    why = bench_results.refusal(r)
    assert why is not None and "2 limited by the proxy: 429" in why
    assert "router.proxy_limits" in why
    records = '{"error": {"code": 429, "type": "HTTP", "message": "Too Many Requests"}}\n{}\n'
    r = bench_results.parse_aiperf(None, records)
    assert (r.ok_requests, r.failed_requests, r.limited_requests) == (1, 1, 1)
