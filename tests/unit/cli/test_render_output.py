"""`pdboot render`: what a terminal gets parses to the same documents as what a pipe gets
(`docker compose config`'s way: colour, host titles as YAML comments, `---` between hosts,
never wrapped), the summary on stderr; `--out` refuses, or with --clean empties, the folder
of a host the deployment no longer has."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from pdboot.cli import console as cli_console
from tests.unit.cli.test_cli import GOLDEN, ONE, run

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.mark.parametrize("width", [80, 120])
def test_a_terminal_gets_the_piped_documents_unwrapped(
    monkeypatch: pytest.MonkeyPatch, width: int
) -> None:
    code, piped, piped_err = run("render", ONE)
    assert code == 0
    buf = io.StringIO()
    terminal = Console(file=buf, force_terminal=True, width=width, color_system="truecolor")
    monkeypatch.setattr(cli_console, "out", terminal)
    code, _, err = run("render", ONE)
    assert code == 0
    shown = buf.getvalue()
    assert "\x1b[" in shown  # highlighted
    pasted = ANSI.sub("", shown)
    assert list(yaml.safe_load_all(pasted)) == list(yaml.safe_load_all(piped))
    # every line as rendered, none split: the kv-transfer-config JSON is longer than the width
    lines = set(pasted.splitlines())
    for name in ("gpu-b", "gpu-a"):
        golden = (GOLDEN / name / "compose.yaml").read_text().splitlines()
        assert max(map(len, golden)) > width
        assert set(golden) <= lines
    assert pasted.startswith("# gpu-b/compose.yaml\n")
    assert "\n---\n# gpu-a/compose.yaml\n" in pasted
    # the summary is not a document: stderr, on a terminal and in a pipe alike
    summary = "Deployment 'demo': model"
    assert summary not in pasted and summary in err
    assert summary in piped_err and summary not in piped


def _fake_old_host(out: Path, name: str) -> Path:
    old = out / name
    old.mkdir(parents=True)
    (old / "compose.yaml").write_text("name: old\n")
    (old / "proxy-nginx.conf").write_text("events {}\n")
    return old


def test_render_out_refuses_a_folder_with_a_host_the_deployment_no_longer_has(
    tmp_path: Path,
) -> None:
    old = _fake_old_host(tmp_path, "gpu-old")
    code, out, err = run("render", ONE, "--out", str(tmp_path))
    assert code == 2 and out == ""
    assert "gpu-old" in err and "--clean" in err
    assert (old / "compose.yaml").read_text() == "name: old\n"
    assert not (tmp_path / "gpu-a").exists()


def test_render_out_clean_removes_only_what_render_wrote(tmp_path: Path) -> None:
    gone = _fake_old_host(tmp_path, "gpu-old")
    kept = _fake_old_host(tmp_path, "gpu-older")
    (kept / "notes.txt").write_text("mine\n")
    (tmp_path / "unrelated").mkdir()  # no compose.yaml: not a host's project
    code, out, err = run("render", ONE, "--out", str(tmp_path), "--clean")
    assert code == 0, err
    assert not gone.exists()
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]
    assert f"kept {kept}" in err
    assert f"removed {gone}/" in out
    assert (tmp_path / "unrelated").is_dir()
    assert (tmp_path / "gpu-b" / "compose.yaml").read_text() == (
        GOLDEN / "gpu-b" / "compose.yaml"
    ).read_text()


def test_render_out_with_host_keeps_the_deployments_other_hosts(tmp_path: Path) -> None:
    code, _, _ = run("render", ONE, "--out", str(tmp_path))
    assert code == 0
    code, _, err = run("render", ONE, "--out", str(tmp_path), "--host", "gpu-a")
    assert code == 0, err
    assert (tmp_path / "gpu-b" / "compose.yaml").is_file()
