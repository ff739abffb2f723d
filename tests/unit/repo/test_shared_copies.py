"""The copies of the shared vLLM 0.33.0 and 0.34.0 dumps under tests/ are the originals in ../shared."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.shared_data import COPIES


@pytest.mark.parametrize("copy", sorted(COPIES), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_copy_is_the_shared_original(copy: Path) -> None:
    original = COPIES[copy]
    if not original.exists():
        pytest.skip(f"no ../shared beside this checkout ({original}): the copy cannot be compared")
    assert copy.read_bytes() == original.read_bytes()
