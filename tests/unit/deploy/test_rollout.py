"""`up` on a running 2P2D deployment through the fake hosts and clock (orchestrator_fakes):
changes roll through the running router (registered and deregistered over its worker API),
engines drain before they stop, `--plan` changes nothing, a failing replacement stops the
roll with the old engines serving, and a re-run finishes it."""

from __future__ import annotations

import urllib.parse
from typing import Any

from pdboot import events as ev
from pdboot.deploy.router_api import plan_workers
from pdboot.deploy.up_options import UpOptions
from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from tests.unit.builders import ROLL_HOSTS, inventory
from tests.unit.orchestrator_fakes import Recorder, World, run_up, up_in

HOSTS = ROLL_HOSTS
FAST = {
    "timeouts": {
        "ready_seconds": 60,
        "router_ready_seconds": 30,
        "poll_interval_seconds": 0.5,
        "drain_seconds": 20,
    },
    "weights": {"stage": False},  # staging: weights/test_pin_and_verdicts.py, e2e's staged once
}
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."


def inv(
    tag: str = "v0.33.0", prefill: str = "p1, p2", decode: str = "d1, d2", **overrides: Any
) -> Inventory:
    """The tiers as host lists ("p1, p2"), then ``overrides`` (builders.changed's paths)."""
    return inventory(
        HOSTS,
        prefill.split(", "),
        decode.split(", "),
        image=f"vllm/vllm-openai:{tag}",
        overrides={**FAST, **overrides},
    )


def deployed() -> World:
    world = World(inv())
    code, _ = run_up(world)
    assert code == 0
    assert world.registered == plan_workers(build_plan(world.inv))
    world.calls.clear()
    world.locks.clear()
    return world


def router_id(world: World) -> str:
    (router,) = world.of_role("router")
    return router.id


def sequence(world: World) -> list[str]:
    """compose up, stop, the routers' worker calls (the spare's prefixed "spare") and the
    router swap's moves, in order."""
    out = []
    for op, host, what in world.calls:
        if op == "compose_up":
            out.append(f"up {what}@{host}")
        elif op == "stop_remove":
            out.append(f"stop @{host}")
        elif op in ("router", "spare") and host != "GET":
            url = urllib.parse.unquote(what.removeprefix("/workers").lstrip("/"))
            out.append(f"{'spare ' if op == 'spare' else ''}{host} {url}".strip())
        elif op == "swap":
            out.append(what)
    return out


def test_a_new_image_rolls_one_engine_at_a_time_through_the_running_router() -> None:
    world = deployed()
    router = router_id(world)
    world.inv = inv("v0.33.0-rebuild")
    code, rec = run_up(world)
    assert code == 0
    seq = [x for x in sequence(world) if not x.startswith("POST")]
    assert seq == [
        "DELETE http://192.0.2.10:8200",
        "up prefill@p1",
        "DELETE http://192.0.2.13:8200",
        "up prefill@p2",
        "DELETE http://192.0.2.11:8201",
        "up decode@d1",
        "DELETE http://192.0.2.14:8201",
        "up decode@d2",
    ]
    assert router_id(world) == router
    assert world.registered == plan_workers(build_plan(world.inv))
    steps = rec.of(ev.RollPlanned)
    assert [s.services for s in steps] == [
        ("prefill@p1",),
        ("prefill@p2",),
        ("decode@d1",),
        ("decode@d2",),
    ]
    assert all(s.endpoint_up for s in steps)


def test_an_engine_is_stopped_only_once_its_requests_finished() -> None:
    world = deployed()
    world.in_flight["http://192.0.2.10:8200"] = 6  # six /metrics reads before it reads 0
    t0 = world.clock.now()
    world.inv = inv("v0.33.0-rebuild", prefill="p1, p2")
    assert run_up(world)[0] == 0
    drained = [e for e in world.calls if e[0] == "compose_up"]
    assert drained[0][2] == "prefill"
    assert world.clock.now() - t0 >= 2.5  # 6 reads at 0.5 s, then the settle read
    assert world.in_flight["http://192.0.2.10:8200"] == 0


def test_an_added_decode_host_is_registered_and_the_router_stays() -> None:
    world = deployed()
    router = router_id(world)
    world.inv = inv(decode="d1, d2, d3")
    code, _rec = run_up(world)
    assert code == 0
    assert sequence(world) == ["up decode@d3", "POST http://192.0.2.15:8201"]
    assert router_id(world) == router and world.registered["http://192.0.2.15:8201"] == "decode"


def test_a_removed_prefill_host_is_deregistered_drained_then_stopped() -> None:
    world = deployed()
    router = router_id(world)
    world.in_flight["http://192.0.2.13:8200"] = 3
    world.inv = inv(prefill="p1")
    code, rec = run_up(world)
    assert code == 0
    assert sequence(world) == ["DELETE http://192.0.2.13:8200", "stop @p2"]
    assert world.in_flight["http://192.0.2.13:8200"] == 0  # drained before the stop
    assert router_id(world) == router
    assert "http://192.0.2.13:8200" not in world.registered
    drained = [e.detail for e in rec.of(ev.RollProgress) if e.phase == "drained"]
    assert drained and "drained in" in drained[0]


def test_plan_shows_the_steps_and_changes_nothing() -> None:
    world = deployed()
    code, rec = run_up(world, UpOptions(plan_only=True))
    assert code == 0 and not rec.of(ev.RollPlanned)
    world.inv = inv("v0.33.0-rebuild", decode="d1, d2, d3")
    code, _ = run_up(world, UpOptions(plan_only=True))
    assert code == 0  # as terraform plan: changes are a success unless asked
    code, rec = run_up(world, UpOptions(plan_only=True, detailed_exitcode=True))
    assert code == 2
    assert [(s.action, s.services) for s in rec.of(ev.RollPlanned)] == [
        ("add", ("decode@d3",)),
        ("replace", ("prefill@p1",)),
        ("replace", ("prefill@p2",)),
        ("replace", ("decode@d1",)),
        ("replace", ("decode@d2",)),
    ]
    assert rec.of(ev.RollPlanned)[1].capacity == ("prefill 1/2", "decode 3/3")
    assert not [c for c in world.calls if c[0] in ("pull", "ship", "compose_up", "stop_remove")]
    assert world.locks == []  # --plan takes no lock


def test_a_tier_of_one_goes_through_degraded_mode_and_nothing_is_asked() -> None:
    """1 prefill x 1 decode to an image with the same build: a roll would take each tier,
    and the endpoint, down in turn (an outage asked with --yes before); through degraded
    mode the other tier serves alone while each is replaced."""
    world = World(inv(prefill="p1", decode="d1"))
    assert run_up(world)[0] == 0
    world.calls.clear()
    world.inv = inv("v0.33.0-rebuild", prefill="p1", decode="d1")
    asked: list[list[str]] = []
    rec = Recorder()
    code = up_in(world, UpOptions(skip_preflight=True), rec, confirm=confirm_into(asked))
    notes = [n.message for n in rec.of(ev.Note)]
    assert code == 0 and asked == [], notes
    assert not any("cannot roll" in n for n in notes)
    path = next(n for n in notes if n.startswith("upgrade path:"))
    assert "through degraded mode" in path and "a roll would take down" in path, path
    phases = [n for n in notes if n.startswith("degraded upgrade phase")]
    assert len(phases) == 6 and "starts with its new settings" in phases[1], phases
    started = {what for op, _h, what in world.calls if op == "compose_up"}
    assert any("prefill" in w for w in started) and any("decode" in w for w in started)
    assert world.registered == plan_workers(build_plan(world.inv))
    assert {e.service: e.action for e in rec.of(ev.ServiceAction)}["decode@d1"] == "recreate"


def test_a_decode_change_of_one_prefill_one_decode_keeps_the_prefill_running() -> None:
    """Only the decode changes: the prefill serves alone while it is replaced (4 phases);
    the prefill is not restarted."""
    world = World(inv(prefill="p1", decode="d1"))
    assert run_up(world)[0] == 0
    (prefill,) = world.of_role("prefill")
    world.inv = inv(prefill="p1", decode="d1", **{"decode.extra_args": ["--max-model-len", "4096"]})
    rec = Recorder()
    assert up_in(world, UpOptions(skip_preflight=True), rec, confirm=None) == 0
    phases = [n.message for n in rec.of(ev.Note) if n.message.startswith("degraded upgrade phase")]
    assert [p.split(":", 1)[1].strip()[:40] for p in phases] == [
        "the router serves the old prefill tier a",
        "the decode tier drains, stops and starts",
        "every new prefill->decode pair proven (a",
        "P/D again: the router serves the new pre",
    ], phases
    assert world.of_role("prefill")[0].id == prefill.id
    assert world.registered == plan_workers(build_plan(world.inv))


def confirm_into(asked: list[list[str]]) -> Any:
    def confirm(outages: list[str]) -> bool:
        asked.append(outages)
        return True

    return confirm


def test_a_failing_replacement_stops_the_roll_and_a_rerun_finishes_it() -> None:
    world = deployed()
    world.crash = {"prefill": OOM}
    world.inv = inv("v0.33.0-rebuild")
    code, rec = run_up(world)
    assert code == 1
    (stopped,) = rec.of(ev.RollStopped)
    rows = dict(stopped.engines)
    assert rows["prefill@p1"] == "not running" or "failed" in rows["prefill@p1"]
    assert rows["prefill@p2"].startswith("old configuration")
    assert rows["decode@d1"].startswith("old configuration")
    # the old engines still serve through the router; the failed one is out of it
    assert "http://192.0.2.13:8200" in world.registered
    assert "http://192.0.2.10:8200" not in world.registered
    assert not [c for c in world.calls if c[0] == "compose_up" and c[1] != "p1"]

    world.crash = {}
    world.calls.clear()
    code, rec = run_up(world)
    assert code == 0
    assert world.registered == plan_workers(build_plan(world.inv))
    hashes = {s.key: s.config_hash for s in build_plan(world.inv).services()}
    assert {c.labels["io.pdboot.config-hash"] for c in world.containers.values()} == set(
        hashes.values()
    )


def test_a_router_setting_recreates_it_and_says_the_short_outage() -> None:
    world = deployed()
    router = router_id(world)
    world.inv = inv(**{"router.request_timeout_secs": 600})
    code, rec = run_up(world)
    assert code == 0 and router_id(world) != router
    (action,) = [a for a in rec.of(ev.ServiceAction) if a.service == "router@r"]
    assert action.action == "recreate" and "short outage" in action.reason
    (step,) = rec.of(ev.RollPlanned)
    assert step.action == "router" and not step.endpoint_up and "router restarts" in step.outage
    # the new router knows no engine until pdboot registers them all
    assert world.registered == plan_workers(build_plan(world.inv))
    # the proxy applies request_timeout_secs too: its nginx.conf changed with it
    assert [c[2] for c in world.calls if c[0] == "compose_up" and c[2] != "router"] == ["proxy"]


def test_no_rolling_with_live_workers_deregisters_a_removed_engine() -> None:
    world = deployed()
    world.inv = inv(prefill="p1")
    code, rec = run_up(world, UpOptions(skip_preflight=True, rolling=False))
    assert code == 0
    assert world.registered == plan_workers(build_plan(world.inv))
    assert [e.action for e in rec.of(ev.RollPlanned)] == ["together"]


def test_a_new_pair_that_refuses_kv_undoes_its_step_and_stops_the_roll() -> None:
    """Issue 29: a build the probe cannot tell apart (the fake's version answer is the same
    for both tags) whose engines still refuse the old ones' KV, as a nightly does: the new
    prefill is probed with every decode before the router may send it a client; its pairs
    fail, so the old prefill comes back from the kept compose file, serves again, and the
    roll stops with exit 1 before touching another engine."""
    world = deployed()
    world.hash_checks, world.previous_inv = True, world.inv
    world.inv = inv("v0.33.0-rebuild")
    code, rec = run_up(world)
    assert code == 1
    assert [x for x in sequence(world) if not x.startswith("POST")] == [
        "DELETE http://192.0.2.10:8200",
        "up prefill@p1",  # never registered: its pairs are probed first
        "up prefill (compose.previous.yaml)@p1",
    ]
    seq = sequence(world)  # p1 registered only after the old one came back
    assert seq.index("POST http://192.0.2.10:8200") > seq.index(
        "up prefill (compose.previous.yaml)@p1"
    )
    pairs = [e.detail for e in rec.of(ev.RollProgress) if e.phase == "pair"]
    assert len(pairs) == 2 and all("FAILED" in p for p in pairs), pairs
    assert world.registered == plan_workers(build_plan(world.previous_inv))
    builds = {c.host: c.build for c in world.containers.values() if c.host != "r"}
    assert set(builds.values()) == {world.previous_inv.image}, builds
    (stopped,) = rec.of(ev.RollStopped)
    assert dict(stopped.engines)["prefill@p1"].startswith("old configuration")
    assert rec.of(ev.Diagnosis), "the failed pair's logs are read for a diagnosis"


def test_pairs_of_one_build_pass_and_the_roll_goes_on() -> None:
    world = deployed()
    world.hash_checks, world.previous_inv = True, world.inv
    world.inv = inv(**{"decode.extra_args": ["--max-num-seqs", "8"]})
    code, rec = run_up(world)
    assert code == 0
    pairs = [e.detail for e in rec.of(ev.RollProgress) if e.phase == "pair"]
    assert len(pairs) == 4 and not [p for p in pairs if "FAILED" in p], pairs


def test_a_new_vllm_build_with_a_tier_of_one_goes_through_degraded_mode_unasked() -> None:
    """Issue 43: the running engines answer 0.33.0, the new image's parser 0.34.0: a roll
    would pair the two builds, and a tier of one leaves no half for blue/green, so `up` goes
    through degraded mode without asking: the old decode alone (plain), the prefill replaced,
    the new prefill alone (plain), the decode replaced, the new pair proven, P/D again; the
    degraded phases on the spare router, so the home router's list changes only while no
    client reaches it."""
    world = World(inv(prefill="p1", decode="d1"))
    assert run_up(world)[0] == 0
    world.calls.clear()
    world.running_version = "0.33.0"
    world.hash_checks = True  # a decode refuses KV from another build, as NIXL does
    world.inv = inv("v0.34.0", prefill="p1", decode="d1")
    code, rec = run_up(world)
    assert code == 0
    notes = [n.message for n in rec.of(ev.Note)]
    assert any(
        "upgrade path: through degraded mode" in n
        and "vLLM version 0.33.0 -> 0.34.0" in n
        and "the prefill tier and the decode tier each have one engine" in n
        for n in notes
    ), notes
    assert sequence(world) == [
        "start spare",
        "spare POST http://192.0.2.11:8201/.",  # the old decode as a plain worker
        "proxy -> spare",  # clients reach the spare; home keeps its P/D list, unreached
        "stop @p1",
        "up prefill@p1",
        "spare POST http://192.0.2.10:8200/.",  # the new prefill alone
        "spare DELETE http://192.0.2.11:8201/.",
        "stop @d1",
        "up decode@d1",
        "DELETE http://192.0.2.10:8200",  # the idle home's entries registered anew
        "DELETE http://192.0.2.11:8201",
        "POST http://192.0.2.10:8200",
        "POST http://192.0.2.11:8201",
        "proxy -> home",  # P/D again
        "stop spare",
    ]
    assert world.spare is None and world.route == "home"
    assert world.registered == plan_workers(build_plan(world.inv))
    assert any("P/D again after" in n and "s degraded" in n for n in notes), notes
    assert any("pair prefill@p1 -> decode@d1" in n for n in notes), notes
    assert not rec.of(ev.RollPlanned)


def test_a_new_prefill_that_does_not_start_leaves_the_old_decode_serving_alone() -> None:
    """Phase 2 fails (the new build's prefill dies at start): `up` exits 1 and says the
    endpoint serves from the old decode alone; the router lists its plain entry only, never
    a P/D entry beside it (that would route P/D to a pair that cannot serve)."""
    world = World(inv(prefill="p1", decode="d1"))
    assert run_up(world)[0] == 0
    world.running_version = "0.33.0"
    world.inv = inv("v0.34.0", prefill="p1", decode="d1")
    world.crash["prefill"] = OOM
    code, rec = run_up(world)
    assert code == 1
    notes = [n.message for n in rec.of(ev.Note)]
    assert any(
        "degraded upgrade stopped: the new prefill tier did not start" in n
        and "degraded: the decode tier alone" in n
        for n in notes
    ), notes
    # served through the spare router; the home router, unreached, keeps its P/D list
    assert world.route == "spare"
    assert world.spare == {"http://192.0.2.11:8201/.": "regular"}
    assert [c.build for c in world.of_role("decode")] == ["vllm/vllm-openai:v0.33.0"]


def test_an_outage_for_a_new_build_is_taken_only_when_asked_with_no_rolling() -> None:
    world = World(inv(prefill="p1", decode="d1"))
    assert run_up(world)[0] == 0
    world.calls.clear()
    world.running_version = "0.33.0"
    world.inv = inv("v0.34.0", prefill="p1", decode="d1")
    code, rec = run_up(world, UpOptions(skip_preflight=True, rolling=False, yes=True))
    assert code == 0
    assert next(s.action for s in rec.of(ev.RollPlanned)) == "together"  # all at once
    assert not [c for c in world.calls if c[0] == "router" and c[2].endswith("%2F")]
    assert world.registered == plan_workers(build_plan(world.inv))


def test_the_same_build_under_another_tag_still_rolls() -> None:
    world = deployed()  # running 0.34.0 (the fake's default), the new tag's parser 0.34.0
    world.inv = inv("v0.33.0-rebuild")
    code, rec = run_up(world)
    assert code == 0
    notes = [n.message for n in rec.of(ev.Note)]
    assert any("upgrade path: roll engine by engine" in n for n in notes), notes
    assert len([c for c in world.calls if c[0] == "exec_version"]) == 4


def test_plan_says_which_path_and_why() -> None:
    """`up --plan`: a same-build change rolls; a new build (running 0.33.0, the image
    answers 0.34.0) goes blue/green, its five phases and the factor named; nothing changes."""
    world = deployed()
    world.inv = inv("v0.33.0-rebuild")
    code, rec = run_up(world, UpOptions(plan_only=True, detailed_exitcode=True))
    notes = [n.message for n in rec.of(ev.Note)]
    assert code == 2 and any("upgrade path: roll engine by engine" in n for n in notes), notes
    world.running_version = "0.33.0"
    code, rec = run_up(world, UpOptions(plan_only=True, detailed_exitcode=True))
    notes = [n.message for n in rec.of(ev.Note)]
    assert code == 2
    assert any("upgrade path: blue/green" in n and "0.33.0 -> 0.34.0" in n for n in notes), notes
    phases = [n for n in notes if n.strip().startswith("phase ")]
    assert len(phases) == 5 and all("endpoint up" in p for p in phases), phases
    assert "clients on green (prefill 1/2, decode 1/2)" in phases[2], phases
    assert not rec.of(ev.RollPlanned)  # the phases are the steps
    assert not [c for c in world.calls if c[0] in ("pull", "ship", "compose_up", "stop_remove")]


def test_plan_with_an_image_not_pulled_yet_shows_the_roll_and_the_condition() -> None:
    world = deployed()
    world.image_version = ""  # `up --plan` pulls nothing: the new image cannot answer
    world.inv = inv("v0.33.0-rebuild")
    code, rec = run_up(world, UpOptions(plan_only=True, detailed_exitcode=True))
    notes = [n.message for n in rec.of(ev.Note)]
    assert code == 2
    assert any("roll engine by engine if the new image holds" in n for n in notes), notes
    assert {s.action for s in rec.of(ev.RollPlanned)} == {"replace"}
