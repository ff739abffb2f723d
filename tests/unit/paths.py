"""Where the unit tests find the repository and their data, whatever folder a test sits in
(tests/unit/<package>/ mirrors pdboot/<package>/; the data stays shared in tests/unit/)."""

from __future__ import annotations

from pathlib import Path

UNIT = Path(__file__).resolve().parent
ROOT = UNIT.parents[1]
FIXTURES = UNIT / "fixtures"
INVENTORIES = UNIT / "inventories"
GOLDEN = UNIT / "golden"
