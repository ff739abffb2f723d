"""Under CI=true no testbed or end-to-end test skips (issue 32, item 7): every
``pytest.skip`` in tests/e2e and tests/testbed sits in a function that first fails when
CI=true, and no ``skipif`` marks a test there (it would skip under CI as anywhere else)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.unit.paths import ROOT

TESTS = ROOT / "tests"
DIRS = (TESTS / "e2e", TESTS / "testbed")


def _is(node: ast.AST, attr: str) -> bool:
    f = node.func if isinstance(node, ast.Call) else node
    return isinstance(f, ast.Attribute) and f.attr == attr


def _fails_under_ci(fn: ast.AST) -> bool:
    """The function compares the CI variable and calls pytest.fail."""
    text = ast.unparse(fn)
    return ("'CI'" in text or '"CI"' in text) and "pytest.fail(" in text


def silent_skips(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    out: list[str] = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        skips = [
            n for n in ast.walk(fn) if isinstance(n, ast.Call) and _is(n, "skip")
            and isinstance(n.func, ast.Attribute) and ast.unparse(n.func.value) == "pytest"
        ]  # fmt: skip
        if skips and not _fails_under_ci(fn):
            out += [f"{path.relative_to(TESTS)}:{n.lineno} in {fn.name}" for n in skips]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("skipif", "importorskip"):
            out.append(f"{path.relative_to(TESTS)}:{node.lineno}: {node.attr}")
    return out


def test_no_testbed_test_can_skip_under_ci() -> None:
    found = [s for d in DIRS for p in sorted(d.rglob("*.py")) for s in silent_skips(p)]
    assert found == [], found


def test_the_scan_finds_a_bare_skip(tmp_path: Path) -> None:
    bad = tmp_path / "test_x.py"
    bad.write_text(
        "import pytest\n\ndef test_a():\n    if can_run():\n        pytest.skip('no')\n\n"
        "@pytest.mark.skipif(True, reason='x')\ndef test_b():\n    pass\n"
    )
    tmp = TESTS / "_scan_probe_tmp.py"
    try:
        tmp.write_text(bad.read_text())
        got = silent_skips(tmp)
    finally:
        tmp.unlink()
    assert len(got) == 2 and "test_a" in got[0] and "skipif" in got[1], got
