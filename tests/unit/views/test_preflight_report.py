"""`pdboot preflight`'s report: failures and warnings plus a "N passed" line by default,
every check with -v; one failure per cause; hosts in inventory order; the JSON's added keys
(version, timestamp, counts, facts) next to the ones other tools read."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import datetime, timezone

from rich.console import Console

from pdboot import __version__
from pdboot.inventory.load import load_inventory
from pdboot.preflight import run as pf
from pdboot.preflight.cascade import collapse, skipped_because
from pdboot.preflight.checks import CheckResult, HostContext, Section
from pdboot.preflight.run import DOMAINS, HostReport, PreflightResult, evaluate_host
from pdboot.transport.connection import CommandResult, Connection
from pdboot.views import preflight as report
from tests.unit.paths import INVENTORIES
from tests.unit.preflight.test_checks import batch, ctx

INVENTORY = INVENTORIES / "1p1d.yaml"

CHECKS = [
    CheckResult("ssh.connect", "pass", "connected"),
    CheckResult("gpu.driver", "pass", "driver 580.95.05"),
    CheckResult("host.ports", "pass", "ports free"),
    CheckResult("host.disk_docker", "fail", "3.0 GiB free", "free space on /"),
    CheckResult("docker.image_cuda", "skip", "driver unknown"),
]


def _text(res: PreflightResult, verbose: bool = False) -> str:
    console = Console(record=True, width=200, color_system=None)
    report.print_report(res, console, verbose=verbose)
    return console.export_text()


def test_default_report_shows_the_failure_and_one_passed_line() -> None:
    text = _text(PreflightResult({"gpu-a": HostReport("gpu-a", True, CHECKS)}))
    assert "host.disk_docker" in text and "fix: free space on /" in text
    assert "3 passed, 1 skipped (-v shows every check)" in text
    for quiet in ("gpu.driver", "host.ports", "ssh.connect", "docker.image_cuda"):
        assert quiet not in text
    assert text.splitlines()[-1].startswith("FAIL: 1 failure on gpu-a")


def test_verbose_report_shows_every_check() -> None:
    text = _text(PreflightResult({"gpu-a": HostReport("gpu-a", True, CHECKS)}), verbose=True)
    for c in CHECKS:
        assert c.id in text
    assert "passed (-v" not in text


def test_cli_has_verbose() -> None:
    from typer.testing import CliRunner

    from pdboot.cli.main import app

    out = CliRunner().invoke(app, ["preflight", "--help"], env={"COLUMNS": "200"}).output
    assert "--verbose" in out and "-v" in out


def _no_nvidia_smi(c: HostContext) -> str:
    """The derived no-driver host (bash's own "command not found"), with every nvidia-smi
    command of the batch -- topo -m and the PCI ids too -- answering the same way."""
    extra = {
        cmd.line: Section("bash: line 1: nvidia-smi: command not found\n", 127)
        for _, d in DOMAINS
        for cmd in d.commands(c)
        if cmd.line.startswith("nvidia-smi")
    }
    return batch(c, "no-driver.txt", extra=extra)


def test_no_nvidia_smi_is_one_failure_and_its_dependents_say_why_they_skipped() -> None:
    c = ctx()
    results, _ = evaluate_host(c, _no_nvidia_smi(c))
    bad = {r.id: r.status for r in results if r.status in ("fail", "warn")}
    assert bad == {"gpu.nvidia_smi": "fail"}
    # without the collapse the topology matrix warned "no matrix" on its own
    assert skipped_because(results, "gpu.nvidia_smi") == ["gpu.topology"]
    by = {r.id: r for r in results}
    assert by["docker.image_cuda"].status == "skip"  # it already said why ("driver unknown")
    text = _text(PreflightResult({"gpu-b": HostReport("gpu-b", True, results)}))
    assert text.count("FAIL") == 2  # the check's row and the verdict
    assert "so not judged: " in text and "gpu.topology" in text


def test_collapse_never_hides_a_worse_result_or_a_pass() -> None:
    rs = [
        CheckResult("rdma.devices", "warn", "no devices"),
        CheckResult("rdma.ports", "fail", "required device missing"),
        CheckResult("rdma.link", "warn", "down"),
        CheckResult("rdma.ucx_devices", "pass", "ok"),
        CheckResult("gpu.count", "fail", "1 GPU, 2 needed"),  # its root passed or is absent
    ]
    got = {r.id: r.status for r in collapse(rs)}
    assert got == {
        "rdma.devices": "warn",
        "rdma.ports": "fail",
        "rdma.link": "skip",
        "rdma.ucx_devices": "pass",
        "gpu.count": "fail",
    }


class _Host:
    """Answers the batch with the healthy capture, after ``delay`` seconds."""

    def __init__(self, c: HostContext, delay: float) -> None:
        self.ctx, self.delay = c, delay

    def run(
        self, cmd: Sequence[str] | str, timeout: float | None = None, stdin: str | None = None
    ) -> CommandResult:
        time.sleep(self.delay)
        return CommandResult(0, batch(self.ctx), "", 0.01)

    def put_text(self, path: str, text: str, mode: int = 0o644) -> None:
        raise AssertionError("preflight writes nothing on a host")

    def close(self) -> None:
        pass


def test_hosts_are_reported_in_inventory_order_not_finishing_order() -> None:
    inv = load_inventory(INVENTORY)
    ctxs = pf.contexts(inv)
    assert list(ctxs) == ["gpu-b", "gpu-a"]  # the contexts: decode first
    # gpu-a, first in the inventory, answers last
    hosts: dict[str, Connection] = {
        n: _Host(c, 0.5 if n == "gpu-a" else 0.0) for n, c in ctxs.items()
    }
    sel = pf.Selection.of(only=["gpu", "rdma", "topo"])
    result = pf.run_preflight(inv, selection=sel, connections=hosts)
    assert list(result.hosts) == list(inv.hosts) == ["gpu-a", "gpu-b"]
    assert list(json.loads(report.to_json(result))["hosts"]) == ["gpu-a", "gpu-b"]


def test_json_adds_version_timestamp_counts_and_facts_and_keeps_the_old_keys() -> None:
    c = ctx()
    results, facts = evaluate_host(c, _no_nvidia_smi(c))
    down = HostReport("gpu-x", False, [CheckResult("ssh.connect", "fail", "timeout", "fix")])
    res = PreflightResult({"gpu-b": HostReport("gpu-b", True, results, facts), "gpu-x": down})
    at = datetime(2026, 12, 4, 22, 30, 5, tzinfo=timezone.utc)
    doc = json.loads(report.to_json(res, now=at))
    assert doc["version"] == __version__
    assert doc["timestamp"] == "2026-12-04T22:30:05Z"
    assert doc["ok"] is False
    n = {s: sum(r.status == s for r in results) for s in ("pass", "warn", "fail", "skip")}
    n["fail"] += 1  # gpu-x's ssh.connect
    assert doc["counts"] == n
    b = doc["hosts"]["gpu-b"]
    assert b["reachable"] is True
    assert b["checks"] == [r.as_dict() for r in results]
    assert set(b["checks"][0]) == {"id", "status", "message", "fix"}
    # the facts are the parsers' typed values: no GPU parsed, the docker info read
    assert b["facts"]["gpu"]["gpus"] == []
    assert b["facts"]["docker"]["info"]["server_version"] == "28.2.2"
    assert "query" not in b["facts"]["gpu"]  # raw command text is not a fact
    assert doc["hosts"]["gpu-x"]["reachable"] is False
    assert all(v is None for v in doc["hosts"]["gpu-x"]["facts"].values())


def test_sizes_are_in_one_unit_gib() -> None:
    import re

    c = ctx()
    texts = []
    for variants in ([], ["low-disk.txt"], ["gpu-busy.txt"]):
        results, _ = evaluate_host(c, batch(c, *variants))
        texts += [f"{r.message} {r.fix}" for r in results]
    joined = "\n".join(texts)
    assert re.findall(r"\d (?:[KMGT]B)\b", joined) == []  # no decimal units
    assert "GiB" in joined
    low = [t for t in texts if "requirements.min_free_disk_gb" in t]
    assert low and all(re.search(r"needs \d+\.\d GiB", t) for t in low), low


def test_a_root_left_out_by_only_does_not_collapse_what_was_asked_for() -> None:
    c = ctx()
    results, _ = evaluate_host(c, _no_nvidia_smi(c), pf.Selection.of(only=["gpu.topology"]))
    assert [(r.id, r.status) for r in results] == [("gpu.topology", "warn")]
