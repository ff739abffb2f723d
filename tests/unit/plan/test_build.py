"""The plan: what runs where, in which order, with which arguments (pure)."""

from __future__ import annotations

import json

import pytest

from pdboot.inventory.kv_schema import KV_TRANSFER_FIELDS
from pdboot.inventory.load import load_inventory, parse_inventory
from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan, project_name
from pdboot.plan.facts import PlanFacts
from pdboot.plan.model import HF_CACHE_IN_CONTAINER, Plan, Service
from tests.unit.paths import INVENTORIES


def svc_at(plan: Plan, key: str) -> Service:
    """The planned service ``role@host``."""
    return next(s for s in plan.services() if s.key == key)


def inv(name: str) -> Inventory:
    return load_inventory(INVENTORIES / f"{name}.yaml")


def arg(svc: Service, flag: str) -> str:
    return svc.command[svc.command.index(flag) + 1]


def kv_config(svc: Service) -> dict[str, object]:
    parsed: dict[str, object] = json.loads(arg(svc, "--kv-transfer-config"))
    return parsed


def env(svc: Service) -> dict[str, str]:
    return dict(svc.environment)


def test_plan_groups_decode_engines_prefill_engines_then_the_router() -> None:
    plan = build_plan(inv("2p2d"))
    assert [[s.key for s in stage] for stage in plan.stages] == [
        ["decode@d1", "decode@d2"],
        ["prefill@p1", "prefill@p2"],
        ["router@edge"],
        ["proxy@edge"],
    ]
    assert plan.router.key == "router@edge"
    # the proxy owns the public port; the router listens on its host's loopback
    assert plan.endpoint == "http://10.0.0.2:80"
    assert plan.router.url == "http://127.0.0.1:8081"


def test_services_per_host() -> None:
    plan = build_plan(inv("1p1d"))
    assert {h: [s.role for s in hp.services] for h, hp in plan.hosts.items()} == {
        "gpu-b": ["decode"],
        "gpu-a": ["prefill", "router", "proxy"],
    }
    plan = build_plan(inv("colocated"))
    assert [s.role for s in plan.hosts["box"].services] == ["decode", "prefill", "router", "proxy"]
    assert plan.hosts["box"].is_local
    assert {hp.project for hp in plan.hosts.values()} == {project_name(inv("colocated"))}


def test_hosts_that_run_nothing_are_not_in_the_plan() -> None:
    text = (INVENTORIES / "1p1d.yaml").read_text() + ""
    text = text.replace("hosts:\n  gpu-a:", "hosts:\n  spare: {address: 192.0.2.99}\n  gpu-a:")
    plan = build_plan(parse_inventory(text))
    assert "spare" not in plan.hosts


def test_kv_transfer_config_roles_and_only_fields_vllm_accepts() -> None:
    plan = build_plan(inv("2p2d"))
    allowed = set(KV_TRANSFER_FIELDS) | {"kv_role"}
    for svc in plan.services():
        if not svc.is_engine:
            continue
        cfg = kv_config(svc)
        assert set(cfg) <= allowed
        assert cfg["kv_role"] == {"prefill": "kv_producer", "decode": "kv_consumer"}[svc.role]
        assert cfg["kv_connector"] == "NixlConnector"
        assert cfg["kv_connector_extra_config"] == {"backends": ["UCX"], "num_threads": 4}
        # compact JSON: a single argv word with no spaces
        assert " " not in arg(svc, "--kv-transfer-config")


def test_side_channel_env_is_the_engines_own_routable_address() -> None:
    plan = build_plan(inv("2p2d"))
    for svc in plan.services():
        if not svc.is_engine:
            assert svc.environment == ()
            continue
        e = env(svc)
        assert e["VLLM_NIXL_SIDE_CHANNEL_HOST"] == svc.address
        assert e["VLLM_NIXL_SIDE_CHANNEL_PORT"] == str(svc.side_channel_port)
        assert e["HF_HOME"] == HF_CACHE_IN_CONTAINER
    assert env(svc_at(plan, "prefill@p2"))["VLLM_NIXL_SIDE_CHANNEL_HOST"] == ("10.0.0.12")
    assert "VLLM_KV_TRANSFER_CONFIG" not in {k for s in plan.services() for k, _ in s.environment}


def test_both_tiers_use_the_same_model_string_and_image() -> None:
    plan = build_plan(inv("2p2d"))
    engines = [s for s in plan.services() if s.is_engine]
    assert {s.command[0] for s in engines} == {"meta-llama/Llama-3.1-70B-Instruct"}
    assert {arg(s, "--served-model-name") for s in engines} == {"llama-70b"}
    assert {s.image for s in engines} == {"registry.example.com/vllm/vllm-openai:v0.33.0"}
    assert {arg(s, "--tensor-parallel-size") for s in engines if s.role == "prefill"} == {"2"}
    assert {arg(s, "--tensor-parallel-size") for s in engines if s.role == "decode"} == {"4"}


def test_tier_extras_are_appended_and_kept_per_tier() -> None:
    plan = build_plan(inv("2p2d"))
    p, d = svc_at(plan, "prefill@p1"), svc_at(plan, "decode@d1")
    assert p is not None and d is not None
    assert p.command[-3:] == ("--max-model-len", "32768", "--enable-prefix-caching")
    assert d.command[-2:] == ("--max-num-seqs", "256")
    assert env(d)["VLLM_LOGGING_LEVEL"] == "DEBUG" and "VLLM_LOGGING_LEVEL" not in env(p)
    assert p.gpus == (0, 1) and d.gpus == "all"


def test_router_command_lists_every_engine_by_address() -> None:
    plan = build_plan(inv("2p2d"))
    cmd = list(plan.router.command)
    assert cmd[0] == "--vllm-pd-disaggregation"
    assert plan.router.entrypoint == ("vllm-router",)
    prefills = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--prefill"]
    decodes = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--decode"]
    assert prefills == ["http://10.0.0.11:8200", "http://10.0.0.12:8200"]
    assert decodes == ["http://10.0.0.21:8201", "http://10.0.0.22:8201"]
    # live workers (IGW mode): one policy for both tiers, the decode tier's
    assert "--enable-igw" in cmd and arg(plan.router, "--policy") == "power_of_two"
    assert arg(plan.router, "--host") == "127.0.0.1"
    assert arg(plan.router, "--port") == "8081"
    assert arg(plan.router, "--request-timeout-secs") == "3600"
    # its metrics on the router host's own address, not every address (router.metrics_bind)
    assert arg(plan.router, "--prometheus-host") == plan.proxy.address if plan.proxy else False


def test_rdma_modes() -> None:
    base = (INVENTORIES / "1p1d.yaml").read_text()
    auto = parse_inventory(base)  # both hosts declare mlx5_0
    assert all(s.rdma for s in build_plan(auto).services() if s.is_engine)
    # auto follows what preflight saw, per host
    plan = build_plan(auto, PlanFacts(rdma_present={"gpu-a": False, "gpu-b": True}))
    assert (svc_at(plan, "prefill@gpu-a").rdma, svc_at(plan, "decode@gpu-b").rdma) == (
        False,
        True,
    )
    off = parse_inventory(base + 'kv_transfer: {rdma: "off"}\n')
    assert not any(
        s.rdma for s in build_plan(off, PlanFacts(rdma_present={"gpu-a": True})).services()
    )
    on = parse_inventory(base.replace("rdma_devices: [mlx5_0]", "") + 'kv_transfer: {rdma: "on"}\n')
    assert all(s.rdma for s in build_plan(on).services() if s.is_engine)
    assert not build_plan(on).router.rdma


def test_ucx_env() -> None:
    plan = build_plan(inv("1p1d"))
    d = svc_at(plan, "decode@gpu-b")
    assert d is not None and env(d)["UCX_NET_DEVICES"] == "mlx5_0:1"
    plan = build_plan(inv("2p2d"))
    p = svc_at(plan, "prefill@p1")
    assert p is not None
    assert env(p)["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1"
    assert env(p)["UCX_TLS"] == "rc,cuda_copy"
    assert env(p)["UCX_LOG_LEVEL"] == "info"
    plan = build_plan(inv("colocated"))  # rdma off, no UCX settings: UCX decides
    assert not any(k.startswith("UCX_") for s in plan.services() for k, _ in s.environment)


def test_local_single_host_advertises_loopback_and_multi_host_its_address() -> None:
    plan = build_plan(inv("colocated"))
    assert {s.address for s in plan.services()} == {"127.0.0.1"}
    base = (
        (INVENTORIES / "1p1d.yaml")
        .read_text()
        .replace("address: 192.0.2.10", "address: local\n    advertise_address: 192.0.2.10")
    )
    plan = build_plan(parse_inventory(base))
    assert plan.hosts["gpu-a"].is_local
    assert svc_at(plan, "prefill@gpu-a").address == "192.0.2.10"
    assert plan.endpoint == "http://192.0.2.10:8000"


def test_ipv6_urls_are_bracketed() -> None:
    base = (INVENTORIES / "1p1d.yaml").read_text().replace("192.0.2.11", "2001:db8::11")
    plan = build_plan(parse_inventory(base))
    assert "--decode" in plan.router.command
    assert arg(plan.router, "--decode") == "http://[2001:db8::11]:8201"


def test_secrets_flag_follows_the_reference() -> None:
    assert all(s.uses_secrets for s in build_plan(inv("1p1d")).services() if s.is_engine)
    assert not build_plan(inv("1p1d")).router.uses_secrets
    assert not any(s.uses_secrets for s in build_plan(inv("colocated")).services())


def test_config_hash_is_stable_and_tracks_changes() -> None:
    base = (INVENTORIES / "1p1d.yaml").read_text()
    a, b = build_plan(parse_inventory(base)), build_plan(parse_inventory(base))
    assert [s.config_hash for s in a.services()] == [s.config_hash for s in b.services()]
    assert len({s.config_hash for s in a.services()}) == 4

    def hashes(extra: str) -> dict[str, str]:
        plan = build_plan(parse_inventory(base + extra))
        return {s.key: s.config_hash for s in plan.services()}

    before = hashes("")
    for extra, changed in [
        ("image: vllm/vllm-openai:v0.33.1\n", {"decode@gpu-b", "prefill@gpu-a"}),
        ("router_image: vllm/vllm-router:v0.1.18\n", {"router@gpu-a"}),
        ("decode: {hosts: [gpu-b], port: 8301}\n", None),  # decode URL also in the router
        ("container: {shm_size: 32g}\n", ENGINES),
        ("container: {restart: always}\n", ALL),
        ("timeouts: {ready_seconds: 60}\n", ENGINES),  # the healthcheck's start_period
        ("container: {hf_cache: /data/hf}\n", ENGINES),
        ("container: {ulimits: {memlock: 8388608}}\n", ENGINES),
        ("container: {ulimits: {nofile: 65536}}\n", ENGINES | {"router@gpu-a"}),
        ("timeouts: {router_ready_seconds: 99}\n", set()),  # up's wait, not the container's
    ]:
        text = (
            base.replace("decode:\n  hosts: [gpu-b]\n", "") if extra.startswith("decode") else base
        )
        plan = build_plan(parse_inventory(text + extra))
        after = {s.key: s.config_hash for s in plan.services()}
        diff = {k for k in before if before[k] != after[k]}
        if changed is None:
            assert diff, extra
        else:
            assert diff == changed, extra


ENGINES = {"decode@gpu-b", "prefill@gpu-a"}
ALL = ENGINES | {"router@gpu-a", "proxy@gpu-a"}


def test_config_hash_covers_every_key_of_the_rendered_definition() -> None:
    from dataclasses import replace

    svc = build_plan(inv("1p1d")).decode_engines[0]
    assert svc.container_name == "pdboot-demo-decode"
    for change in (
        {"devices": ()},
        {"cap_add": ()},
        {"ipc": None},
        {"network_mode": "bridge"},
        {"env_file": None},
        {"labels": ()},
        {"gpus": (0,)},
        {"project": "other"},  # the container name
    ):
        moved = replace(svc, **change)  # type: ignore[arg-type]
        assert _rehash(moved) != svc.config_hash, change
    assert _rehash(svc) == svc.config_hash


def _rehash(svc: Service) -> str:
    from pdboot.plan.build import _with_hash

    return _with_hash(svc).config_hash


@pytest.mark.parametrize("name", ["1p1d", "2p2d", "colocated"])
def test_every_service_has_a_distinct_key_and_health_url(name: str) -> None:
    plan = build_plan(inv(name))
    keys = [s.key for s in plan.services()]
    assert len(keys) == len(set(keys))
    for s in plan.services():
        assert s.health_url == f"{s.url}/health"


def test_power_of_two_counts_engines_not_hosts() -> None:
    # one decode host with two engines: vllm-router 0.1.17's power_of_two has its 2 workers
    text = INVENTORIES.joinpath("1p1d.yaml").read_text()
    doc = text + "\n"  # the 1p1d inventory with the decode tier on one host
    from pdboot.inventory.load import InventoryError

    with pytest.raises(InventoryError, match="refuses power_of_two"):
        parse_inventory(doc.replace("router:\n", "router:\n  decode_policy: power_of_two\n", 1))
    two = doc.replace("decode:\n", "decode:\n  engines_per_host: 2\n  tensor_parallel_size: 1\n", 1)
    two = two.replace("router:\n", "router:\n  decode_policy: power_of_two\n", 1)
    plan = build_plan(parse_inventory(two))
    assert arg(plan.router, "--policy") == "power_of_two"
    assert len([a for a in plan.router.command if a == "--decode"]) == 2
