"""Issue 29: a change of vLLM build goes blue/green, never a roll, on a 5-host testbed with
stand-in engines (which refuse a NIXL pair whose version strings differ, as real vLLM does)
behind the real vllm-router and nginx proxy. A client loop sends a completion every ~50 ms
through the endpoint while `pdboot up` moves a 2P2D deployment from the stand-in image
(0.33.0) to its nightly (0.33.0+nightly.1): half of each tier drained, green started and
proven on its own router in the spare place, the proxy switched, blue stopped, green grown,
its router moved home. No request fails and no engine logs a compatibility hash mismatch."""

from __future__ import annotations

from typing import Any

import pytest

from tests.testbed.images import STANDIN_NIGHTLY_TAG
from tests.testbed.rolling_load import NAME, change_under_load, inventory, pdboot

pytestmark = [pytest.mark.testbed, pytest.mark.slow]
HOSTS = ["p1", "p2", "d1", "d2"]


def engine_logs(tb: Any) -> str:
    out = []
    for h in HOSTS:
        ids = (
            tb.hosts[h]
            .docker("ps", "-aq", "--filter", f"label=io.pdboot.deployment={NAME}")
            .stdout.split()
        )
        for cid in ids:
            out.append(tb.hosts[h].docker("logs", cid, timeout=60).stderr)
    return "\n".join(out)


def test_a_new_build_goes_blue_green_with_no_failed_request(make_testbed: Any) -> None:
    tb = make_testbed(HOSTS)
    work = tb.dir / "bg"
    work.mkdir(parents=True, exist_ok=True)
    path = inventory(tb, work / "inv.yaml")
    res = pdboot("up", str(path), "--skip-preflight", "--no-speed")
    assert res.returncode == 0, res.stdout + res.stderr

    nightly = inventory(tb, work / "nightly.yaml", tag=STANDIN_NIGHTLY_TAG)
    case = change_under_load(tb, "bluegreen", "bluegreen", nightly, [])
    assert case.rc == 0, case.output
    assert "upgrade path: blue/green" in case.output, case.output
    assert "0.33.0 -> 0.33.0+nightly.1" in case.output, case.output
    for n in range(1, 6):
        assert f"blue/green phase {n}:" in case.output, case.output
    assert "green's KV proof" in case.output and "green's correctness gate" in case.output
    assert case.failed == 0 and case.served >= 20, (case.errors, case.output)
    logs = engine_logs(tb)
    assert "compatibility hash mismatch" not in logs
    res = pdboot("up", str(nightly), "--plan", "--detailed-exitcode")
    assert res.returncode == 0, res.stdout + res.stderr
    assert pdboot("down", str(nightly)).returncode == 0
