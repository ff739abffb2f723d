"""A restart has a typed cause (plan/converge.Cause): rolling.py restarts a decode rather
than replaces it on the cause converge sets, never on the words of its reason. Nor do other
decisions of plan/ and deploy/ read message text: render places an unresolved line by its
host, deregistering reads the router's error code."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pdboot.plan.build import build_plan
from pdboot.plan.converge import Cause, Observed, decode_restarts, orphans, plan_up
from pdboot.plan.model import Plan
from pdboot.plan.render import render_host
from pdboot.plan.rolling import plan_roll
from tests.unit.plan.test_rolling_planner import inv, plan, running


def _prefill_env_change() -> tuple[Plan, list[Observed]]:
    now = running(plan())
    return build_plan(inv(overrides={"prefill.env": {"X": "1"}})), now


def test_converge_sets_each_steps_cause_where_it_says_why() -> None:
    wanted, now = _prefill_env_change()
    first = plan_up(wanted, now, live=True)
    by_key = {s.service.key: s for st in first for s in st}
    assert by_key["prefill@p1"].cause is Cause.CONFIG_CHANGED
    assert by_key["decode@d1"].cause is Cause.SAME and by_key["decode@d1"].kind == "unchanged"
    restarts = decode_restarts(first)
    assert [s.cause for s in restarts] == [Cause.NIXL_STATE, Cause.NIXL_STATE]
    fresh = plan_up(plan(), [])
    assert {s.cause for st in fresh for s in st} == {Cause.NOT_RUNNING}


def test_the_roll_action_follows_the_cause_not_the_reason_text() -> None:
    wanted, now = _prefill_env_change()
    first = plan_up(wanted, now, live=True)
    restarts = decode_restarts(first)
    gone = orphans(wanted, now)
    # the words changed, the cause kept: still a restart
    reworded = [replace(s, reason="reworded for operators") for s in restarts]
    r = plan_roll(wanted, first, reworded, gone, rolling=True)
    assert [s.action for s in r.steps][-2:] == ["restart", "restart"]
    assert r.steps[-1].reason == "reworded for operators"
    # the words of a NIXL restart on a step whose cause is a config change: a replace
    mimic = [replace(s, cause=Cause.CONFIG_CHANGED) for s in restarts]
    assert "NIXL state" in mimic[0].reason
    r2 = plan_roll(wanted, first, mimic, gone, rolling=True)
    assert [s.action for s in r2.steps][-2:] == ["replace", "replace"]


def test_render_places_an_unresolved_line_by_its_host_not_its_words() -> None:
    p = build_plan(
        inv(
            decode="d1",
            overrides={"prefill.engines_per_host": "all", "prefill.tensor_parallel_size": 1},
        )
    )
    assert [h for h, _ in p.unresolved_on] == ["p1", "p2"]
    assert [line for _, line in p.unresolved_on] == list(p.unresolved)
    on_p1 = render_host(p, "p1")
    assert "Needs preflight's facts: prefill on p1:" in on_p1
    assert "prefill on p2:" not in on_p1


def test_deregistering_reads_the_routers_error_code_not_its_message() -> None:
    from pdboot.deploy.router_api import RouterApiError, RouterWorkerApi
    from pdboot.transport.http import HttpAnswer

    def api(status: int, body: str) -> RouterWorkerApi:
        return RouterWorkerApi("http://r:8000", lambda *_a, **_k: HttpAnswer(status, body))

    gone = '{"error":"Worker with URL x not found","code":"WORKER_NOT_FOUND"}'
    assert api(400, gone).remove("http://x:1") is False
    # the words without the code: an error, not "was not registered"
    with pytest.raises(RouterApiError):
        api(400, '{"error":"NOT_FOUND in words","code":"BAD_REQUEST"}').remove("http://x:1")
    with pytest.raises(RouterApiError):
        api(404, "NOT_FOUND").remove("http://x:1")
