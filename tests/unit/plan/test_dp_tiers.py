"""Data-parallel tiers (issue 10): inventory rules, plan and command lines (checked against
vLLM 0.33's real option set), converge as a whole tier, readiness of headless followers, the
ranks in status. Plain values; the fetch and engine stand-ins below return real shapes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from pdboot.deploy.readiness import Prober
from pdboot.deploy.status import metric_engines
from pdboot.inventory.dp import layouts, local_sizes
from pdboot.inventory.load import InventoryError
from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.plan.converge import Observed, plan_up
from pdboot.plan.model import LABEL_DP_RANKS, Plan, Service
from pdboot.transport.http import HttpAnswer
from tests.shared_data import SERVE_ARGS_034_JSON, SERVE_ARGS_JSON
from tests.unit.builders import changed, inventory_doc, load, running_as_planned

MOE = inventory_doc(
    {"gpu-a": "10.0.0.1", "gpu-b": "10.0.0.2", "gpu-c": "10.0.0.3"},
    ["gpu-c"],
    ["gpu-a", "gpu-b"],
    "gpu-c",
    name="moe",
    model="Qwen/Qwen3-30B-A3B",
    overrides={
        "prefill.data_parallel": {"size": 2},
        "decode.data_parallel": {"size": 4, "expert_parallel": True},
    },
)


def doc(**tiers: Any) -> dict[str, Any]:
    """MOE with ``tier__key=value`` changes (builders.changed's ``tier.key``)."""
    return changed(MOE, {k.replace("__", "."): v for k, v in tiers.items()})


def inv(**tiers: Any) -> Inventory:
    return load(doc(**tiers), "inv.yaml")


def issues(**tiers: Any) -> list[str]:
    with pytest.raises(InventoryError) as e:
        inv(**tiers)
    return [str(i) for i in e.value.issues]


def svc(plan: Plan, key: str) -> Service:
    return next(s for s in plan.services() if s.key == key)


def arg(cmd: tuple[str, ...], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


# --------------------------------------------------------------------------- inventory


def test_layout_head_first_global_ranks() -> None:
    i = inv()
    lay = layouts("decode", i.decode)
    assert [(h, d.start, d.local, d.is_head) for h, d in lay.items()] == [
        ("gpu-a", 0, 2, True),
        ("gpu-b", 2, 2, False),
    ]
    assert lay["gpu-b"].rpc_port == 13346
    assert layouts("prefill", i.prefill)["gpu-c"].rpc_port == 13345


def test_local_size_forms() -> None:
    i = inv(decode__data_parallel={"size": 3, "size_local": {"gpu-a": 2, "gpu-b": 1}})
    assert local_sizes(i.decode) == ({"gpu-a": 2, "gpu-b": 1}, None)
    # default from a flat GPU list: GPUs / TP
    i = inv(decode__gpus=[0, 1, 2, 3], decode__tensor_parallel_size=2)
    assert local_sizes(i.decode) == ({"gpu-a": 2, "gpu-b": 2}, None)


def test_local_sizes_must_add_up() -> None:
    got = issues(decode__data_parallel={"size": 4, "size_local": {"gpu-a": 2, "gpu-b": 1}})
    assert any(
        m.startswith("inv.yaml:")
        and "decode.data_parallel.size_local" in m
        and "add up to 3" in m
        and "not size 4" in m
        for m in got
    ), got
    assert any("does not split evenly" in m for m in issues(decode__data_parallel={"size": 3}))
    got = issues(decode__data_parallel={"size": 4, "size_local": {"gpu-a": 2, "gpu-x": 2}})
    assert any("missing gpu-b" in m and "not in the tier: gpu-x" in m for m in got), got


def test_not_with_engines_per_host_nor_groups() -> None:
    got = issues(decode__engines_per_host=2)
    assert any("engines_per_host and data_parallel exclude each other" in m for m in got), got
    got = issues(decode__gpus=[[0], [1]])
    assert any("one flat GPU list" in m for m in got), got


def test_gpu_list_must_match_local_size_times_tp() -> None:
    got = issues(decode__gpus=[0, 1, 2], decode__data_parallel={"size": 4, "size_local": 2})
    assert any("list exactly 2" in m for m in got), got


def test_side_channel_ranges_of_tiers_on_a_shared_host() -> None:
    # decode DP 4 at 5601.. and prefill at 5600 (DP 2: 5600, 5601) on gpu-a: overlap
    got = issues(
        prefill={"hosts": ["gpu-a"], "gpus": [2, 3], "data_parallel": {"size": 2}},
        decode={"hosts": ["gpu-a", "gpu-b"], "gpus": [0, 1], "data_parallel": {"size": 4}},
    )
    assert any("side channels 5601-5604" in m and "shared host 'gpu-a'" in m for m in got), got
    # the whole global range counts, not only the ranks on that host
    ok = inv(
        prefill={
            "hosts": ["gpu-a"],
            "gpus": [2, 3],
            "side_channel_port": 5700,
            "data_parallel": {"size": 2},
        },
        decode={"hosts": ["gpu-a", "gpu-b"], "gpus": [0, 1], "data_parallel": {"size": 4}},
    )
    assert ok.decode.data_parallel is not None
    got = issues(
        prefill={"hosts": ["gpu-b"], "side_channel_port": 5603},
        decode={"hosts": ["gpu-a", "gpu-b"], "data_parallel": {"size": 4}, "gpus": [0, 1]},
    )
    assert any("overlap prefill's on shared host 'gpu-b'" in m for m in got), got


def test_rpc_port_is_a_claimed_port_on_the_head() -> None:
    got = issues(prefill__data_parallel={"size": 2, "rpc_port": 8000})  # the router's port
    assert any("port 8000 on host 'gpu-c' is already used" in m for m in got), got


def test_dp_flags_are_pdboots_and_dp_aware_needs_dp() -> None:
    got = issues(decode__extra_args=["--data-parallel-size=8"])
    assert any("--data-parallel-size is set by pdboot" in m for m in got), got
    got = issues(decode__extra_args=["--headless"])
    assert any("--headless is set by pdboot" in m for m in got), got
    got = issues(prefill={"hosts": ["gpu-c"]}, decode={"hosts": ["gpu-a"]}, router__dp_aware=True)
    assert any("router.dp_aware" in m and "needs a tier with data_parallel" in m for m in got)


# --------------------------------------------------------------------------- plan


def test_head_and_follower_commands() -> None:
    plan = build_plan(inv())
    head, fol = svc(plan, "decode@gpu-a"), svc(plan, "decode@gpu-b")
    for s in (head, fol):
        c = s.command
        assert (arg(c, "--data-parallel-size"), arg(c, "--data-parallel-size-local")) == ("4", "2")
        assert arg(c, "--data-parallel-address") == "10.0.0.1"
        assert arg(c, "--data-parallel-rpc-port") == "13346"
        assert "--enable-expert-parallel" in c and arg(c, "--tensor-parallel-size") == "1"
        env = dict(s.environment)
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5601"  # the base; vLLM adds the rank
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == s.address
        assert s.gpus == (0, 1)
    assert "--headless" not in head.command and arg(head.command, "--port") == "8201"
    assert "--headless" in fol.command and arg(fol.command, "--data-parallel-start-rank") == "2"
    assert "--port" not in fol.command and fol.healthcheck is None
    assert head.healthcheck is not None
    assert fol.ready_url == "http://10.0.0.1:8201/health" == head.ready_url
    assert dict(fol.labels)[LABEL_DP_RANKS] == "2-3/4"
    assert (head.dp_ranks, fol.dp_ranks) == ("ranks 0-1 of 4 (head)", "ranks 2-3 of 4 (headless)")
    pre = svc(plan, "prefill@gpu-c")
    assert "--enable-expert-parallel" not in pre.command
    assert arg(pre.command, "--data-parallel-rpc-port") == "13345"


@pytest.mark.parametrize("image", ["vllm/vllm-openai:v0.33.0", "vllm/vllm-openai:v0.34.0"])
def test_every_flag_is_a_real_vllm_serve_option(image: str) -> None:
    # the real `vllm serve` parser dump of the image's release (tests/shared_data.py)
    path = SERVE_ARGS_JSON if image.endswith("v0.33.0") else SERVE_ARGS_034_JSON
    known = {o for a in json.loads(path.read_text())["actions"] for o in a["option_strings"]}
    plan = build_plan(inv(router__dp_aware=True, image=image))
    for s in plan.services():
        if s.is_engine:
            flags = {x for x in s.command if x.startswith("-")}
            assert flags <= known, flags - known


def test_router_lists_heads_and_dp_aware_is_an_option() -> None:
    plain = build_plan(inv()).router.command
    assert [arg(plain, "--decode")] == ["http://10.0.0.1:8201"]
    assert plain.count("--decode") == 1 and plain.count("--prefill") == 1
    assert "--intra-node-data-parallel-size" not in plain
    aware = build_plan(inv(router__dp_aware=True, secrets={"api_key": "env:K"})).router
    assert arg(aware.command, "--intra-node-data-parallel-size") == "4"
    assert "--api-key" not in aware.command  # the key travels in an env file, not argv
    assert aware.env_file == "router-secrets.env"  # the key alone


# --------------------------------------------------------------------------- converge


def test_a_change_on_one_host_restarts_the_whole_dp_tier() -> None:
    running = running_as_planned(build_plan(inv()).services())
    after = build_plan(inv(decode__env={"X": "1"}))
    kinds = {s.service.key: (s.kind, s.reason) for st in plan_up(after, running) for s in st}
    assert kinds["decode@gpu-a"][0] == kinds["decode@gpu-b"][0] == "recreate"
    assert kinds["prefill@gpu-c"][0] == "unchanged"
    assert kinds["router@gpu-c"][0] == "recreate"
    # a follower that exited drags its head along (it cannot rejoin a running head)
    gone = [
        o if o.host != "gpu-b" else Observed(o.host, o.id, o.name, o.labels, "exited")
        for o in running
    ]
    kinds = {
        s.service.key: (s.kind, s.reason) for st in plan_up(build_plan(inv()), gone) for s in st
    }
    assert kinds["decode@gpu-a"] == (
        "recreate",
        "its data-parallel tier restarts (decode@gpu-b changed)",
    )
    assert kinds["prefill@gpu-c"][0] == "unchanged"


# --------------------------------------------------------------------------- readiness


@dataclass
class FakeEngine:
    state: str = "running"
    exit_code: int | None = None

    def inspect(self, cid: str) -> Observed:
        return Observed("gpu-b", cid, "c", {}, self.state, exit_code=self.exit_code)

    def logs(self, cid: str, tail: int = 50) -> list[str]:
        return ["(APIServer pid=1) INFO Launching 2 data parallel engine(s) in headless mode"]


@dataclass
class Clock:
    t: float = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


@dataclass
class Fetch:
    ok_urls: set[str] = field(default_factory=set)
    asked: list[str] = field(default_factory=list)

    def __call__(self, url: str, **_: Any) -> HttpAnswer:
        self.asked.append(url)
        if url in self.ok_urls:
            return HttpAnswer(200, "ok")
        return HttpAnswer(0, "", "connection refused")


def test_follower_ready_on_heads_health_and_fails_when_it_exits() -> None:
    plan = build_plan(inv())
    fol = svc(plan, "decode@gpu-b")
    eng = FakeEngine()
    fetch = Fetch()
    prober = Prober(plan, {"gpu-b": eng}, {fol.key: "cid"}, fetch, Clock())
    probe = prober.engine(fol)
    p = probe()
    assert p.state == "waiting" and "headless; head connection refused" in p.detail
    assert fetch.asked == ["http://10.0.0.1:8201/health"]  # never its own port
    fetch.ok_urls.add("http://10.0.0.1:8201/health")
    assert probe().state == "ready"
    eng.state, eng.exit_code = "exited", 0  # vLLM's follower exits 0 without a head
    p = probe()
    assert p.state == "failed" and "exit code 0" in p.detail


def test_router_waits_for_heads_only() -> None:
    plan = build_plan(inv())
    fetch = Fetch({"http://127.0.0.1:8081/health"})  # the router on its host's loopback
    # vllm-router 0.1.17 registers each head once per rank its /metrics reports (seen in
    # the e2e run's router log: "Router ready | workers: [...:8201@1, ...]")
    workers = [
        {"url": f"http://10.0.0.3:8200@{r}", "worker_type": "prefill", "is_healthy": True}
        for r in range(2)
    ] + [
        {"url": f"http://10.0.0.1:8201@{r}", "worker_type": "decode", "is_healthy": r != 3}
        for r in range(4)
    ]

    def answer(url: str, **kw: Any) -> HttpAnswer:
        if url.endswith("/workers"):
            return HttpAnswer(200, json.dumps({"workers": workers}))
        return fetch(url, **kw)

    prober = Prober(plan, {}, {}, answer, Clock())
    engines = [s for s in plan.services() if s.is_engine]
    p = prober.router(plan.router, engines)()
    assert p.state == "waiting" and p.detail == "not registered: decode http://10.0.0.1:8201"
    workers[-1]["is_healthy"] = True  # rank 3 healthy: the head counts as registered
    assert prober.router(plan.router, engines)().state == "ready"


# --------------------------------------------------------------------------- status


def test_ranks_from_the_heads_metrics() -> None:
    text = "\n".join(
        [
            "# TYPE vllm:num_requests_running gauge",
            'vllm:num_requests_running{engine="0",model_name="m"} 0.0',
            'vllm:num_requests_running{engine="1",model_name="m"} 0.0',
            'vllm:num_requests_running{engine="10",model_name="m"} 0.0',
            'vllm:num_requests_running{engine="2",model_name="m"} 1.0',
            'process_cpu_seconds_total{engine="9"} 1',
        ]
    )
    assert metric_engines(text) == ["0", "1", "2", "10"]
    assert metric_engines("") == []


# --------------------------------------------------------------------------- preflight

# Qwen/Qwen3-30B-A3B's config.json (the fields the estimate reads)
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def test_preflight_contexts_of_a_dp_deployment() -> None:
    from pdboot.preflight.contexts import contexts

    c = contexts(inv())
    a, b, cc = c["gpu-a"], c["gpu-b"], c["gpu-c"]
    # the head: HTTP, its ranks' side channels, NIXL's exporter (all its ranks behind one
    # port), the RPC port; the follower: no HTTP, ranks 2-3, an exporter of its own
    assert [p for p, _ in a.ports] == [8201, 5601, 5602, 9201, 13346]
    assert [p for p, _ in b.ports] == [5603, 5604, 9201]
    rpc = [(p.address, p.port) for p in b.probes if p.check_id == "network.dp_rpc"]
    assert rpc == [("10.0.0.1", 13346)]
    assert not [p for p in a.probes if p.check_id == "network.dp_rpc"]
    # every decode host reaches every prefill rank's side channel
    for ctx in (a, b):
        side = [(p.address, p.port) for p in ctx.probes if p.check_id == "network.side_channel"]
        assert side == [("10.0.0.3", 5600), ("10.0.0.3", 5601)]
    # the router reaches the heads only
    ingress = [(p.address, p.port) for p in cc.probes if p.check_id == "network.ingress"]
    assert ingress == [("10.0.0.1", 8201), ("10.0.0.3", 8200)]
    need = b.gpu_needs[0]
    assert (need.gpus, need.dp_size, need.expert_parallel) == ((0, 1), 4, True)


def test_gpu_count_covers_local_size_times_tp() -> None:
    from pdboot.preflight.checks.gpu import Gpu, _count
    from pdboot.preflight.contexts import contexts

    ctx = contexts(inv(decode__tensor_parallel_size=2, prefill__tensor_parallel_size=2))["gpu-b"]
    gpus = [
        Gpu(i, "NVIDIA RTX PRO 6000", f"GPU-{i}", "580.65", 97887, 0, 97887, "12.0", "N/A", None)
        for i in range(2)
    ]
    r = _count(ctx, gpus)
    assert r.status == "fail" and "selects GPU(s) [2, 3] which do not exist" in r.message
    assert "ranks 2-3 of 4 (headless), TP 2 each" in r.message


def test_moe_weights_per_rank_with_expert_parallelism() -> None:
    from pdboot.preflight.checks import GpuNeed
    from pdboot.preflight.checks.model import _rank_weights, moe_estimate, parse_config

    experts, params, frac = moe_estimate(QWEN3_30B_A3B)
    assert experts == 128 and 30.0e9 < params < 31.0e9 and 0.94 < frac < 0.96
    f = parse_config(json.dumps(QWEN3_30B_A3B))
    assert f.experts == 128 and f.weights_bytes == params * 2
    ep = GpuNeed("decode", 1, (0, 1), "decode", dp_size=4, expert_parallel=True)
    per_rank, words = _rank_weights(f, ep)
    assert per_rank == pytest.approx(f.weights_bytes * (1 - frac + frac / 4))
    assert "128 experts" in words and "EP 4 = TP x DP" in words
    plain = GpuNeed("decode", 1, (0, 1), "decode", dp_size=4, expert_parallel=False)
    assert _rank_weights(f, plain) == (f.weights_bytes, "")
    # MoE by its keys but no expert count: said, not guessed
    odd = {k: v for k, v in QWEN3_30B_A3B.items() if k != "num_experts"}
    g = parse_config(json.dumps(odd))
    assert g.experts == -1 and "no expert count in config.json" in _rank_weights(g, ep)[1]
    dense = {k: v for k, v in odd.items() if not k.startswith(("num_experts", "moe_"))}
    assert parse_config(json.dumps(dense)).experts == 0


def test_status_view_lists_the_ranks() -> None:
    from pdboot.events import ServiceStatus
    from pdboot.views.status import rank_lines

    def row(name: str, ranks: str) -> ServiceStatus:
        return ServiceStatus(
            name, "decode", name.split("@")[1], "running", "ok", 1.0, "img", True, "", ranks=ranks
        )

    rows = [
        row("decode@gpu-a", "ranks 0-1 of 4 (head); /metrics engines 0,1,2,3"),
        row("decode@gpu-b", "ranks 2-3 of 4 (headless)"),
        row("router@gpu-c", ""),
    ]
    assert rank_lines(rows) == [
        "Data-parallel ranks:",
        "  decode@gpu-a  ranks 0-1 of 4 (head); /metrics engines 0,1,2,3",
        "  decode@gpu-b  ranks 2-3 of 4 (headless)",
    ]
    assert rank_lines(rows[2:]) == []
