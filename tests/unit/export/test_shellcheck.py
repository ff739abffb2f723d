"""The batch scripts `pdboot export slurm` writes pass shellcheck with nothing to say (every
severity, style included) and `bash -n`, for every example under both runtimes, pinned with
the weights step and an API key too. shellcheck is a Debian package .ci/setup installs;
under CI=true a missing one fails the test."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pdboot.export.slurm import SlurmOptions, render_slurm
from pdboot.inventory.load import load_inventory, parse_inventory
from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from tests.unit.paths import INVENTORIES, ROOT

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _shellcheck() -> str:
    found = shutil.which("shellcheck")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("shellcheck is not installed (.ci/setup installs it)")
        pytest.skip("shellcheck is not installed (.ci/setup installs it)")
    return found


def shellcheck(text: str, tmp: Path) -> str:
    path = tmp / "job.sbatch"
    path.write_text(text)
    res = subprocess.run(
        [_shellcheck(), "--severity=style", "--shell=bash", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    return res.stdout + res.stderr


def pinned_with_key() -> Inventory:
    text = (INVENTORIES / "1p1d.yaml").read_text()
    text = text.replace("  hf_token: env:HF_TOKEN", "  hf_token: env:HF_TOKEN\n  api_key: env:K")
    return parse_inventory(text + f"model_revision: {COMMIT}\n")


def _scripts() -> list[tuple[str, Inventory, SlurmOptions]]:
    out = []
    for runtime in ("docker", "pyxis"):
        for path in EXAMPLES:
            opts = SlurmOptions(runtime=runtime, download_at_start=True)  # type: ignore[arg-type]
            out.append((f"{path.stem}-{runtime}", load_inventory(path), opts))
        opts = SlurmOptions(runtime=runtime, account="a", qos="q")  # type: ignore[arg-type]
        out.append((f"pinned-key-{runtime}", pinned_with_key(), opts))
    return out


SCRIPTS = _scripts()


@pytest.mark.parametrize(("name", "inv", "opts"), SCRIPTS, ids=[s[0] for s in SCRIPTS])
def test_scripts_pass_shellcheck_and_bash_n(
    name: str, inv: Inventory, opts: SlurmOptions, tmp_path: Path
) -> None:
    text = next(iter(render_slurm(inv, build_plan(inv), opts).values()))
    assert shellcheck(text, tmp_path) == ""
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_shellcheck_can_fail(tmp_path: Path) -> None:
    # the warning the scripts had (issue 45): a variable set and never used
    assert "SC2034" in shellcheck("#!/bin/bash\nDEPLOYMENT=demo\n", tmp_path)


def test_the_pyxis_emulation_passes_shellcheck(tmp_path: Path) -> None:
    """tests/testbed/pyxis_srun.sh, the srun the real-Slurm e2e runs the pyxis script with."""
    text = (ROOT / "tests" / "testbed" / "pyxis_srun.sh").read_text()
    assert shellcheck(text, tmp_path) == ""
