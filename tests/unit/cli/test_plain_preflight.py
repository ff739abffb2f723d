"""`pdboot preflight INVENTORY [--json] [-v]` without typer (cli_preflight.py, called by
entry.py): it reads its line as typer would, loads no typer, and ends as typer's command
does (the same exit code and the same words on stderr)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from pdboot.cli import app
from pdboot.cli_preflight import PlainLine, plain_line
from tests.unit.paths import ROOT

# Runs entry.py as `pdboot` does, and says at exit whether typer (or click) was loaded.
PROBE = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('loaded:', sorted({m.split('.')[0] for m in sys.modules}"
    " & {'typer', 'click'}), file=sys.stderr))\n"
    "sys.argv = ['pdboot', *sys.argv[1:]]\n"
    "from pdboot.entry import main\n"
    "main()\n"
)


def plain(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_a_plain_command_line_is_read_as_typer_reads_it() -> None:
    assert plain_line(["inv.yaml"]) == PlainLine(Path("inv.yaml"), False, False)
    assert plain_line(["--json", "i.yaml", "-v"]) == PlainLine(Path("i.yaml"), True, True)
    assert plain_line(["i.yaml", "--verbose"]) == PlainLine(Path("i.yaml"), False, True)
    for other in (["i.yaml", "--only", "gpu"], ["i.yaml", "-h"], ["a.yaml", "b.yaml"], []):
        assert plain_line(other) is None


def test_a_bad_inventory_ends_as_under_typer_without_loading_it(tmp_path: Path) -> None:
    bad = tmp_path / "inv.yaml"
    bad.write_text("name: demo\nprefill: {hosts: []}\n")
    got = plain("preflight", str(bad), "--json")
    *report, loaded = got.stderr.splitlines()
    assert loaded == "loaded: []", got.stderr
    typed = CliRunner().invoke(app, ["preflight", str(bad), "--json"])
    assert got.returncode == typed.exit_code == 2
    assert report == typed.stderr.splitlines()
    assert any(line.startswith(f"{bad}:2: prefill.hosts: ") for line in report), report
    assert got.stdout == ""
    # typer's command also answers --json in JSON (issue 46); the plain line is being removed
    assert '"ok": false' in typed.stdout and f'"file": "{bad}"' in typed.stdout


def test_a_missing_file_and_other_lines_still_reach_typer(tmp_path: Path) -> None:
    gone = plain("preflight", str(tmp_path / "none.yaml"))
    assert gone.returncode == 2 and gone.stderr.endswith("loaded: []\n"), gone.stderr
    assert "Traceback" not in gone.stderr
    # a line plain_line leaves alone is typer's: its usage error, exit 2
    other = plain("preflight", str(tmp_path / "none.yaml"), "--no-such-flag")
    assert other.returncode == 2 and "No such option" in other.stderr
    assert "'typer'" in other.stderr.splitlines()[-1]
