"""The package order (issue 27): every runtime import in pdboot/ points down this list, never
up it nor sideways within a level, so there is no package-level cycle. docs/architecture.md
explains the order; this list is the one the test holds.

A unit is a top-level module of pdboot (``events``) or a package (``plan``, everything under
pdboot/plan/). Imports anywhere in a module count (lazy ones inside functions too); names
imported only under ``if TYPE_CHECKING:`` are no import at run time and are left out."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.unit.paths import ROOT
from tests.unit.repo.import_graph import cycles, typing_only_nodes

PKG = ROOT / "pdboot"

# Lowest first. Units of one level import none of each other; the command line (cli/) sits
# above everything it calls, the entry point above it.
ORDER: tuple[tuple[str, ...], ...] = (
    ("__init__", "ansi", "diagnostics", "events", "exitcodes", "timestamps"),
    ("inventory",),
    ("plan",),
    ("transport",),
    ("preflight", "verify", "bench"),
    ("deploy",),
    ("views", "export"),
    ("cli",),
    ("entry",),
    ("__main__",),
)
LEVEL = {unit: i for i, units in enumerate(ORDER) for unit in units}


def _unit(module: str) -> str:
    """pdboot.plan.build -> plan; pdboot.events -> events; pdboot -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(source: str, module: str, package: bool) -> list[tuple[int, str]]:
    """(line, module of pdboot) for every import the module runs."""
    tree = ast.parse(source)
    typing_only = typing_only_nodes(tree)
    here = module.split(".") if package else module.split(".")[:-1]
    out: list[tuple[int, str]] = []
    for n in ast.walk(tree):
        if id(n) in typing_only:
            continue
        if isinstance(n, ast.Import):
            out += [(n.lineno, a.name) for a in n.names if a.name.split(".")[0] == "pdboot"]
        elif isinstance(n, ast.ImportFrom):
            if n.level:  # relative: resolved against the module's own package
                base = here[: len(here) - (n.level - 1)]
                target = ".".join([*base, *([n.module] if n.module else [])])
            else:
                target = n.module or ""
            if target.split(".")[0] != "pdboot":
                continue
            if target == "pdboot":  # `from pdboot import x`: x is a unit (or the version)
                out += [(n.lineno, f"pdboot.{a.name}") for a in n.names if a.name in LEVEL]
                out += [(n.lineno, "pdboot") for a in n.names if a.name not in LEVEL]
            else:
                out.append((n.lineno, target))
    return out


def _edges() -> list[tuple[str, str, str, int, str]]:
    """(from unit, to unit, file, line, imported module) for imports between units."""
    edges = []
    for path in sorted(PKG.rglob("*.py")):
        src = _unit(_module(path))
        imports = _runtime_imports(path.read_text(), _module(path), path.name == "__init__.py")
        for line, target in imports:
            dst = _unit(target)
            if dst != src:
                rel = str(path.relative_to(PKG.parent))
                edges.append((src, dst, rel, line, target))
    return edges


def test_every_unit_has_a_place_in_the_order() -> None:
    units = {_unit(_module(p)) for p in PKG.rglob("*.py")}
    assert sorted(units - set(LEVEL)) == []


def test_imports_point_down_the_order() -> None:
    wrong = [
        f"{file}:{line}: imports {target} ({src} may not import {dst})"
        for src, dst, file, line, target in _edges()
        if LEVEL.get(dst, len(ORDER)) >= LEVEL.get(src, -1)  # a unit without a place fails
    ]
    assert wrong == [], "\n".join(wrong)


def test_views_only_render_events() -> None:
    """views/ sits above deploy/ in the order, yet runs nothing: no import of the
    orchestrator, not even for annotations (`up`'s preflight gate is deploy/preflight_gate.py)."""
    wrong = []
    for path in sorted((PKG / "views").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for n in ast.walk(tree):
            names = [n.module or ""] if isinstance(n, ast.ImportFrom) else []
            names += [a.name for a in n.names] if isinstance(n, ast.Import) else []
            wrong += [
                f"{path.name}:{n.lineno}: {m}" for m in names if m.startswith("pdboot.deploy")
            ]
    assert wrong == []


def test_no_package_level_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for src, dst, *_ in _edges():
        graph.setdefault(src, set()).add(dst)
    found = cycles(graph)
    assert found == [], "\n".join(found)


def test_the_scan_sees_lazy_relative_and_skips_typing_only_imports() -> None:
    """The scan itself: an import inside a function counts, a relative one is resolved, one
    under TYPE_CHECKING does not count."""
    src = (
        "from typing import TYPE_CHECKING\n"
        "from .model import Plan\n"
        "if TYPE_CHECKING:\n    from pdboot.deploy.up import up\n"
        "def f():\n    from pdboot.views.status import x\n"
    )
    got = [t for _, t in _runtime_imports(src, "pdboot.plan.probe", package=False)]
    assert sorted(got) == ["pdboot.plan.model", "pdboot.views.status"]
