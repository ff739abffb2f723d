"""The after-pull UCX check against the REAL vLLM CPU image's NIXL and UCX (issue 32,
item 9): an engine whose UCX_NET_DEVICES names devices the container does not have
(``kv_transfer.ucx.net_devices: mlx5_0:1`` on a host without RDMA, the issue's report) fails
`up` before any engine starts, naming the devices UCX does see; before, the probe created
the backend with UCX's defaults, passed, and every engine crashed at start.

Under CI=true a testbed that cannot start fails this test; elsewhere it skips."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.testbed.harness import HostSpec

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_an_unusable_ucx_device_fails_before_any_engine_starts(
    make_testbed: Any, tmp_path: Path
) -> None:
    tb = make_testbed([HostSpec("box", profile="cpu-only")], real_vllm=True)
    inv = tb.inventory(
        tmp_path / "inv.yaml",
        name="ucxreal",
        engine="vllm",
        overrides={"kv_transfer": {"rdma": "off", "ucx": {"net_devices": "mlx5_0:1"}}},
    )
    res = subprocess.run(
        [sys.executable, "-m", "pdboot", "up", str(inv), "--no-speed"],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
        env=dict(os.environ, COLUMNS="250", TERM="dumb"),
    )  # fmt: skip
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "NIXL cannot create its UCX backend with UCX_NET_DEVICES=mlx5_0:1" in out, out
    assert "network devices " in out and "lo" in out, out  # what the container sees
    assert "UCX check failed: nothing was started" in out, out
    ps = tb.hosts["box"].docker("ps", "-aq", "--filter", "label=io.pdboot.deployment=ucxreal")
    assert ps.stdout.strip() == "", ps.stdout
