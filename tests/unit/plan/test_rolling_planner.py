"""The rolling planner (pdboot.rolling), the router worker API client's pure parts
(pdboot.router_api) and the drain reading (pdboot.drain), with plain values: plans built
from small inventories, observed containers made from them, a real vllm-router 0.1.17
/workers answer and vLLM 0.33 metric names."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pdboot.deploy.drain import drain, parse_load
from pdboot.deploy.router_api import (
    RouterWorkerApi,
    Worker,
    parse_workers,
    plan_workers,
    reconcile,
)
from pdboot.deploy.waits import FakeClock
from pdboot.inventory.load import parse_inventory
from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.plan.converge import Observed, decode_restarts, orphans, plan_up
from pdboot.plan.model import Plan
from pdboot.plan.rolling import RollPlan, plan_roll
from pdboot.transport.http import HttpAnswer
from tests.shared_data import METRICS_JSON
from tests.unit.builders import ROLL_HOSTS, inventory, running_as_planned
from tests.unit.paths import FIXTURES

METRICS = METRICS_JSON  # the copy of ../shared/fixtures/vllm-0.33.0/metrics.json

HOSTS = ROLL_HOSTS


def running(p: Plan) -> list[Observed]:
    """What a host reports for each service of ``p``, running, with its hash label."""
    return running_as_planned(p.services())


def inv(
    tag: str = "v0.33.0",
    prefill: str = "p1, p2",
    decode: str = "d1, d2",
    router: Mapping[str, Any] | None = None,
    hosts: Mapping[str, str] = HOSTS,
    overrides: Mapping[str, Any] | None = None,
) -> Inventory:
    """The tiers as host lists ("p1, p2"), ``router`` its keys beside the host."""
    changes = {f"router.{k}": v for k, v in (router or {}).items()}
    return inventory(
        hosts,
        prefill.split(", "),
        decode.split(", "),
        image=f"vllm/vllm-openai:{tag}",
        overrides={**changes, **(overrides or {})},
    )


def plan(
    tag: str = "v0.33.0",
    prefill: str = "p1, p2",
    decode: str = "d1, d2",
    router: Mapping[str, Any] | None = None,
) -> Plan:
    return build_plan(inv(tag, prefill, decode, router))


def roll(wanted: Plan, now: list[Observed], rolling: bool = True) -> RollPlan:
    first = plan_up(wanted, now, live=rolling)
    return plan_roll(wanted, first, decode_restarts(first), orphans(wanted, now), rolling=rolling)


def table(r: RollPlan) -> list[tuple[str, tuple[str, ...], tuple[str, ...], bool]]:
    return [
        (s.action, s.keys, tuple(c.describe() for c in s.capacity), s.endpoint_up) for s in r.steps
    ]


# --------------------------------------------------------------------------- planner


def test_nothing_to_do_has_no_steps() -> None:
    p = plan()
    assert not roll(p, running_as_planned(p.services())).changes


def test_a_new_image_rolls_prefill_then_decode_one_engine_at_a_time() -> None:
    r = roll(plan("v0.34.0"), running(plan()))
    assert table(r) == [
        ("replace", ("prefill@p1",), ("prefill 1/2", "decode 2/2"), True),
        ("replace", ("prefill@p2",), ("prefill 1/2", "decode 2/2"), True),
        ("replace", ("decode@d1",), ("prefill 2/2", "decode 1/2"), True),
        ("replace", ("decode@d2",), ("prefill 2/2", "decode 1/2"), True),
    ]
    assert all(s.how == "drain, then replace in place" for s in r.steps)
    assert not r.outages
    # the router keeps running: its hash leaves the worker lists out
    assert not [s for s in r.steps if s.action == "router"]


def test_a_prefill_change_restarts_the_decodes_rolling_after_every_prefill() -> None:
    now = running(plan())
    wanted = build_plan(inv(overrides={"prefill.env": {"X": "1"}}))
    r = roll(wanted, now)
    assert [(s.action, s.keys) for s in r.steps] == [
        ("replace", ("prefill@p1",)),
        ("replace", ("prefill@p2",)),
        ("restart", ("decode@d1",)),
        ("restart", ("decode@d2",)),
    ]
    assert "NIXL state" in r.steps[2].reason


def test_an_added_decode_host_surges_and_nothing_else_moves() -> None:
    r = roll(plan(decode="d1, d2, d3"), running(plan()))
    assert table(r) == [("add", ("decode@d3",), ("prefill 2/2", "decode 2/3"), True)]
    assert "surge" in r.steps[0].how


def test_a_removed_prefill_host_is_drained_then_stopped() -> None:
    r = roll(plan(prefill="p1"), running(plan()))
    assert table(r) == [("remove", ("prefill@p2",), ("prefill 1/1", "decode 2/2"), True)]
    (step,) = r.steps
    assert step.how == "deregister, drain, then stop" and [o.key for o in step.drains] == [
        "prefill@p2"
    ]


def test_a_replaced_host_serves_before_the_old_one_leaves() -> None:
    # p2 -> p3: the add comes first (surge), then the removal
    moved = inv(prefill="p1, p3", hosts={**HOSTS, "p3": "192.0.2.16"})
    r = roll(build_plan(moved), running(plan()))
    assert [(s.action, s.keys) for s in r.steps] == [
        ("add", ("prefill@p3",)),
        ("remove", ("prefill@p2",)),
        # converge cannot tell a new prefill from one removed under a running decode: the
        # decodes restart (NIXL state), rolling, one at a time
        ("restart", ("decode@d1",)),
        ("restart", ("decode@d2",)),
    ]
    assert r.steps[1].capacity[0].serving == 2  # p1 + p3 serve while p2 drains
    assert all(s.endpoint_up for s in r.steps)


def test_a_tier_of_one_cannot_roll_and_says_so() -> None:
    r = roll(plan("v0.34.0", prefill="p1", decode="d1"), running(plan(prefill="p1", decode="d1")))
    assert [s.endpoint_up for s in r.steps] == [False, False]
    assert len(r.outages) == 2 and "one engine: it cannot roll" in r.outages[0]
    assert r.steps[0].capacity[0].serving == 0


def test_the_router_is_recreated_only_when_its_own_settings_change() -> None:
    r = roll(plan(router={"internal_port": 8090}), running(plan()))
    (step,) = r.steps
    assert step.action == "router" and not step.endpoint_up and "router restarts" in step.outage
    assert not r.outages  # a router restart is said, not asked for


def test_bringing_back_a_deployment_that_is_down_asks_nothing() -> None:
    # the only prefill was removed under a running decode: it is created, the decode restarts
    now = [o for o in running(plan(prefill="p1", decode="d1")) if o.role != "prefill"]
    r = roll(plan(prefill="p1", decode="d1"), now)
    assert [(s.action, s.keys) for s in r.steps] == [
        ("add", ("prefill@p1",)),
        ("restart", ("decode@d1",)),
    ]
    assert r.steps[1].outage and not r.was_up and r.outages == []


def test_first_up_starts_every_engine_together_then_the_router() -> None:
    r = roll(plan(), [])
    assert [(s.action, len(s.steps)) for s in r.steps] == [("add", 4), ("router", 1)]
    assert r.steps[1].steps[0].kind == "create" and not r.steps[1].outage


def test_no_rolling_is_the_recreate_path_in_one_step() -> None:
    r = roll(plan("v0.34.0"), running(plan()), rolling=False)
    assert [s.action for s in r.steps] == ["together", "router"]  # its workers changed
    assert r.steps[0].capacity[0].serving == 0 and not r.steps[0].endpoint_up


def test_a_data_parallel_tier_restarts_as_a_whole() -> None:
    text = (FIXTURES.parent / "inventories" / "dp.yaml").read_text()
    p = build_plan(parse_inventory(text))
    now = running_as_planned(p.services())
    wanted = build_plan(parse_inventory(text.replace("v0.33.0", "v0.34.0")))
    r = roll(wanted, now)
    (decode,) = [s for s in r.steps if s.tier == "decode"]
    assert decode.keys == ("decode@gpu-a", "decode@gpu-b")  # head + follower, one step
    assert "data-parallel tier restarts as a whole" in decode.outage  # the tier's one worker
    assert any("data-parallel" in n for n in r.notes)


# --------------------------------------------------------------------------- router API


ROUTER_WORKERS = json.dumps(
    {  # vllm-router 0.1.17 --enable-igw, GET /workers (tried)
        "workers": [
            {
                "id": "be06e274",
                "url": "http://127.0.0.1:8100",
                "model_id": "m",
                "priority": 50,
                "cost": 1.0,
                "worker_type": "prefill",
                "is_healthy": True,
                "load": 0,
                "connection_mode": "Http",
                "metadata": {"model_id": "m"},
            },
            {
                "id": "f76759f4",
                "url": "http://127.0.0.1:8200",
                "model_id": "m",
                "priority": 50,
                "cost": 1.0,
                "worker_type": "decode",
                "is_healthy": False,
                "load": 0,
                "connection_mode": "Http",
                "metadata": {"model_id": "m"},
            },
        ],
        "total": 2,
        "stats": {
            "total_workers": 2,
            "healthy_workers": 1,
            "total_models": 1,
            "total_load": 0,
            "by_type": {"regular": 0, "prefill": 1, "decode": 1},
        },
    }
)


def test_parse_workers_reads_the_real_answer() -> None:
    assert parse_workers(ROUTER_WORKERS) == [
        Worker("http://127.0.0.1:8100", "prefill", True, "m"),
        Worker("http://127.0.0.1:8200", "decode", False, "m"),
    ]
    assert parse_workers("not json") == [] and parse_workers('{"workers": 3}') == []


def test_reconcile_removes_extras_then_adds_what_is_missing() -> None:
    present = [*parse_workers(ROUTER_WORKERS), Worker("http://127.0.0.1:8300", "regular", True)]
    wanted = {
        "http://127.0.0.1:8100": "prefill",
        "http://127.0.0.1:8201": "decode",
        "http://127.0.0.1:8300": "decode",
    }
    assert [c.describe() for c in reconcile(wanted, present)] == [
        "deregister decode http://127.0.0.1:8200",
        "deregister regular http://127.0.0.1:8300",  # registered with the wrong type
        "register decode http://127.0.0.1:8201",
        "register decode http://127.0.0.1:8300",
    ]
    assert reconcile(wanted, [Worker(u, t, True) for u, t in wanted.items()]) == []


def test_plan_workers_are_every_engine_by_url() -> None:
    assert plan_workers(plan()) == {
        "http://192.0.2.10:8200": "prefill",
        "http://192.0.2.13:8200": "prefill",
        "http://192.0.2.11:8201": "decode",
        "http://192.0.2.14:8201": "decode",
    }


def test_the_client_sends_what_the_router_takes() -> None:
    sent: list[tuple[str, object, object]] = []
    answers = {
        "DELETE": HttpAnswer(
            400, '{"error":"Worker with URL x not found","code":"WORKER_NOT_FOUND"}'
        )
    }

    def fetch(url: str, *, body: object = None, method: object = None, **_: object) -> HttpAnswer:
        sent.append((url, body, method))
        return answers.get(str(method), HttpAnswer(200, ROUTER_WORKERS))

    api = RouterWorkerApi("http://r:8000/", fetch)
    api.add("http://192.0.2.10:8200", "prefill")
    assert api.remove("http://192.0.2.10:8200") is False  # not registered: not an error
    assert sent == [
        (
            "http://r:8000/workers",
            {"url": "http://192.0.2.10:8200", "worker_type": "prefill"},
            None,
        ),
        ("http://r:8000/workers/http%3A%2F%2F192.0.2.10%3A8200", None, "DELETE"),
    ]


# --------------------------------------------------------------------------- drain


def test_the_drain_reads_vllm_0_33_names() -> None:
    names = {m["name"] for m in json.loads(METRICS.read_text())["metrics"]}
    assert {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_requests_kv_fetch_by_stage",
        "vllm:nixl_num_kv_expired_reqs",
    } <= names
    text = (
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 1.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 4.0\n'
        'vllm:num_requests_kv_fetch_by_stage{engine="0",stage="in_progress"} 1.0\n'
        'vllm:num_requests_kv_fetch_by_stage{engine="0",stage="complete"} 7.0\n'
        'vllm:nixl_num_kv_expired_reqs_total{engine="0"} 3.0\n'
    )
    load = parse_load(text)
    assert (load.running, load.waiting, load.kv_fetching, load.kv_expired) == (3, 4, 1, 3)
    assert not load.idle and parse_load("").idle


def test_a_prefill_waits_for_its_decodes_pulls_within_the_timeout() -> None:
    clock = FakeClock()
    busy_until = {"http://p:1": 2.0, "http://d:1": 5.0}

    def fetch(url: str, **_: object) -> HttpAnswer:
        base = url.removesuffix("/metrics")
        left = clock.now() < busy_until[base]
        if base == "http://p:1":
            return HttpAnswer(200, f"vllm:num_requests_running {1 if left else 0}\n")
        stage = 'vllm:num_requests_kv_fetch_by_stage{stage="in_progress"}'
        return HttpAnswer(200, f"vllm:num_requests_running 9\n{stage} {1 if left else 0}\n")

    r = drain("http://p:1", fetch, clock, timeout=60, interval=0.5, pullers=["http://d:1"])
    assert r.drained and 5.0 <= r.seconds <= 6.0  # the decode's pull, then one more read
    busy_until["http://p:1"] = 1e9  # never idle: the timeout ends the wait
    r = drain("http://p:1", fetch, clock, timeout=1, interval=0.5, pullers=["http://d:1"])
    assert not r.drained and 1.0 <= r.seconds <= 1.5 and "stopped anyway" in r.describe()


def test_an_engine_that_does_not_answer_has_nothing_in_flight() -> None:
    r = drain(
        "http://x:1",
        lambda *_a, **_k: HttpAnswer(0, "", "connection refused"),
        FakeClock(),
        timeout=10,
        interval=1,
    )
    assert r.drained and r.seconds == 0


def test_an_api_key_keeps_live_workers() -> None:
    """Issue 28: with secrets.api_key the router still takes its workers at runtime (the
    registrations name the model, test_router_api_model.py); the key reaches it only as
    OPENAI_API_KEY from secrets.env, never on its command line."""
    from pdboot.inventory.rules import live_workers

    assert live_workers(inv(prefill="p1", decode="d1"))
    keyed = inv(prefill="p1", decode="d1", overrides={"secrets.api_key": "env:PDBOOT_KEY"})
    assert live_workers(keyed)
    router = next(s for s in build_plan(keyed).services() if s.role == "router")
    assert "--enable-igw" in router.command and "--api-key" not in router.command
    assert router.env_file is not None


def test_a_new_engine_on_a_host_another_engine_leaves_starts_after_it_left() -> None:
    """d2 moves from decode to prefill: the new prefill@d2 may be given the GPUs and ports the
    old decode@d2 holds, so it is added after that decode is drained and stopped; a new engine
    on a host with nothing leaving (d3) still surges first."""
    r = roll(plan(prefill="p1, d2", decode="d1, d3"), running(plan(prefill="p1", decode="d1, d2")))
    acts = [(s.action, s.keys) for s in r.steps]
    assert acts[0] == ("add", ("decode@d3",))
    assert ("add", ("prefill@d2",)) in acts
    gone = next(i for i, s in enumerate(r.steps) if "decode@d2" in [o.key for o in s.drains])
    assert acts.index(("add", ("prefill@d2",))) > gone
    late = r.steps[acts.index(("add", ("prefill@d2",)))]
    assert late.how.startswith("start after the engines leaving its host")


def test_a_dp_aware_routers_ranks_are_one_engine() -> None:
    """vllm-router with --intra-node-data-parallel-size lists each rank as URL@rank (seen on
    the testbed: http://10.77.4.10:8201@0 ... @3): status and watch must read one engine,
    not four foreign workers and a missing one."""
    import json

    body = json.dumps(
        {
            "workers": [
                {"url": f"http://10.77.4.10:8201@{i}", "worker_type": "decode"} for i in range(4)
            ]
            + [{"url": "http://10.77.4.12:8200@0", "worker_type": "prefill"}]
        }
    )
    assert [(w.url, w.worker_type) for w in parse_workers(body)] == [
        ("http://10.77.4.10:8201", "decode"),
        ("http://10.77.4.12:8200", "prefill"),
    ]
