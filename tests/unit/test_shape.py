"""The shape issue 8 asks for: the orchestrator and the pure core never import rich (only
views, cli.py and the preflight report do), and their functions stay short."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "pdboot"
NO_RICH = [
    "up.py",
    "down.py",
    "readiness.py",
    "ports.py",
    "events.py",
    "exitcodes.py",
    "status.py",
    "http.py",
    "waits.py",
    "converge.py",
    "plan.py",
    "render.py",
    "inventory.py",
    "remote.py",
    "engine.py",
    "views/jsonl.py",
    *(f"checks/{p.name}" for p in (PKG / "checks").glob("*.py")),
]
SHORT = ["up.py", "down.py", "readiness.py", "ports.py", "status.py", "http.py", "cli.py"]
SHORT += ["views/terminal.py", "views/jsonl.py", "views/status.py", "waits.py"]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Import):
            names |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.module:
            names.add(n.module)
    return names


@pytest.mark.parametrize("name", NO_RICH)
def test_no_rich_outside_views(name: str) -> None:
    assert not {m for m in _imports(PKG / name) if m == "rich" or m.startswith("rich.")}


@pytest.mark.parametrize("name", SHORT)
def test_functions_at_most_80_lines(name: str) -> None:
    tree = ast.parse((PKG / name).read_text())
    long = [
        f"{n.name}: {n.end_lineno - n.lineno + 1}"  # type: ignore[operator]
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        and n.end_lineno - n.lineno + 1 > 80  # type: ignore[operator]
    ]
    assert long == []


def test_status_does_not_import_the_orchestrator() -> None:
    assert not _imports(PKG / "status.py") & {"pdboot.up", "pdboot.down", "pdboot.deploy"}
