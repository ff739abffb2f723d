"""Only tests/shared_data.py names ``../shared`` as a path: a user's clone has no ../shared
beside it, so every other test reads the in-tree copies tests/shared_data.py names. Docstrings,
comments and messages may mention it; code that builds a path to it may not."""

from __future__ import annotations

import ast
import re

from tests.unit.paths import ROOT

SHARED_DATA = ROOT / "tests" / "shared_data.py"
# a path string that walks into the shared folder: "../shared/...", ".../shared/fixtures/..."
_SHARED_PATH = re.compile(r"(^|/)\.\./shared(/|$)|(^|/)shared/(fixtures|docs)(/|$)")


def _is_parent(node: ast.expr) -> bool:
    """`x.parent`, `x.parents[n]` or a `/ ".."` step: a walk out of the checkout."""
    if isinstance(node, ast.Attribute):
        return node.attr == "parent"
    if isinstance(node, ast.Subscript):
        return isinstance(node.value, ast.Attribute) and node.value.attr == "parents"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return isinstance(node.right, ast.Constant) and node.right.value == ".."
    return False


def _path_strings(tree: ast.AST) -> list[ast.Constant]:
    """The string constants used as paths: a `/` operand, a call's argument, an assigned value."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            found += [node.left, node.right]
        elif isinstance(node, ast.Call):
            found += node.args
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            found.append(node.value)
    return [n for n in found if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def shared_paths(source: str) -> list[int]:
    """The lines of `source` where code builds a path into ../shared."""
    tree = ast.parse(source)
    lines = [
        node.lineno
        for node in _path_strings(tree)
        if not re.search(r"\s", node.value) and _SHARED_PATH.search(node.value)
    ]
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            right = node.right
            if (
                isinstance(right, ast.Constant)
                and right.value == "shared"
                and _is_parent(node.left)
            ):
                lines.append(node.lineno)
    return sorted(lines)


def test_the_finder_sees_each_way_of_naming_shared() -> None:
    assert shared_paths('P = ROOT / "../shared/fixtures/vllm-0.33.0/metrics.json"\n') == [1]
    assert shared_paths('P = Path(__file__).parents[3] / "shared" / "fixtures"\n') == [1]
    assert shared_paths('P = REPO.parent / "shared"\n') == [1]
    assert shared_paths('P = ROOT / ".." / "shared"\n') == [1]
    assert shared_paths('P = Path("/srv/ci/shared/fixtures/h200-host")\n') == [1]
    # words about it, and a testbed file that happens to be called "shared", are not paths
    assert shared_paths('"""Copies of ../shared/fixtures."""\n# ../shared\n') == []
    assert shared_paths('pytest.skip(f"no ../shared beside this checkout ({p})")\n') == []
    assert shared_paths('(self.dir / "shared").write_text("")\n') == []
    assert shared_paths('assert "../shared" not in doc.read_text()\n') == []


def test_no_test_but_shared_data_names_the_shared_folder() -> None:
    offenders = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path == SHARED_DATA:
            continue
        for line in shared_paths(path.read_text()):
            offenders.append(f"{path.relative_to(ROOT)}:{line}")
    assert offenders == [], "read shared data through tests/shared_data.py"


def test_shared_data_still_names_it() -> None:
    """The one place: if it stopped, the check above would pass over nothing."""
    assert shared_paths(SHARED_DATA.read_text())
