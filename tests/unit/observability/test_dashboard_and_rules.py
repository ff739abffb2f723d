"""The shipped Grafana dashboard and Prometheus alert rules load in their real tools, and every
metric name they use is one that vLLM 0.33 (metrics.json, the copy of ../shared's), vllm-router
0.1.17 (its /metrics, captured), NIXL 1.5.1's exporter (a live scrape of the wheel in the vLLM
CPU image, fixtures/nixl-1.5.1-telemetry/), `pdboot watch` (WATCH_METRICS, what its exposition
writes) or Prometheus itself (`up`, one per target) exports.

promtool (Debian's `prometheus` package, installed by .ci/setup) checks and unit-tests the rules.
Grafana publishes no JSON Schema for dashboards in a registry package; the dashboard is decoded
with Grafana's own typed models (grafana-foundation-sdk, PyPI) and must round-trip unchanged:
a misspelt or unknown key is dropped on the way and fails the test. That is a structural check
by Grafana's types, not a schema validation.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdboot.plan.watch.metrics import WATCH_METRICS
from pdboot.verify.exposition import parse_exposition
from tests.shared_data import METRICS_JSON
from tests.unit.paths import FIXTURES, ROOT

RULES = ROOT / "pdboot/observability/prometheus/pdboot-watch-rules.yml"
RULES_TEST = ROOT / "pdboot/observability/prometheus/pdboot-watch-rules.test.yml"
DASHBOARD = ROOT / "pdboot/observability/grafana/pdboot-watch.json"
VLLM_METRICS = METRICS_JSON
ROUTER_METRICS = ROOT / "tests/unit/fixtures/vllm-router-0.1.17/metrics.txt"
NIXL_METRICS = FIXTURES / "nixl-1.5.1-telemetry" / "prometheus_mp-two-ranks.txt"
PROMETHEUS_OWN = {"up"}  # the series Prometheus writes for each target it scrapes

_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, label names, ranges
    and strings taken out first)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    e = re.sub(r"\boffset\s+\S+", " ", e)
    for m in re.finditer(r"(?<![A-Za-z0-9_:.])[A-Za-z_:][A-Za-z0-9_:]*", e):
        rest = e[m.end() :].lstrip()
        if m.group(0) in _KEYWORDS or rest.startswith("("):
            continue
        names.add(m.group(0))
    return names


def known_names() -> set[str]:
    vllm = json.loads(VLLM_METRICS.read_text())["metrics"]
    names = {n for m in vllm for n in m["exposed_as"]}
    router = parse_exposition(ROUTER_METRICS.read_text())
    names |= {s.name for s in router}
    names |= {s.name for s in parse_exposition(NIXL_METRICS.read_text())}
    names |= {name for name, *_ in WATCH_METRICS}
    return names | PROMETHEUS_OWN


def rule_exprs() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def dashboard_exprs(d: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in d["panels"] for t in p.get("targets", [])]


def test_the_name_extractor_sees_names_not_functions_or_labels() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, instance) (rate(vllm:x_bucket{role="decode",'
        'source="a b"}[5m]))) > 0.5 * sum by (instance) (up_total offset 5m)'
    )
    assert metric_names(expr) == {"vllm:x_bucket", "up_total"}
    assert metric_names("time() - pdboot_watch_last_round_timestamp_seconds > 300") == {
        "pdboot_watch_last_round_timestamp_seconds"
    }


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:  # a failure, not a skip: .ci/setup installs it
        pytest.fail("promtool not found: install Debian's prometheus package (.ci/setup)")
    return path


def test_promtool_checks_the_alert_rules() -> None:
    res = subprocess.run(
        [_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_promtool_unit_tests_of_the_alert_rules_pass() -> None:
    res = subprocess.run(
        [_promtool(), "test", "rules", RULES_TEST.name],
        cwd=RULES_TEST.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_metric_in_the_rules_is_really_exported() -> None:
    used = {n for e in rule_exprs() for n in metric_names(e)}
    assert used - known_names() == set()
    # the rules cover the failures watch exists for, under their real names
    assert {
        "pdboot_watch_canary_ok",
        "vllm:nixl_num_failed_transfers_total",
        "vllm:nixl_num_kv_expired_reqs_total",
        "vllm:prompt_tokens_by_source_total",
        "agent_errors_total",  # NIXL's own, beside vLLM's counter of failed transfers
    } <= used


def test_every_metric_on_the_dashboard_is_really_exported() -> None:
    d = json.loads(DASHBOARD.read_text())
    used = {n for e in dashboard_exprs(d) for n in metric_names(e)}
    assert used - known_names() == set()
    watch_names = {name for name, *_ in WATCH_METRICS}
    assert (
        watch_names - {"pdboot_watch_rounds_total", "pdboot_watch_last_round_timestamp_seconds"}
        <= used
    )  # every per-pair / per-engine watch metric has a panel


def test_the_dashboard_round_trips_through_grafanas_own_models() -> None:
    from grafana_foundation_sdk.cog import plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard

    plugins.register_default_plugins()
    original = json.loads(DASHBOARD.read_text())
    model = Dashboard.from_json(original)
    back = json.loads(json.dumps(model.to_json(), default=lambda o: o.to_json()))
    assert _lost(original, back) == []
    kinds = {p["type"] for p in original["panels"]}
    assert kinds <= {"row", "timeseries", "state-timeline", "stat"}
    ids = [p["id"] for p in original["panels"]]
    assert len(ids) == len(set(ids))


def test_a_misspelt_dashboard_key_is_caught_by_the_round_trip() -> None:
    from grafana_foundation_sdk.cog import plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard

    plugins.register_default_plugins()
    bad = json.loads(DASHBOARD.read_text())
    bad["panels"][1]["targets"][0]["exprr"] = bad["panels"][1]["targets"][0].pop("expr")
    back = json.loads(json.dumps(Dashboard.from_json(bad).to_json(), default=lambda o: o.to_json()))
    assert "/panels[1]/targets[0]/exprr" in _lost(bad, back)


def _lost(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths of `a` that `b` dropped or changed."""
    if isinstance(a, dict):
        if not isinstance(b, dict):
            return [path]
        out = [f"{path}/{k}" for k in a if k not in b]
        return out + [p for k in a if k in b for p in _lost(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, list):
        if not isinstance(b, list) or len(a) != len(b):
            return [path]
        return [
            p
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for p in _lost(x, y, f"{path}[{i}]")
        ]
    return [] if a == b else [path]


EXAMPLES = [*sorted((ROOT / "examples").glob("*.yaml")), ROOT / "inventory.example.yaml"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_scrape_config_of_every_example_passes_promtool(path: Path, tmp_path: Path) -> None:
    """`pdboot observability --out DIR` writes a prometheus.yml that promtool accepts with the
    shipped rules beside it, and it scrapes every engine that serves HTTP and the router."""
    from typer.testing import CliRunner

    from pdboot.cli.main import app
    from pdboot.inventory.load import load_inventory
    from pdboot.plan.build import build_plan

    res = CliRunner().invoke(app, ["observability", str(path), "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    check = subprocess.run(
        [_promtool(), "check", "config", "prometheus.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "1 rules found" not in check.stdout and "rules found" in check.stdout
    doc = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
    targets = {
        (g["labels"]["service"], t)
        for job in doc["scrape_configs"]
        for g in job["static_configs"]
        for t in g["targets"]
    }
    plan = build_plan(load_inventory(path))
    for s in plan.engines:
        assert ((s.key, f"{s.address}:{s.port}") in targets) is (not s.headless), s.key
    r = plan.router  # behind the proxy the router serves on loopback, its metrics on the host
    assert (r.key, f"{(plan.proxy or r).address}:{r.metrics_port}") in targets
    sb = plan.standby_router  # router.standby: scraped beside the router host's
    if sb is not None:
        assert (sb.key, f"{sb.metrics_address}:{sb.metrics_port}") in targets
    assert json.loads((tmp_path / "grafana" / "pdboot-watch.json").read_text()) == json.loads(
        DASHBOARD.read_text()
    )


def test_the_dashboard_and_rules_are_in_the_installed_package(tmp_path: Path) -> None:
    """A wheel built from this checkout carries them (an operator without the repo has them)."""
    import sys
    import zipfile

    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    (wheel,) = tmp_path.glob("pdboot-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for rel in (RULES, DASHBOARD):
        assert rel.relative_to(ROOT).as_posix() in names


def test_the_scrape_config_scrapes_the_standby_router_on_its_own_address() -> None:
    from pdboot.inventory.load import load_inventory
    from pdboot.plan.build import build_plan
    from pdboot.plan.prometheus import scrape_config

    plan = build_plan(load_inventory(Path(__file__).parents[1] / "inventories" / "standby.yaml"))
    sb = plan.standby_router
    assert sb is not None and sb.metrics_port is not None
    job = next(
        j for j in scrape_config(plan)["scrape_configs"] if j["job_name"].endswith("-router")
    )
    got = {
        (g["labels"]["service"], g["labels"]["host"], g["targets"][0])
        for g in job["static_configs"]
    }
    assert (sb.key, sb.host, f"{sb.metrics_address}:{sb.metrics_port}") in got
    assert sb.host != plan.router.host and len(got) == 2
