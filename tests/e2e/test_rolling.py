"""Day-two changes roll through the running real vllm-router (issue 19), on a 5-host testbed
with stand-in engines: a client loop sends a completion every ~50 ms while `pdboot up` applies
(a) a new image tag to every engine of a 2P2D deployment, (b) an added decode host, (c) a
removed prefill host. Each finishes with no failed request; the router container is the
same one throughout; `up --plan` shows the steps first and exits 0 once nothing is left.
A roll stopped by a replacement that crashes leaves the old engines serving; a re-run
finishes it. (The recreate path's figures, the baseline, are bench/rolling.py's.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.cli import Cli
from tests.testbed.rolling_load import (
    HOSTS,
    SECOND_TAG,
    change_under_load,
    inventory,
    push_second_tag,
    router_identity,
)

pytestmark = [pytest.mark.testbed, pytest.mark.slow]


def plan(cli: Cli, inv: Path) -> tuple[int, str]:
    """`up --plan --detailed-exitcode`: 0 nothing to do, 2 changes, 1 error."""
    res = cli("up", str(inv), "--plan", "--detailed-exitcode")
    return res.returncode, res.stdout + res.stderr


def settled(cli: Cli, inv: Path) -> tuple[bool, str]:
    """`up --plan` exits 0 (nothing left) at once after the roll, on one look. It used to be
    given 20 s of retries: once, on two xdist workers, the plan right after a roll answered
    "changes" while a second look printed every service unchanged. The cause (issue 32, item 7):
    `Engine.containers` dropped any container whose inspect failed, a slow or cut read
    under load included, as if removed meanwhile, so the plan saw "create: not running";
    and an RDMA record that could not be read counted as none, a changed config hash.
    Both are errors now (exit 1 with --detailed-exitcode, naming the host), so one look
    either agrees or says why it could not look (tests/unit/transport/test_unreadable_state.py)."""
    code, text = plan(cli, inv)
    return code == 0, text


KINDS = ("create", "recreate", "unchanged", "remove")


def pair_refused_is_undone(cli: Cli, tb: Any, path: Path) -> None:
    """Issue 29, defence in depth: a change pdboot counts as compatible (an environment
    variable) that still changes NIXL's compatibility hash (the stand-in hashes the version
    it is told, as real vLLM hashes its own). The new prefill's pairs are probed before the
    router may send it a client: they fail, the old prefill comes back from the kept compose
    file, `up` stops (exit 1) naming the mismatch, and no client request failed."""
    rebuilt = inventory(
        tb,
        path.with_name("rebuild.yaml"),
        tag=SECOND_TAG,
        prefill_env={"VLLM_STANDIN_VERSION": "0.33.0+rebuild"},
    )
    case = change_under_load(tb, "pairs", "rolling", rebuilt, [])
    assert case.rc == 1, case.output
    assert "FAILED" in case.output and "pair" in case.output, case.output
    assert "NIXL compatibility hash" in case.output, case.output  # the diagnosis
    assert "brought back in its old configuration" in case.output, case.output
    assert case.failed == 0 and case.served >= 20, (case.errors, case.output)
    assert case.router_kept, case.output
    # what runs is the inventory before the refused change: the old prefill is back (the
    # decodes, which met a restarted prefill, are due the usual NIXL-state restart)
    _, text = plan(cli, path)
    rows = [  # the converge table: service, action, reason
        r
        for r in (ln.split() for ln in text.splitlines())
        if len(r) > 1 and r[0].startswith(("prefill@", "decode@")) and r[1] in KINDS
    ]
    assert rows and all(r[1] == "unchanged" for r in rows if r[0].startswith("prefill@")), text
    assert all("NIXL state" in " ".join(r) for r in rows if r[1] != "unchanged"), text


def test_changes_roll_through_the_running_router(
    cli: Cli, make_testbed: Any, tmp_path: Path
) -> None:
    tb = make_testbed(HOSTS)
    tag = push_second_tag(tb)
    work = tb.dir / "roll"
    work.mkdir(parents=True, exist_ok=True)
    path = inventory(tb, work / "inv.yaml")
    res = cli("up", str(path), "--skip-preflight", "--no-speed")  # setup
    assert res.returncode == 0, res.stdout + res.stderr
    assert plan(cli, path)[0] == 0
    first_router = router_identity(tb)

    cases = [
        ("a", dict(tag=tag), ["replace", "prefill@p1", "decode@d2"]),
        ("b", dict(tag=tag, decode=["d1", "d2", "d3"]), ["add", "decode@d3"]),
        ("c", dict(tag=tag, prefill=["p1"], decode=["d1", "d2", "d3"]), ["remove", "prefill@p2"]),
    ]
    for name, change, words in cases:
        inventory(tb, path, **change)  # type: ignore[arg-type]
        code, text = plan(cli, path)
        assert code == 2 and all(w in text for w in words), text
        assert "endpoint up" in text and "ENDPOINT DOWN" not in text, text
        case = change_under_load(tb, name, "rolling", path, [])
        assert case.rc == 0, case.output
        assert case.failed == 0 and case.served >= 20, (case.errors, case.output)
        assert case.router_kept, case.output
        ok, text = settled(cli, path)
        assert ok, text
        if name == "a":
            pair_refused_is_undone(cli, tb, path)
    assert router_identity(tb) == first_router

    # a replacement that crashes stops the roll; the old decodes keep serving
    broken = inventory(
        tb,
        path.with_name("broken.yaml"),
        tag=tag,
        prefill=["p1"],
        decode=["d1", "d2", "d3"],
        decode_env={"STANDIN_CRASH_AT_START": "oom"},
    )
    case = change_under_load(tb, "crash", "rolling", broken, [])
    assert case.rc == 1, case.output
    assert "roll stopped at step" in case.output, case.output
    assert "old configuration" in case.output, case.output
    assert case.served > 0 and case.router_kept
    # the re-run with the good inventory finishes: nothing left to do afterwards
    res = cli("up", str(path), "--no-speed")
    assert res.returncode == 0, res.stdout + res.stderr
    assert plan(cli, path)[0] == 0
    assert cli("down", str(path)).returncode == 0
