"""scripts/fuzz_inventory.py stays runnable and clean: a short run in the unit suite (the
full 3,000-case run is reported in the README's security section)."""

from __future__ import annotations

import subprocess
import sys

from tests.unit.paths import ROOT


def test_a_short_fuzz_run_finds_nothing() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fuzz_inventory.py"), "--cases", "250", "--seed", "7"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "250 cases" in out
    for what in ("traceback: 0", "hang: 0", "unlocated: 0", "escaped: 0"):
        assert what in out, out
    # the watch: and weights: sections and the front door's router keys are generated, and
    # their refused classes reached (scripts/fuzz_sections.py; issue 32)
    for cls in (
        "watch port clash",
        "seed port clash",
        "invalid watch image",
        "weights endpoint",
        "router internal port clash",
        "invalid proxy image",
        "TLS value, not a reference",
    ):
        line = next((ln for ln in out.splitlines() if ln.endswith(cls)), "")
        assert line and int(line.split(":")[1].split()[0]) > 0, out
