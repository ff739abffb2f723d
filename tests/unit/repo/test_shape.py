"""The package's shape: the orchestrator and the pure core never import rich (only views/
(the preflight report among them) and the cli*.py modules do), every function stays within 80 lines
(issue 8); no import cycle between modules, no module over 500 lines, and
docs/architecture.md's table names every module (issue 16)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.unit.paths import ROOT
from tests.unit.repo.import_graph import cycles, typing_only_nodes

PKG = ROOT / "pdboot"
# every module of the package: rich only in the views and the CLI, functions short everywhere
MODULES = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py"))
VIEWS = [m for m in MODULES if m.startswith("views/") or m.startswith("cli")]
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


MAX_MODULE_LINES = 500


def _module(rel: str) -> str:
    parts = rel.removesuffix(".py").split("/")
    return ".".join(["pdboot", *parts[:-1]] + ([] if parts[-1] == "__init__" else [parts[-1]]))


def _pdboot_imports(rel: str) -> set[str]:
    """Modules of pdboot that ``rel`` imports, anywhere in it (lazy imports count too). Names
    imported only for annotations (``if TYPE_CHECKING:``) are no import at run time and are
    left out: the check areas annotate with ``HostFacts``, whose fields are their facts."""
    known = {_module(m) for m in MODULES}
    out: set[str] = set()
    tree = ast.parse((PKG / rel).read_text())
    typing_only = typing_only_nodes(tree)
    for n in ast.walk(tree):
        if id(n) in typing_only:
            continue
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names if a.name in known}
        elif isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("pdboot"):
            for a in n.names:  # `from pdboot.x import y`: y may be a module itself
                sub = f"{n.module}.{a.name}"
                out.add(sub if sub in known else n.module)
    return out & known - {_module(rel)}


def test_no_import_cycle_between_modules() -> None:
    graph = {_module(m): _pdboot_imports(m) for m in MODULES}
    assert cycles(graph) == []


@pytest.mark.parametrize("name", MODULES)
def test_module_at_most_500_lines(name: str) -> None:
    lines = len((PKG / name).read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{name}: {lines} lines"


def _architecture_modules() -> set[str]:
    """Module paths named in the first cell of docs/architecture.md's module table rows; a
    name without a folder is in the folder of the first one of its cell."""
    section = (PKG.parent / "docs" / "architecture.md").read_text()
    found: set[str] = set()
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        folder = ""
        for name in re.findall(r"`([^`]+\.py)`", line.split(" | ")[0]):
            if "/" in name:
                folder = name.rsplit("/", 1)[0] + "/"
                found.add(name)
            else:
                found.add(folder + name)
    return found


def test_the_architecture_doc_lists_every_module() -> None:
    """Package __init__ files holding only a docstring are the folders themselves."""

    def has_code(m: str) -> bool:
        body = ast.parse((PKG / m).read_text()).body
        return any(
            not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)) for n in body
        )

    modules = {m for m in MODULES if not m.endswith("__init__.py") or has_code(m)}
    listed = _architecture_modules()
    assert sorted(modules - listed) == [] and sorted(listed - modules) == []


def test_test_files_have_unique_basenames() -> None:
    """pytest's default (rootdir) import mode refuses a second test module of the same basename
    at collection, which a run of one directory does not show; the whole suite would stop."""
    names = [p.name for p in (PKG.parent / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_make_lint_covers_tests_bench_and_scripts() -> None:
    """Issue 27: the lint that holds pdboot/ holds the tests, benchmarks and scripts too."""
    makefile = (PKG.parent / "Makefile").read_text()
    lint = makefile[makefile.index("\nlint:") :].split("\n\n", 1)[0]
    for tool in ("ruff check", "ruff format --check"):
        line = next(x for x in lint.splitlines() if tool in x)
        assert {"pdboot", "tests", "bench", "scripts"} <= set(line.split()), line
