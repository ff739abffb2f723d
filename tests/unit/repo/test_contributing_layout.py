"""CONTRIBUTING's map of tests/unit/ is the tree: every package folder it names exists, under
tests/unit/ and under pdboot/ (the `cli/` and `repo/` folders are tests' own)."""

from __future__ import annotations

import re

from tests.unit.paths import ROOT

TEXT = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")


def named_packages() -> list[str]:
    """The folders in "for each package of `pdboot/` (`inventory/`, ...; ... in `cli/`)"."""
    m = re.search(r"for each package of\s+`pdboot/` \((.*?)\), and", TEXT, re.S)
    assert m, "CONTRIBUTING's package list moved: update this test"
    return re.findall(r"`([a-z_]+)/`", m.group(1))


def test_every_named_test_folder_exists() -> None:
    names = named_packages()
    assert {"inventory", "plan", "cli"} <= set(names)
    assert [n for n in names if not (ROOT / "tests" / "unit" / n).is_dir()] == []
    assert [n for n in names if n != "cli" and not (ROOT / "pdboot" / n).is_dir()] == []
