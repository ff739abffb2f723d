"""The command line through typer's CliRunner: exit codes, output, never a traceback."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pdboot import __version__
from pdboot.cli.main import app
from tests.unit.paths import UNIT, python_in_root

HERE = UNIT
ROOT = HERE.parents[1]
ONE = str(HERE / "inventories" / "1p1d.yaml")
GOLDEN = HERE / "golden" / "1p1d"

runner = CliRunner()


def run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    # an uncaught exception would surface here instead of as output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result.exit_code, result.stdout, result.stderr


def test_version_and_help() -> None:
    code, out, _ = run("--version")
    assert code == 0 and out.strip() == f"pdboot {__version__}"
    code, out, _ = run("--help")
    assert code == 0
    for cmd in ("render", "preflight", "up", "down", "status", "logs"):
        assert cmd in out
    assert "--install-completion" in out


@pytest.mark.parametrize("cmd", ["render", "preflight", "up", "down", "status", "logs"])
def test_every_command_has_help(cmd: str) -> None:
    code, out, _ = run(cmd, "--help")
    assert code == 0 and "INVENTORY" in out


def test_render_prints_every_host_plainly_when_piped() -> None:
    code, out, err = run("render", ONE)
    assert code == 0, err
    docs = list(yaml.safe_load_all(out))
    assert [d["name"] for d in docs] == ["pdboot-demo", "pdboot-demo"]
    assert "\x1b[" not in out  # no colour codes when not a terminal
    expected = (
        (GOLDEN / "gpu-b" / "compose.yaml").read_text()
        + "---\n"
        + (GOLDEN / "gpu-a" / "compose.yaml").read_text()
    )
    assert out == expected


def test_render_one_host() -> None:
    code, out, _ = run("render", ONE, "--host", "gpu-b")
    assert code == 0
    assert out == (GOLDEN / "gpu-b" / "compose.yaml").read_text()


def test_render_unknown_host_is_usage_error() -> None:
    code, out, err = run("render", ONE, "--host", "gpu-z")
    assert code == 2 and out == ""
    assert "gpu-z" in err and "gpu-a" in err


def test_render_out_writes_one_project_per_host_and_a_summary(tmp_path: Path) -> None:
    code, out, _ = run("render", ONE, "--out", str(tmp_path / "out"))
    assert code == 0
    written = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*.*"))
    assert written == [
        "gpu-a/compose.yaml",
        "gpu-a/proxy-nginx.conf",
        "gpu-b/compose.yaml",
        "summary.txt",
    ]
    for rel in written:
        assert (tmp_path / "out" / rel).read_text() == (GOLDEN / rel).read_text()
    assert "Start order" in out and "decode@gpu-b" in out
    assert "http://192.0.2.10:8000/v1" in out


def test_render_out_with_host(tmp_path: Path) -> None:
    code, _, _ = run("render", ONE, "--out", str(tmp_path), "--host", "gpu-a")
    assert code == 0
    assert (tmp_path / "gpu-a" / "compose.yaml").exists()
    assert not (tmp_path / "gpu-b").exists()


def test_render_out_unwritable(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run("render", ONE, "--out", str(blocker))
    assert code == 1 and "cannot write" in err


def test_render_example_inventory() -> None:
    code, out, _ = run("render", str(ROOT / "inventory.example.yaml"))
    assert code == 0 and "vllm-router" in out


@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        (None, r"^.*missing\.yaml: cannot read: No such file or directory$"),
        ("", r"^.*bad\.yaml:1: the inventory is empty$"),
        ("name: x\nmodel: [\n", r"^.*bad\.yaml:3: not valid YAML: .*$"),
        (
            "name: demo\nmodle: x\n",
            r"^.*bad\.yaml:2: modle: unknown key 'modle'; did you mean 'model'\?$",
        ),
    ],
)
def test_bad_inventories_exit_2_with_located_errors(
    tmp_path: Path, content: str | None, pattern: str
) -> None:
    path = tmp_path / ("missing.yaml" if content is None else "bad.yaml")
    if content is not None:
        path.write_text(content)
    code, out, err = run("render", str(path))
    assert code == 2 and out == ""
    assert re.search(pattern, err, re.MULTILINE), err
    assert "nothing was done" in err


def test_all_errors_listed_one_per_line(tmp_path: Path) -> None:
    text = (HERE / "inventories" / "1p1d.yaml").read_text()
    text = text.replace("router:\n  host: gpu-a", "router:\n  host: gpu-z\n  prot: 1")
    text += "kv_transfer: {kv_ip: 10.0.0.1}\n"
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    code, _, err = run("render", str(path))
    assert code == 2
    located = [ln for ln in err.splitlines() if re.match(rf"{re.escape(str(path))}:\d+: ", ln)]
    assert len(located) == 2  # pydantic errors (prot, kv_ip) come before cross-field rules
    assert "3 problems" not in err and "2 problems" in err


@pytest.mark.parametrize("cmd", ["preflight", "up", "down", "status"])
def test_other_commands_validate_the_inventory_first(cmd: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\n")
    code, _, err = run(cmd, str(path))
    assert code == 2 and "required key is missing" in err


def test_the_installed_entry_point_exits_2_without_a_traceback(tmp_path: Path) -> None:
    import subprocess
    import sys

    bad = tmp_path / "inv.yaml"
    bad.write_text("name: demo\nprefill: {hosts: []}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pdboot", "render", str(bad)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"{bad}:2: prefill.hosts: " in proc.stderr
    assert proc.stdout == ""


def test_help_summaries_are_whole_sentences_and_flags_show_no_type() -> None:
    code, out, _ = run("--help")
    assert code == 0
    # the `up` summary wraps to the width instead of breaking where its docstring does
    words = " ".join(line.strip(" │") for line in out.splitlines())
    assert "prove a request flows and the answers are right" in " ".join(words.split())
    code, out, _ = run("up", "--help")
    assert code == 0 and "--rollback" in out and "--events" in out
    assert "<bool>" not in out


def test_version_imports_no_command_dependencies() -> None:
    """`pdboot --version` loads nothing a command needs (typer and click, rich, pydantic, yaml,
    the SSH and Docker libraries, pdboot's core): each command imports only what it uses."""
    probe = (
        "import sys\n"
        "from pdboot.entry import main\n"
        "sys.argv = ['pdboot', '--version']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = ('typer', 'click', 'rich', 'pydantic', 'yaml', 'fabric', 'paramiko', 'docker',\n"
        "         'pdboot.cli', 'pdboot.inventory', 'pdboot.plan', 'pdboot.preflight',\n"
        "         'pdboot.deploy')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m in heavy\n"
        "             or any(m.startswith(h + '.') for h in heavy)))\n"
    )
    proc = python_in_root(probe)
    assert proc.stdout.splitlines() == [f"pdboot {__version__}", "[]"], proc.stdout


@pytest.mark.parametrize("name", ["stage", "up", "down"])
def test_commands_that_take_the_lock_offer_new_host_keys_and_no_wait(name: str) -> None:
    # each opens SSH to hosts an operator may not have met yet, and may wait on the lock
    import typer.main

    cmd = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    opts = {o for p in cmd.params for o in p.opts}
    assert {"--accept-new-host-keys", "--no-wait", "--events"} <= opts


@pytest.mark.parametrize("flag", ["--dry-run", "--check"])
def test_up_points_other_tools_dry_run_words_to_plan(flag: str) -> None:
    code, out, err = run("up", ONE, flag)
    assert code == 2 and out == ""
    assert "--plan" in err and flag in err
    code, out, _ = run("up", "--help")
    assert "--dry-run" not in out  # not an option of up's: only the pointer
