"""Rendered files against their golden copies under tests/unit/golden/. With
PDBOOT_UPDATE_GOLDEN=1 the golden copies are written anew first (review the diff)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

UPDATE = os.environ.get("PDBOOT_UPDATE_GOLDEN") == "1"


def assert_golden(folder: Path, files: Mapping[str, str]) -> None:
    """``files`` (path under ``folder`` -> text) are exactly the golden files in ``folder``."""
    if UPDATE:
        shutil.rmtree(folder, ignore_errors=True)
        for rel, text in files.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_text(text, encoding="utf-8")
    on_disk = {
        str(p.relative_to(folder)): p.read_text(encoding="utf-8")
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
    assert sorted(on_disk) == sorted(files), "golden files differ in number; regenerate"
    for rel, text in files.items():
        assert text == on_disk[rel], f"{folder.name}/{rel} differs from the golden file"
