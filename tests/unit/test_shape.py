"""The shape issue 8 asks for: the orchestrator and the pure core never import rich (only
views/ (the preflight report among them) and cli.py do), and every function of the package
stays within 80 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "pdboot"
# every module of the package: rich only in the views and the CLI, functions short everywhere
MODULES = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py"))
VIEWS = [m for m in MODULES if m.startswith("views/") or m == "cli.py"]
NO_RICH = [m for m in MODULES if m not in VIEWS]
SHORT = MODULES


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
    assert not _imports(PKG / "deploy" / "status.py") & {"pdboot.deploy.up", "pdboot.deploy.down"}
