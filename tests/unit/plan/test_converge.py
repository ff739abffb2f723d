"""Observed containers + plan -> steps (create / recreate / unchanged), and teardown order."""

from __future__ import annotations

import dataclasses
from typing import Any

from pdboot.plan.build import build_plan
from pdboot.plan.converge import (
    Observed,
    decode_restarts,
    orphans,
    plan_down,
    plan_up,
    started,
    with_restarts,
)
from pdboot.plan.model import (
    LABEL_CONFIG_HASH,
    LABEL_DEPLOYMENT,
    LABEL_HOST,
    LABEL_ROLE,
    Plan,
    Service,
)
from tests.unit.builders import inventory


def _plan(**kw: Any) -> Plan:
    """The plan of builders.inventory(**kw): 1P1D, p1 -> d1, router on r."""
    return build_plan(inventory(**kw))


def _obs(
    svc: Service, *, hash_: str | None = None, state: str = "running", dep: str = "demo"
) -> Observed:
    return Observed(
        host=svc.host,
        id=f"id-{svc.key}",
        name=f"pdboot-demo-{svc.role}",
        labels={
            LABEL_DEPLOYMENT: dep,
            LABEL_ROLE: svc.role,
            LABEL_HOST: svc.host,
            LABEL_CONFIG_HASH: hash_ or svc.config_hash,
        },
        state=state,
    )


def _kinds(stages) -> list[list[str]]:
    return [[f"{s.service.key}:{s.kind}" for s in stage] for stage in stages]


def test_nothing_running_creates_everything_in_order() -> None:
    assert _kinds(plan_up(_plan(), [])) == [
        ["decode@d1:create"],
        ["prefill@p1:create"],
        ["router@r:create"],
        ["proxy@r:create"],
    ]


def test_same_hashes_change_nothing() -> None:
    plan = _plan()
    obs = [_obs(s) for s in plan.services()]
    assert _kinds(plan_up(plan, obs)) == [
        ["decode@d1:unchanged"],
        ["prefill@p1:unchanged"],
        ["router@r:unchanged"],
        ["proxy@r:unchanged"],
    ]


def test_decode_only_change_recreates_decode_and_router_not_prefill() -> None:
    old = _plan()
    new = _plan(overrides={"decode.extra_args": ["--max-model-len", "4096"]})
    obs = [_obs(s) for s in old.services()]
    stages = plan_up(new, obs)
    assert _kinds(stages) == [
        ["decode@d1:recreate"],
        ["prefill@p1:unchanged"],
        ["router@r:recreate"],
        ["proxy@r:unchanged"],
    ]
    assert "configuration changed" in stages[0][0].reason
    assert "workers" in stages[2][0].reason


def test_exited_container_is_recreated() -> None:
    plan = _plan()
    obs = [_obs(s, state="exited" if s.role == "prefill" else "running") for s in plan.services()]
    stages = plan_up(plan, obs)
    assert stages[1][0].kind == "recreate" and "exited" in stages[1][0].reason


def test_other_deployments_and_unlabelled_containers_are_ignored() -> None:
    plan = _plan()
    foreign = [_obs(s, dep="other") for s in plan.services()]
    foreign.append(Observed(host="d1", id="x", name="someone-elses", labels={}, state="running"))
    assert _kinds(plan_up(plan, foreign))[0] == ["decode@d1:create"]
    assert plan_down("demo", foreign) == []


def test_down_order_router_prefill_decode() -> None:
    plan = _plan()
    obs = [_obs(s) for s in plan.services()]
    assert [role for role, _ in plan_down("demo", obs)] == ["proxy", "router", "prefill", "decode"]


def test_partial_deployment_down_only_has_what_exists() -> None:
    plan = _plan()
    obs = [_obs(plan.decode_engines[0])]
    assert [(r, [o.id for o in b]) for r, b in plan_down("demo", obs)] == [
        ("decode", ["id-decode@d1"])
    ]


def test_orphans_when_a_host_leaves_a_tier() -> None:
    old = _plan(decode=["d1", "r"])
    new = _plan()
    obs = [_obs(s) for s in old.services()]
    assert [o.key for o in orphans(new, obs)] == ["decode@r"]


def test_decode_restarts_when_prefill_restarts_under_running_decodes() -> None:
    plan = _plan()
    # prefill's config changed (or it crashed), decode kept running: decode restarts too
    changed = [_obs(s, hash_="old" if s.role == "prefill" else None) for s in plan.services()]
    first = plan_up(plan, changed)
    (step,) = decode_restarts(first)
    assert (step.service.key, step.kind) == ("decode@d1", "recreate")
    assert "prefill@p1" in step.reason and "NIXL" in step.reason
    assert _kinds(with_restarts(first, [step])) == [
        ["decode@d1:recreate"],
        ["prefill@p1:recreate"],
        ["router@r:recreate"],
        ["proxy@r:unchanged"],
    ]
    exited = [
        _obs(s, state="exited" if s.role == "prefill" else "running") for s in plan.services()
    ]
    assert len(decode_restarts(plan_up(plan, exited))) == 1
    # a prefill removed (`down` of part) and created again by this `up`
    gone = [_obs(s) for s in plan.services() if s.role != "prefill"]
    assert [s.service.key for s in decode_restarts(plan_up(plan, gone))] == ["decode@d1"]
    # nothing changed, a fresh deployment, or decode restarted along with prefill: none
    assert decode_restarts(plan_up(plan, [_obs(s) for s in plan.services()])) == []
    assert decode_restarts(plan_up(plan, [])) == []
    both = [_obs(s, hash_="old" if s.role != "router" else None) for s in plan.services()]
    assert _kinds(plan_up(plan, both))[:2] == [["decode@d1:recreate"], ["prefill@p1:recreate"]]
    assert decode_restarts(plan_up(plan, both)) == []
    # only the router changed: the engines did not restart
    router = [_obs(s, hash_="old" if s.role == "router" else None) for s in plan.services()]
    assert decode_restarts(plan_up(plan, router)) == []


def _at(o: Observed, started_at: str) -> Observed:
    return dataclasses.replace(o, started_at=started_at)


def test_prefill_newer_than_decode_makes_it_restart() -> None:
    plan = _plan()
    obs = {s.role: _obs(s) for s in plan.services()}
    dec = _at(obs["decode"], "2026-11-30T10:00:00.123456789Z")
    # the prefill was restarted under the decode an hour later (docker restart, down + up)
    late = [dec, _at(obs["prefill"], "2026-11-30T11:00:00.5Z"), obs["router"]]
    (step,) = decode_restarts(plan_up(plan, late))
    assert "prefill@p1 restarted after it" in step.reason
    # both started by one `up`, seconds apart in either order: nothing to do
    close = [dec, _at(obs["prefill"], "2026-11-30T10:00:05.000000001Z"), obs["router"]]
    assert decode_restarts(plan_up(plan, close)) == []
    older = [dec, _at(obs["prefill"], "2026-11-30T09:00:00Z"), obs["router"]]
    assert decode_restarts(plan_up(plan, older)) == []
    # docker's zero time (never started) or an unparsable value: no claim
    zero = [dec, _at(obs["prefill"], "0001-01-01T00:00:00Z"), obs["router"]]
    assert decode_restarts(plan_up(plan, zero)) == []
    assert started(_at(obs["prefill"], "garbage")) is None
    assert started(_at(obs["prefill"], "2026-11-30T11:00:00+02:00")) is not None


def test_a_prefill_that_joined_beside_running_decodes_restarts_none() -> None:
    """A prefill `up` created after the decodes (a roll, a live add, blue/green's growth: on
    real engines minutes later) started once, when it was created: the decodes hold no state
    for an older process of it. Restarted in place (created earlier, started later, or a
    restart count) it still makes them restart. Found on real vLLM: after a blue/green
    upgrade the next `up` restarted a decode that green's growth had started before a
    prefill."""
    plan = _plan()
    obs = {s.role: _obs(s) for s in plan.services()}
    dec = _at(obs["decode"], "2026-11-30T10:00:00Z")
    pre = _at(obs["prefill"], "2026-11-30T10:04:10.2Z")
    joined = dataclasses.replace(pre, created="2026-11-30T10:04:09.8Z")
    assert decode_restarts(plan_up(plan, [dec, joined, obs["router"]])) == []
    restarted = dataclasses.replace(pre, created="2026-11-30T09:59:58Z")
    (step,) = decode_restarts(plan_up(plan, [dec, restarted, obs["router"]]))
    assert "prefill@p1 restarted after it" in step.reason
    policy = dataclasses.replace(joined, restart_count=1)
    assert len(decode_restarts(plan_up(plan, [dec, policy, obs["router"]]))) == 1
