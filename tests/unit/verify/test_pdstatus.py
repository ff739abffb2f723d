"""The P/D part of `status`: per-engine metrics from vLLM 0.33's real names, totals vs a
--watch window, spread and flags, the table at 80 columns, --json, and the --watch loop."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from rich.console import Console

from pdboot import events as ev
from pdboot.deploy import status as status_mod
from pdboot.plan.build import build_plan
from pdboot.transport.http import HttpAnswer
from pdboot.verify.metrics import EngineFacts
from pdboot.verify.pdstatus import pd_status, scrape
from pdboot.views.status import pd_table, print_status, status_json
from tests.unit.orchestrator_fakes import Recorder, World, inventory, run_up
from tests.unit.verify.test_metrics import exposition

# two prefill and two decode engines
TWO_BY_TWO = inventory(
    {
        "prefill.hosts": ["p1", "r"],
        "decode.hosts": ["d1", "p2"],
        "hosts.p2": {"address": "192.0.2.13"},
    }
)
PLAN = build_plan(TWO_BY_TWO)


def _fetch(texts: dict[str, str]) -> Any:
    urls = {s.url: s.key for s in PLAN.services()}

    def fetch(url: str, **_: Any) -> HttpAnswer:
        key = next(k for u, k in urls.items() if url.startswith(u))
        if key not in texts:
            return HttpAnswer(0, "", "connection refused")
        return HttpAnswer(200, texts[key])

    return fetch


def healthy_texts(n: int = 4) -> dict[str, str]:
    mb = 30e6
    return {
        "prefill@p1": exposition(success=n, ttft=[0.05] * n, expired=0),
        "prefill@r": exposition(success=n),
        "decode@d1": exposition(
            success=n,
            xfers=[(mb, 0.01)] * n,
            ttft=[0.08] * n,
            itl=[0.02] * (10 * n),
            by_source={"external_kv_transfer": 100 * n, "local_compute": n},
        ),
        "decode@p2": exposition(
            success=n,
            xfers=[(mb, 0.01)] * n,
            by_source={"external_kv_transfer": 100 * n, "local_compute": n},
        ),
    }


def test_totals_per_engine_with_spread_and_no_flags() -> None:
    now = scrape(PLAN, _fetch(healthy_texts()))
    pd = pd_status(PLAN, now)
    assert pd.window_seconds is None and pd.flags == ()
    rows = {e.service: e for e in pd.engines}
    d1 = rows["decode@d1"]
    assert (d1.requests, d1.kv_transfers, d1.kv_megabytes) == (4, 4, 120.0)
    assert d1.ttft is not None and d1.ttft["p50"] is not None and 0.06 < d1.ttft["p50"] <= 0.08
    assert d1.itl is not None and d1.itl["p99"] is not None and d1.itl["p99"] <= 0.025
    assert rows["prefill@r"].ttft == {"p50": None, "p90": None, "p99": None}
    assert {s.tier: s.requests for s in pd.spread} == {
        "prefill": {"prefill@p1": 4, "prefill@r": 4},
        "decode": {"decode@d1": 4, "decode@p2": 4},
    }


def test_flags_recompute_failures_expired_idle_prefill_and_pinning() -> None:
    texts = {
        "prefill@p1": exposition(success=0, expired=2),
        "prefill@r": exposition(success=0),
        "decode@d1": exposition(success=6, failed=3, by_source={"local_compute": 600}),
        "decode@p2": exposition(success=0),
    }
    pd = pd_status(PLAN, scrape(PLAN, _fetch(texts)))
    codes = {f.code for f in pd.flags}
    assert codes == {
        "decode_recomputes",
        "kv_transfer_failed",
        "kv_lease_expired",
        "prefill_idle",
        "tier_pinned",
    }
    assert all(f.message for f in pd.flags)


def test_watch_window_is_the_delta_and_judges_only_it() -> None:
    before = scrape(PLAN, _fetch(healthy_texts(4)))
    texts = healthy_texts(4)
    # since then decode@d1 served 6 more requests straight (recomputing), none via prefill
    texts["decode@d1"] = exposition(
        success=10,
        xfers=[(30e6, 0.01)] * 4,
        by_source={"external_kv_transfer": 400, "local_compute": 4 + 600},
    )
    pd = pd_status(PLAN, scrape(PLAN, _fetch(texts)), before, 5.0)
    assert pd.window_seconds == 5.0
    rows = {e.service: e for e in pd.engines}
    assert rows["decode@d1"].requests == 6 and rows["decode@d1"].kv_transfers == 0
    assert {f.code for f in pd.flags} >= {"decode_recomputes", "prefill_idle"}
    # the totals alone would not have flagged the idle prefill pool
    assert "prefill_idle" not in {
        f.code for f in pd_status(PLAN, scrape(PLAN, _fetch(texts))).flags
    }


def test_an_engine_that_restarted_between_scrapes_shows_its_new_totals() -> None:
    before = scrape(PLAN, _fetch(healthy_texts(9)))
    pd = pd_status(PLAN, scrape(PLAN, _fetch(healthy_texts(2))), before, 5.0)
    assert {e.requests for e in pd.engines} == {2}


def test_unreadable_metrics_are_a_row_not_a_crash() -> None:
    texts = healthy_texts()
    del texts["decode@p2"]
    pd = pd_status(PLAN, scrape(PLAN, _fetch(texts)))
    row = next(e for e in pd.engines if e.service == "decode@p2")
    assert not row.scraped and "connection refused" in row.error
    assert isinstance(scrape(PLAN, _fetch(texts))["decode@d1"], EngineFacts)


def test_table_fits_80_columns_and_json_carries_it() -> None:
    pd = pd_status(PLAN, scrape(PLAN, _fetch(healthy_texts())))
    out = Console(width=80, file=io.StringIO(), record=True)
    out.print(pd_table(pd))
    text = out.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "decode@d1" in text and "70/78/80" in text and "120" in text
    assert "totals since start" in text.splitlines()[0]
    report = ev.StatusReport("demo", "http://x/v1", True, (), pd)
    doc = json.loads(status_json(report))
    d1 = next(e for e in doc["pd"]["engines"] if e["service"] == "decode@d1")
    assert d1["kv_transfers"] == 4 and d1["ttft"]["p50"] is not None
    assert doc["pd"]["spread"][1]["requests"] == {"decode@d1": 4, "decode@p2": 4}
    out = Console(width=80, file=io.StringIO(), record=True)
    print_status(out, report)
    assert "decode spread: decode@d1 4, decode@p2 4" in out.export_text()


def test_status_watch_reports_until_ctrl_c_with_deltas() -> None:
    world = World(inventory())
    assert run_up(world)[0] == 0
    rec = Recorder()
    naps: list[float] = []

    def sleep(s: float) -> None:
        naps.append(s)
        if len(naps) == 2:
            raise KeyboardInterrupt
        world.kv_pulls += 3  # three more pulls on the decode between reports

    code = status_mod.status(
        world.inv, rec, hosts_factory=world.hosts, fetch=world.fetch, watch=2.0, sleep=sleep
    )
    assert code == 0 and naps == [2.0, 2.0]
    reports = rec.of(ev.StatusReport)
    assert len(reports) == 2 and rec.of(ev.Done)[-1].exit_code == 0
    first, second = (r.pd for r in reports)
    assert first.window_seconds is None and second.window_seconds is not None
    dec = next(e for e in second.engines if e.service == "decode@d1")
    assert dec.kv_transfers == 3


@pytest.mark.parametrize("watch", [None])
def test_status_once_has_pd_metrics(watch: float | None) -> None:
    world = World(inventory())
    assert run_up(world)[0] == 0
    rec = Recorder()
    assert (
        status_mod.status(world.inv, rec, hosts_factory=world.hosts, fetch=world.fetch, watch=watch)
        == 0
    )
    (report,) = rec.of(ev.StatusReport)
    assert {e.service for e in report.pd.engines} == {"prefill@p1", "decode@d1"}
