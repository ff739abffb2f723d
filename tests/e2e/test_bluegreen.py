"""Issue 29: a change of vLLM build goes blue/green, never a roll, on a 5-host testbed with
stand-in engines (which refuse a NIXL pair whose version strings differ, as real vLLM does)
behind the real vllm-router and nginx proxy. A client loop sends a completion every ~50 ms
through the endpoint while `pdboot up` moves a 2P2D deployment from the stand-in image
(0.33.0) to its nightly (0.33.0+nightly.1): half of each tier drained, green started and
proven on its own router in the spare place, the proxy switched, blue stopped, green grown,
its router moved home. No request fails and no engine logs a compatibility hash mismatch.
First a green whose decode dies at start: blue keeps serving, the drained half comes back."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cli import Cli
from tests.testbed.images import STANDIN_NIGHTLY_TAG
from tests.testbed.rolling_load import change_under_load, engine_logs, inventory

pytestmark = [pytest.mark.testbed, pytest.mark.slow]
HOSTS = ["p1", "p2", "d1", "d2"]
KINDS = ("create", "recreate", "unchanged", "remove")


def test_a_new_build_goes_blue_green_with_no_failed_request(cli: Cli, make_testbed: Any) -> None:
    tb = make_testbed(HOSTS)
    work = tb.dir / "bg"
    work.mkdir(parents=True, exist_ok=True)
    path = inventory(tb, work / "inv.yaml")
    res = cli("up", str(path), "--skip-preflight", "--no-speed")
    assert res.returncode == 0, res.stdout + res.stderr

    # a green that fails (its decode dies at start) leaves blue serving: the drained half
    # comes back in its old configuration, `up` exits 1, no client request failed
    broken = inventory(
        tb,
        work / "broken.yaml",
        tag=STANDIN_NIGHTLY_TAG,
        decode_env={"STANDIN_CRASH_AT_START": "oom"},
    )
    case = change_under_load(tb, "green-fails", "bluegreen", broken, [])
    assert case.rc == 1, case.output
    assert "green failed before any client reached it" in case.output, case.output
    # the undo is the roll's (steps.RestorePrevious, one step for both): its wording
    assert "decode@d2: brought back in its old configuration" in case.output, case.output
    assert case.failed == 0 and case.served >= 20, (case.errors, case.output)
    res = cli("up", str(path), "--plan")
    rows = [  # the converge table: what runs is the inventory before the change
        r
        for r in (ln.split() for ln in (res.stdout + res.stderr).splitlines())
        if len(r) > 1 and r[0].startswith(("prefill@", "decode@")) and r[1] in KINDS
    ]
    assert rows and not any("image" in " ".join(r) for r in rows), rows  # the old build

    nightly = inventory(tb, work / "nightly.yaml", tag=STANDIN_NIGHTLY_TAG)
    case = change_under_load(tb, "bluegreen", "bluegreen", nightly, [])
    assert case.rc == 0, case.output
    assert "upgrade path: blue/green" in case.output, case.output
    assert "0.33.0 -> 0.33.0+nightly.1" in case.output, case.output
    for n in range(1, 6):
        assert f"blue/green phase {n}:" in case.output, case.output
    assert "green's KV proof" in case.output and "green's correctness gate" in case.output
    assert case.failed == 0 and case.served >= 20, (case.errors, case.output)
    logs = engine_logs(tb, HOSTS)
    assert "compatibility hash mismatch" not in logs
    res = cli("up", str(nightly), "--plan", "--detailed-exitcode")
    assert res.returncode == 0, res.stdout + res.stderr
    assert cli("down", str(nightly)).returncode == 0
