"""Where the unit tests find the repository and their data, whatever folder a test sits in
(tests/unit/<package>/ mirrors pdboot/<package>/; the data stays shared in tests/unit/)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

UNIT = Path(__file__).resolve().parent
ROOT = UNIT.parents[1]
FIXTURES = UNIT / "fixtures"
INVENTORIES = UNIT / "inventories"
GOLDEN = UNIT / "golden"


def python_in_root(program: str) -> subprocess.CompletedProcess[str]:
    """``program`` run by a fresh Python in the repository root (what a fresh process
    imports, for one); its output as text, a failure raised."""
    return subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=ROOT,
    )
