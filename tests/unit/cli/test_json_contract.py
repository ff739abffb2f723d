"""The JSON contract, as terraform's machine-readable output has one: a ``format_version`` on
every JSON document and event line; one diagnostic shape (severity, summary, detail, file,
line) whether `down` could not reach a host, `stage` failed or the inventory is wrong; under
--json a refusal is JSON on stdout too; `done` always has a summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pdboot import events as ev
from pdboot.diagnostics import FORMAT_VERSION
from pdboot.preflight.checks import CheckResult
from pdboot.preflight.run import HostReport, PreflightResult
from pdboot.views import preflight as preflight_view
from pdboot.views.jsonl import to_json
from pdboot.views.status import status_json
from tests.unit.cli.test_cli import ONE, run

SHAPE = {"severity", "summary", "detail", "file", "line"}


def _bad(tmp_path: Path) -> str:
    """ONE with one problem: an unknown key on line 2."""
    first, rest = Path(ONE).read_text().split("\n", 1)
    path = tmp_path / "bad.yaml"
    path.write_text(f"{first}\nmodle: x\n{rest}")
    return str(path)


def test_every_document_and_event_line_has_the_format_version() -> None:
    code, out, _ = run("render", ONE, "--json")
    assert code == 0 and json.loads(out)["format_version"] == FORMAT_VERSION
    status = json.loads(status_json(ev.StatusReport("demo", "http://e", True, ())))
    assert status["format_version"] == FORMAT_VERSION
    down = HostReport("gpu-x", False, [CheckResult("ssh.connect", "fail", "timeout", "fix")])
    doc = json.loads(preflight_view.to_json(PreflightResult({"gpu-x": down})))
    assert doc["format_version"] == FORMAT_VERSION and set(doc) >= {"ok", "hosts"}
    for event in (ev.ServiceReady("router@r", 1.0), ev.Done("up", 0, 1.0, "deployed in 1.0s")):
        assert json.loads(to_json(event))["format_version"] == FORMAT_VERSION


def test_down_and_stage_failures_come_in_one_shape() -> None:
    # as down reports an unreachable host, and stage a failed step
    down = json.loads(to_json(ev.HostErrors("cannot reach", (("gpu-b", "timed out"),))))
    stage = json.loads(to_json(ev.Note("error: weights: no space left on gpu-a", "error")))
    failed = json.loads(
        to_json(ev.Failure("decode@gpu-b", "exited (1)", True, ("a", "b"), ("cause", "fix")))
    )
    for doc in (down, stage, failed):
        (d,) = doc["diagnostics"]
        assert set(d) == SHAPE and d["severity"] == "error" and d["summary"]
    assert down["diagnostics"][0]["summary"] == "cannot reach gpu-b"
    assert down["diagnostics"][0]["detail"] == "timed out"
    assert stage["diagnostics"][0]["summary"] == "weights: no space left on gpu-a"
    assert failed["diagnostics"][0]["detail"] == "cause\nfix"
    warned = json.loads(to_json(ev.Note("warning: slow disk", "warn")))
    assert warned["diagnostics"][0]["severity"] == "warning"
    assert "diagnostics" not in json.loads(to_json(ev.Note("all fine")))


def _inventory_diagnostic(d: dict[str, Any], path: str) -> None:
    assert set(d) == SHAPE
    assert d["severity"] == "error" and d["file"] == path and d["line"] == 2
    assert d["summary"].startswith("modle: unknown key 'modle'")


@pytest.mark.parametrize("cmd", ["render", "status", "preflight"])
def test_a_document_command_answers_a_bad_inventory_in_json(tmp_path: Path, cmd: str) -> None:
    path = _bad(tmp_path)
    code, out, err = run(cmd, path, "--json")
    assert code == 2
    doc = json.loads(out)
    assert doc["format_version"] == FORMAT_VERSION and doc["ok"] is False
    (d,) = doc["diagnostics"]
    _inventory_diagnostic(d, path)
    assert f"{path}:2: modle: unknown key" in err  # the words stay on stderr


@pytest.mark.parametrize("cmd", ["up", "down", "stage"])
def test_an_event_command_answers_a_bad_inventory_with_its_done_line(
    tmp_path: Path, cmd: str
) -> None:
    path = _bad(tmp_path)
    code, out, _ = run(cmd, path, "--json")
    assert code == 2
    (line,) = out.splitlines()
    done = json.loads(line)
    assert done["format_version"] == FORMAT_VERSION
    assert (done["event"], done["command"], done["exit_code"]) == ("done", cmd, 2)
    assert done["summary"] == "1 problem; nothing was done"
    (d,) = done["diagnostics"]
    _inventory_diagnostic(d, path)


def test_without_json_a_refusal_prints_nothing_on_stdout(tmp_path: Path) -> None:
    code, out, err = run("up", _bad(tmp_path))
    assert code == 2 and out == "" and "unknown key" in err


def test_the_example_address_refusal_is_located_unwrapped_and_json(tmp_path: Path) -> None:
    """ONE's hosts are at documentation addresses (192.0.2.x)."""
    lines = Path(ONE).read_text().splitlines()
    at = {ln.split()[-1]: i + 1 for i, ln in enumerate(lines) if "address:" in ln}
    code, out, err = run("down", ONE, "--json")
    assert code == 2
    for addr, line in at.items():
        said = [ln for ln in err.splitlines() if addr in ln]
        assert len(said) == 1 and said[0].startswith(f"{ONE}:{line}: hosts."), err
        assert said[0].endswith("put the host's own address there")  # one line, not wrapped
    (d1, d2) = json.loads(out)["diagnostics"]
    assert {(d1["file"], d1["line"]), (d2["file"], d2["line"])} == {(ONE, n) for n in at.values()}
    # render only notes it, at the same place
    code, _, err = run("render", ONE)
    assert code == 0 and f"note: {ONE}:{at['192.0.2.10']}: hosts.gpu-a.address" in err


def test_render_json_refuses_an_unknown_host_in_json() -> None:
    code, out, err = run("render", ONE, "--host", "gpu-z", "--json")
    assert code == 2 and "gpu-z" in err
    (d,) = json.loads(out)["diagnostics"]
    assert "gpu-z" in d["summary"] and "gpu-a" in d["summary"]


def test_a_usage_refusal_of_up_is_json_under_json() -> None:
    code, out, err = run("up", ONE, "--detailed-exitcode", "--json")
    assert code == 2 and "goes with --plan" in err
    done = json.loads(out)
    assert done["event"] == "done" and done["diagnostics"][0]["summary"].startswith("--detailed")
    code, out, _ = run("up", ONE, "--dry-run")
    assert code == 2 and out == ""
