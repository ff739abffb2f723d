"""Inventory validation: every rule of the format, each with a good and a bad case."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdboot.inventory.load import InventoryError, InventoryIssue, load_inventory, parse_inventory
from pdboot.inventory.schema import DEFAULT_ROUTER_IMAGE, DEFAULT_VLLM_IMAGE
from tests.unit.builders import changed_text, gpu_pair_doc, inventory_doc
from tests.unit.paths import INVENTORIES, ROOT

BASE = gpu_pair_doc()

COLOCATED = inventory_doc(
    {"box": "10.0.0.5"},
    ["box"],
    ["box"],
    "box",
    name="solo",
    overrides={"prefill.gpus": [0], "decode.gpus": [1]},
)


def inv_text(base: dict[str, Any] = BASE, **changes: Any) -> str:
    return changed_text(base, **changes)


def issues(text: str) -> list[InventoryIssue]:
    with pytest.raises(InventoryError) as exc:
        parse_inventory(text, file="inv.yaml")
    return exc.value.issues


def one_issue(text: str) -> InventoryIssue:
    found = issues(text)
    assert len(found) == 1, [str(i) for i in found]
    return found[0]


def key(issue: InventoryIssue) -> str:
    return str(issue).split(": ", 2)[1]


# --- good inputs


@pytest.mark.parametrize(
    "path",
    [ROOT / "inventory.example.yaml", *sorted(INVENTORIES.glob("*.yaml"))],
    ids=lambda p: p.name,
)
def test_reference_inventories_are_valid(path: Path) -> None:
    inv = load_inventory(path)
    assert inv.prefill.hosts and inv.decode.hosts


def test_defaults_are_the_documented_production_values() -> None:
    inv = parse_inventory(inv_text())
    assert inv.image == DEFAULT_VLLM_IMAGE == "vllm/vllm-openai:v0.34.0"
    assert DEFAULT_ROUTER_IMAGE == "vllm/vllm-router:v0.1.17"
    assert (inv.prefill.port, inv.decode.port, inv.router.port) == (8200, 8201, 8000)
    assert (inv.prefill.side_channel_port, inv.decode.side_channel_port) == (5600, 5601)
    assert inv.kv_transfer.kv_connector == "NixlConnector"
    assert inv.kv_transfer.kv_load_failure_policy == "fail"
    assert inv.kv_transfer.rdma == "auto"
    assert (inv.container.ulimits.memlock, inv.container.ulimits.nofile) == (-1, 1048576)
    assert inv.requirements.compute_capability == "12.0"
    assert inv.requirements.min_driver == "580.65.06"
    assert inv.requirements.cuda == "13.0"


def test_colocated_single_host_with_default_ports_is_valid() -> None:
    parse_inventory(inv_text(COLOCATED))


# --- error format


def test_errors_name_file_line_and_key() -> None:
    text = inv_text(decode__port="eighty")
    issue = one_issue(text)
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "eighty" in s)
    assert str(issue).startswith(f"inv.yaml:{line}: decode.port: ")
    assert re.fullmatch(r"inv\.yaml:\d+: decode\.port: .+", str(issue))


def test_all_errors_are_reported_at_once() -> None:
    text = inv_text(modle="x", decode__port=0, router__host="gpu-z", kv_transfer={"kv_rank": 0})
    keys = {key(i) for i in issues(text)}
    assert {"modle", "decode.port", "kv_transfer.kv_rank"} <= keys


def test_rule_errors_are_reported_together() -> None:
    # pydantic-valid, but three cross-field rules fail at once
    text = inv_text(
        router__host="gpu-z",
        decode__tensor_parallel_size=3,
        prefill__tensor_parallel_size=2,
        prefill__hosts=["gpu-a", "gpu-c"],
    )
    keys = {key(i) for i in issues(text)}
    assert {"router.host", "decode.tensor_parallel_size", "prefill.hosts[1]"} <= keys


@pytest.mark.parametrize(
    ("changes", "where", "suggestion"),
    [
        ({"modle": "x"}, "modle", "model"),
        (
            {"prefill__tensor_paralel_size": 2},
            "prefill.tensor_paralel_size",
            "tensor_parallel_size",
        ),
        ({"router__prefil_policy": "random"}, "router.prefil_policy", "prefill_policy"),
        ({"hosts__gpu-a__adress": "x"}, "hosts.gpu-a.adress", "address"),
        ({"container__ulimits__memlok": -1}, "container.ulimits.memlok", "memlock"),
        (
            {"kv_transfer": {"kv_conector": "NixlConnector"}},
            "kv_transfer.kv_conector",
            "kv_connector",
        ),
    ],
)
def test_unknown_keys_are_refused_with_a_suggestion(
    changes: dict[str, Any], where: str, suggestion: str
) -> None:
    issue = one_issue(inv_text(**changes))
    assert key(issue) == where
    assert f"did you mean {suggestion!r}" in issue.message


def test_missing_required_key() -> None:
    issue = one_issue(inv_text(model=None))
    assert key(issue) == "model" and "required" in issue.message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "inv.yaml:1: the inventory is empty"),
        ("# only a comment\n", "inv.yaml:1: the inventory is empty"),
        ("- a\n- b\n", "inv.yaml:1: the inventory must be a YAML mapping"),
        ("name: x\nmodel: [\n", "inv.yaml:3: not valid YAML: "),
        ("name: x\n  model: y\n", "inv.yaml:2: not valid YAML: "),
        ("name: x\nname: y\n", "inv.yaml:2: name: duplicate key (first set on line 1)"),
    ],
)
def test_unreadable_yaml_is_one_located_line(text: str, expected: str) -> None:
    issue = one_issue(text)
    assert str(issue).startswith(expected)
    assert "\n" not in str(issue)


def test_missing_and_undecodable_files(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r"cannot read: No such file"):
        load_inventory(tmp_path / "nope.yaml")
    bad = tmp_path / "bin.yaml"
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InventoryError, match=r"not UTF-8"):
        load_inventory(bad)


# --- tiers and hosts


def test_each_tier_needs_a_host() -> None:
    assert key(one_issue(inv_text(prefill__hosts=[]))) == "prefill.hosts"
    assert key(one_issue(inv_text(decode=None))) == "decode"


def test_a_tier_host_must_be_defined() -> None:
    issue = one_issue(inv_text(decode__hosts=["gpu-c"]))
    assert key(issue) == "decode.hosts[0]"
    assert "not defined under hosts" in issue.message
    assert "did you mean 'gpu-a'" in issue.message or "did you mean 'gpu-b'" in issue.message


def test_the_router_host_must_be_defined() -> None:
    issue = one_issue(inv_text(router__host="edge"))
    assert key(issue) == "router.host"


def test_a_host_listed_twice_in_a_tier() -> None:
    issue = one_issue(inv_text(decode__hosts=["gpu-b", "gpu-b"]))
    assert key(issue) == "decode.hosts" and "twice" in issue.message


def test_host_names_are_restricted() -> None:
    data = copy.deepcopy(BASE)
    data["hosts"]["GPU A"] = {"address": "192.0.2.12"}
    assert key(one_issue(yaml.safe_dump(data))) == "hosts"


# --- addresses


@pytest.mark.parametrize("address", ["localhost", "127.0.0.1", "127.1.2.3", "0.0.0.0", "::1", "::"])
def test_loopback_or_unspecified_refused_in_multi_host(address: str) -> None:
    issue = one_issue(inv_text(**{"hosts__gpu-b": {"address": address}}))
    assert key(issue) == "hosts.gpu-b.address"
    assert "NIXL advertises" in issue.message


@pytest.mark.parametrize("address", ["127.0.0.1", "localhost"])
def test_loopback_allowed_on_a_single_host(address: str) -> None:
    parse_inventory(inv_text(COLOCATED, hosts={"box": {"address": address}}))


def test_routable_names_and_ipv6_are_fine() -> None:
    parse_inventory(
        inv_text(hosts={"gpu-a": {"address": "gpu-a.lab"}, "gpu-b": {"address": "2001:db8::b"}})
    )


def test_local_host_in_multi_host_needs_a_routable_advertise_address() -> None:
    issue = one_issue(inv_text(**{"hosts__gpu-a": {"address": "local"}}))
    assert key(issue) == "hosts.gpu-a.advertise_address"
    issue = one_issue(
        inv_text(**{"hosts__gpu-a": {"address": "local", "advertise_address": "127.0.0.1"}})
    )
    assert key(issue) == "hosts.gpu-a.advertise_address"
    parse_inventory(
        inv_text(**{"hosts__gpu-a": {"address": "local", "advertise_address": "192.0.2.10"}})
    )


def test_empty_address_refused() -> None:
    assert key(one_issue(inv_text(**{"hosts__gpu-a": {"address": "  "}}))) == "hosts.gpu-a.address"


# --- ports


@pytest.mark.parametrize(
    ("changes", "where", "owner"),
    [
        ({"decode__port": 8200}, "decode.port", "prefill HTTP"),
        ({"decode__side_channel_port": 5600}, "decode.side_channel_port", "prefill NIXL side"),
        ({"decode__port": 5600}, "decode.port", "prefill NIXL side channel"),
        ({"router__port": 8200}, "router.port", "prefill HTTP"),
        ({"router__metrics_port": 8201}, "router.metrics_port", "decode HTTP"),
        ({"router__metrics_port": 8000}, "router.metrics_port", "the proxy (public endpoint)"),
        ({"router__internal_port": 8201}, "router.internal_port", "HTTP"),
    ],
)
def test_services_on_one_host_never_share_a_port(
    changes: dict[str, Any], where: str, owner: str
) -> None:
    issue = one_issue(inv_text(COLOCATED, **changes))
    assert key(issue) == where
    assert owner in issue.message and "host 'box'" in issue.message


def test_same_ports_on_different_hosts_are_fine() -> None:
    parse_inventory(inv_text(decode__port=8200, decode__side_channel_port=5600))


def test_router_port_clashing_with_an_engine_on_its_host() -> None:
    issue = one_issue(inv_text(router__port=8200))  # router on gpu-a beside prefill
    assert key(issue) == "router.port"
    parse_inventory(inv_text(router__port=8201))  # decode is on gpu-b: no clash


@pytest.mark.parametrize("port", [0, 65536, -1])
def test_port_range(port: int) -> None:
    assert key(one_issue(inv_text(prefill__port=port))) == "prefill.port"


# --- tensor parallel, GPUs


@pytest.mark.parametrize(("p", "d"), [(1, 1), (2, 4), (4, 2), (1, 8), (8, 1)])
def test_tp_sizes_that_divide_one_another(p: int, d: int) -> None:
    parse_inventory(inv_text(prefill__tensor_parallel_size=p, decode__tensor_parallel_size=d))


@pytest.mark.parametrize(("p", "d"), [(2, 3), (4, 6), (3, 2)])
def test_tp_sizes_that_do_not_divide(p: int, d: int) -> None:
    issue = one_issue(inv_text(prefill__tensor_parallel_size=p, decode__tensor_parallel_size=d))
    assert key(issue) == "decode.tensor_parallel_size"
    assert "divide" in issue.message


def test_listed_gpus_must_match_tp() -> None:
    issue = one_issue(inv_text(prefill__gpus=[0], prefill__tensor_parallel_size=2))
    assert key(issue) == "prefill.gpus"
    parse_inventory(inv_text(prefill__gpus=[2, 3], prefill__tensor_parallel_size=2))


@pytest.mark.parametrize(("gpus", "why"), [([], "empty"), ([0, 0], "distinct"), ([-1], "0..63")])
def test_gpu_lists(gpus: list[int], why: str) -> None:
    issue = one_issue(inv_text(prefill__gpus=gpus))
    assert key(issue) == "prefill.gpus" and why in issue.message


def test_colocated_tiers_need_their_own_gpus() -> None:
    issue = one_issue(inv_text(COLOCATED, prefill__gpus="all"))
    assert key(issue) == "decode.gpus" and "'all'" in issue.message
    issue = one_issue(inv_text(COLOCATED, prefill__gpus=[1]))
    assert key(issue) == "decode.gpus" and "[1]" in issue.message


# --- kv_transfer


@pytest.mark.parametrize("field", ["kv_rank", "kv_parallel_size", "kv_ip", "kv_buffer_size"])
def test_kv_fields_vllm_rejects_are_refused(field: str) -> None:
    issue = one_issue(inv_text(kv_transfer={field: 1}))
    assert key(issue) == f"kv_transfer.{field}"
    assert "vLLM would refuse to start" in issue.message


def test_kv_role_cannot_be_set_by_hand() -> None:
    issue = one_issue(inv_text(kv_transfer={"kv_role": "kv_both"}))
    assert key(issue) == "kv_transfer.kv_role" and "set by pdboot per tier" in issue.message


def test_engine_id_is_left_to_vllm() -> None:
    issue = one_issue(inv_text(kv_transfer={"engine_id": "x"}))
    assert key(issue) == "kv_transfer.engine_id"


@pytest.mark.parametrize(
    "arg",
    [
        "--kv-transfer-config",
        '--kv-transfer-config={"kv_role":"kv_both"}',
        "--kv_transfer_config",
        "--port",
        "--tensor-parallel-size",
        "-tp",
        "--model",
        "--served-model-name",
        "--host",
    ],
)
def test_flags_pdboot_sets_cannot_be_passed_as_extra_args(arg: str) -> None:
    issue = one_issue(inv_text(decode__extra_args=["--max-num-seqs", "8", arg]))
    assert key(issue) == "decode.extra_args[2]" and "set by pdboot" in issue.message


@pytest.mark.parametrize(
    "arg", ["--prefill", "--decode", "--port=9", "--host", "--vllm-pd-disaggregation"]
)
def test_flags_pdboot_sets_cannot_be_passed_to_the_router(arg: str) -> None:
    issue = one_issue(inv_text(router__extra_args=[arg]))
    assert key(issue) == "router.extra_args[0]"


def test_allowed_kv_fields_and_values() -> None:
    inv = parse_inventory(
        inv_text(
            kv_transfer={
                "kv_connector": "NixlPushConnector",
                "kv_buffer_device": "cpu",
                "kv_load_failure_policy": "recompute",
                "kv_connector_extra_config": {"backends": ["UCX"]},
                "rdma": "off",
            }
        )
    )
    assert inv.kv_transfer.kv_buffer_device == "cpu"
    assert key(one_issue(inv_text(kv_transfer={"kv_connector": "P2pNcclConnector"}))) == (
        "kv_transfer.kv_connector"
    )


def test_yaml_booleans_for_rdma_and_restart() -> None:
    # an unquoted `on` / `no` is a boolean in YAML 1.1
    inv = parse_inventory(inv_text() + "kv_transfer: {rdma: on}\ncontainer: {restart: no}\n")
    assert (inv.kv_transfer.rdma, inv.container.restart) == ("on", "no")
    inv = parse_inventory(inv_text() + "kv_transfer: {rdma: off}\n")
    assert inv.kv_transfer.rdma == "off"


def test_ucx_env_only_takes_ucx_variables() -> None:
    issue = one_issue(inv_text(kv_transfer={"ucx": {"env": {"LD_PRELOAD": "x"}}}))
    assert key(issue) == "kv_transfer.ucx.env" and "LD_PRELOAD" in issue.message


# --- env, secrets, container


@pytest.mark.parametrize("var", ["VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT"])
def test_side_channel_env_is_pdboots(var: str) -> None:
    assert key(one_issue(inv_text(prefill__env={var: "x"}))) == f"prefill.env.{var}"


@pytest.mark.parametrize("var", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"])
def test_tokens_are_never_inline_env(var: str) -> None:
    issue = one_issue(inv_text(decode__env={var: "hf_abc"}))
    assert "secrets.hf_token" in issue.message


@pytest.mark.parametrize(
    "ref", ["env:HF_TOKEN", "file:/etc/pdboot/hf_token", "/etc/pdboot/hf", "~/hf", "./hf"]
)
def test_secret_references(ref: str) -> None:
    assert parse_inventory(inv_text(secrets={"hf_token": ref})).secrets.hf_token == ref


@pytest.mark.parametrize("value", ["hf_AbCdEfGhIjKlMnOpQrStUvWxYz", "env:", "env:1BAD"])
def test_inline_or_broken_secret_refused(value: str) -> None:
    issue = one_issue(inv_text(secrets={"hf_token": value}))
    assert key(issue) == "secrets.hf_token"
    assert value not in issue.message or value.startswith("env:")


def test_missing_secret_source_is_not_a_load_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # reported at `up`, which reads the value; load and render never look it up
    monkeypatch.delenv("PDBOOT_TEST_NO_SUCH_VAR", raising=False)
    inv = parse_inventory(inv_text(secrets={"hf_token": "env:PDBOOT_TEST_NO_SUCH_VAR"}))
    assert inv.secrets.hf_token == "env:PDBOOT_TEST_NO_SUCH_VAR"
    parse_inventory(inv_text(secrets={"hf_token": "file:/nonexistent/pdboot/token"}))


@pytest.mark.parametrize("size", ["16g", "512m", "1.5G", "1024"])
def test_shm_size_accepted(size: str) -> None:
    parse_inventory(inv_text(container={"shm_size": size}))


@pytest.mark.parametrize("size", ["16 gigs", "g", "-1g"])
def test_shm_size_refused(size: str) -> None:
    assert key(one_issue(inv_text(container={"shm_size": size}))) == "container.shm_size"


def test_nofile_floor() -> None:
    assert key(one_issue(inv_text(container={"ulimits": {"nofile": 10}}))) == (
        "container.ulimits.nofile"
    )


def test_deployment_name_pattern() -> None:
    assert key(one_issue(inv_text(name="My Deployment"))) == "name"
