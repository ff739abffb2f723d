"""device: cpu in the inventory and the plan: the rules (each with a good and a bad case, at
its file:line), the cores each engine gets, and what a CPU engine is rendered with."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from pdboot.inventory.cpu_layout import CPU_DTYPE, engine_cores, flag_value, threads_bind
from pdboot.inventory.load import InventoryError, InventoryIssue, parse_inventory
from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.plan.model import Plan, Service
from pdboot.plan.render import render_all, render_summary
from tests.unit.builders import (
    CPU_REHEARSAL,
    changed_text,
    cpu_pair_doc,
    inventory_doc,
)

CPU = cpu_pair_doc()
ONE_HOST = inventory_doc({"box": "192.0.2.30"}, ["box"], ["box"], "box", **CPU_REHEARSAL)


def text(base: dict[str, Any] = CPU, **changes: Any) -> str:
    return changed_text(base, **changes)


def load(base: dict[str, Any] = CPU, **changes: Any) -> Inventory:
    return parse_inventory(text(base, **changes), "inv.yaml")


def issues(base: dict[str, Any] = CPU, **changes: Any) -> list[InventoryIssue]:
    with pytest.raises(InventoryError) as exc:
        load(base, **changes)
    return exc.value.issues


def one(base: dict[str, Any] = CPU, **changes: Any) -> InventoryIssue:
    found = issues(base, **changes)
    assert len(found) == 1, [str(i) for i in found]
    return found[0]


def line_of(yaml_text: str, key: str) -> int:
    return next(i for i, ln in enumerate(yaml_text.splitlines(), 1) if ln.strip().startswith(key))


def svc(plan: Plan, key: str) -> Service:
    return next(s for s in plan.services() if s.key == key)


def env(s: Service) -> dict[str, str]:
    return dict(s.environment)


# --------------------------------------------------------------------------- the device


def test_default_device_is_cuda_and_cpu_loads() -> None:
    gpu = load(CPU, device=None, image=None)
    assert gpu.device == "cuda" and gpu.cpu.kv_cache_gib == 4
    assert load().device == "cpu"


def test_a_tier_naming_another_device_is_refused_at_its_line() -> None:
    t = text(prefill__device="cuda")
    with pytest.raises(InventoryError) as exc:
        parse_inventory(t, "inv.yaml")
    (issue,) = exc.value.issues
    assert issue.path == ("prefill", "device")
    assert issue.line == line_of(t, "device: cuda")
    assert str(issue).startswith(f"inv.yaml:{issue.line}: prefill.device: ")
    assert "packs KV blocks differently on CPU" in issue.message
    # the same device, said again on a tier, is not a mix
    assert load(prefill__device="cpu").device == "cpu"


def test_a_cpu_tier_under_a_gpu_deployment_is_refused() -> None:
    issue = one(CPU, device=None, image=None, decode__device="cpu")
    assert issue.path == ("decode", "device") and "device cpu differs" in issue.message


def test_cpu_needs_a_cpu_image() -> None:
    issue = one(CPU, image=None)
    assert issue.path == ("device",) and "CUDA-only" in issue.message


def test_cpus_belong_to_cpu_engines() -> None:
    issue = one(CPU, device=None, image=None, prefill__cpus=[0])
    assert issue.path == ("prefill", "cpus")


@pytest.mark.parametrize(
    ("change", "path", "words"),
    [
        ({"prefill__gpus": [0]}, ("prefill", "gpus"), "use no GPUs"),
        ({"decode__engines_per_host": "all"}, ("decode", "engines_per_host"), "counts GPUs"),
        ({"decode__data_parallel": {"size": 2}}, ("decode", "data_parallel"), "not supported"),
        (
            {"kv_transfer": {"kv_buffer_device": "cuda"}},
            ("kv_transfer", "kv_buffer_device"),
            "only kv_buffer_device cpu",
        ),
        (
            {"prefill__env": {"VLLM_CPU_KVCACHE_SPACE": "8"}},
            ("prefill", "env", "VLLM_CPU_KVCACHE_SPACE"),
            "cpu.kv_cache_gib",
        ),
        (
            {"decode__env": {"VLLM_CPU_OMP_THREADS_BIND": "0"}},
            ("decode", "env", "VLLM_CPU_OMP_THREADS_BIND"),
            "cpus",
        ),
        (
            {"decode__extra_args": ["--max-model-len", "512", "--block-size", "16"]},
            ("decode", "extra_args", 2),
            "multiples of 32",
        ),
        ({"decode__extra_args": ["--block_size=48"]}, ("decode", "extra_args", 0), "48"),
    ],
)
def test_cpu_rules(change: dict[str, Any], path: tuple[str | int, ...], words: str) -> None:
    found = issues(CPU, **change)
    assert any(i.path == path and words in i.message for i in found), [str(i) for i in found]


def test_block_sizes_vllm_cpu_takes_load() -> None:
    inv = load(decode__extra_args=["--block-size", "64"], prefill__extra_args=["--block-size=32"])
    assert inv.decode.extra_args == ["--block-size", "64"]


def test_kv_cache_gib_is_a_whole_number_as_vllm_parses_it() -> None:
    assert any(i.path == ("cpu", "kv_cache_gib") for i in issues(CPU, cpu={"kv_cache_gib": 1.5}))
    assert any(i.path == ("cpu", "kv_cache_gib") for i in issues(CPU, cpu={"kv_cache_gib": 0}))


# --------------------------------------------------------------------------- cores


def test_several_engines_on_a_host_need_their_own_cores() -> None:
    issue = one(ONE_HOST)
    assert issue.path == ("cpu", "cores_per_engine")
    assert "runs 2 engines" in issue.message and "same cores" in issue.message
    # one engine per host: vLLM's own binding is fine
    assert engine_cores(load()) == {"cpu-a": {("prefill", 0): None}, "cpu-b": {("decode", 0): None}}


def test_cores_per_engine_lays_out_prefill_first_from_core_0() -> None:
    inv = load(ONE_HOST, cpu={"cores_per_engine": 1}, decode__engines_per_host=2)
    assert engine_cores(inv)["box"] == {
        ("prefill", 0): (0,),
        ("decode", 0): (1,),
        ("decode", 1): (2,),
    }


def test_auto_layout_skips_cores_a_tier_lists_itself() -> None:
    inv = load(
        ONE_HOST, cpu={"cores_per_engine": 2}, prefill__cpus=[0, 1], decode__engines_per_host=2
    )
    assert engine_cores(inv)["box"] == {
        ("prefill", 0): (0, 1),
        ("decode", 0): (2, 3),
        ("decode", 1): (4, 5),
    }
    inv = load(ONE_HOST, cpu={"cores_per_engine": 1}, decode__cpus=[0])
    assert engine_cores(inv)["box"] == {("prefill", 0): (1,), ("decode", 0): (0,)}


def test_explicit_core_lists_one_per_engine_or_a_pool_split_evenly() -> None:
    inv = load(
        ONE_HOST, prefill__cpus=[[0], [1]], decode__cpus=[2, 3, 4, 5], decode__engines_per_host=2
    )
    assert engine_cores(inv)["box"] == {
        ("prefill", 0): (0,),
        ("prefill", 1): (1,),
        ("decode", 0): (2, 3),
        ("decode", 1): (4, 5),
    }
    plan = build_plan(inv)
    assert [s.name for s in plan.hosts["box"].services if s.role == "prefill"] == [
        "prefill",
        "prefill-1",
    ]


@pytest.mark.parametrize(
    ("changes", "path", "words"),
    [
        ({"prefill__cpus": [0, 1], "decode__cpus": [1, 2]}, ("decode", "cpus"), "core(s) [1]"),
        (
            {"prefill__cpus": [0, 1, 2], "prefill__engines_per_host": 2, "decode__cpus": [3]},
            ("prefill", "cpus"),
            "do not split evenly",
        ),
        (
            {"prefill__cpus": [[0], [1]], "prefill__engines_per_host": 3, "decode__cpus": [2]},
            ("prefill", "engines_per_host"),
            "2 core list(s)",
        ),
        (
            {
                "prefill__cpus": [0, 1, 2],
                "prefill__tensor_parallel_size": 2,
                "decode__tensor_parallel_size": 2,
                "decode__cpus": [3, 4],
            },
            ("prefill", "cpus"),
            "tensor_parallel_size 2",
        ),
        (
            {
                "cpu": {"cores_per_engine": 3},
                "decode__tensor_parallel_size": 2,
                "prefill__tensor_parallel_size": 2,
            },
            ("cpu", "cores_per_engine"),
            "each TP rank",
        ),
        ({"prefill__cpus": [0, 0], "decode__cpus": [1]}, ("prefill", "cpus"), "distinct"),
        ({"prefill__cpus": [[0], []], "decode__cpus": [1]}, ("prefill", "cpus"), "empty"),
        ({"prefill__cpus": [5000], "decode__cpus": [1]}, ("prefill", "cpus"), "0..4095"),
    ],
)
def test_core_rules(changes: dict[str, Any], path: tuple[str | int, ...], words: str) -> None:
    found = issues(ONE_HOST, **changes)
    assert any(i.path == path and words in i.message for i in found), [str(i) for i in found]


def test_threads_bind_is_one_list_per_tp_rank() -> None:
    assert threads_bind((0,), 1) == "0"
    assert threads_bind((0, 1, 2, 5), 1) == "0-2,5"
    assert threads_bind((4, 5, 6, 7), 2) == "4-5|6-7"


def test_flag_value_reads_both_spellings_last_wins() -> None:
    assert flag_value(["--dtype", "bfloat16"], "--dtype") == "bfloat16"
    assert flag_value(["--dtype=half", "--max-model-len", "9"], "--dtype") == "half"
    assert flag_value(["--block_size=64"], "--block-size") == "64"
    assert flag_value(["--dtype", "a", "--dtype=b"], "--dtype") == "b"
    assert flag_value(["--max-model-len", "9"], "--dtype") is None


# --------------------------------------------------------------------------- the plan


def test_a_cpu_engine_is_planned_as_vllm_cpu_needs() -> None:
    inv = load(ONE_HOST, cpu={"kv_cache_gib": 3, "cores_per_engine": 1})
    plan = build_plan(inv)
    pre, dec = svc(plan, "prefill@box"), svc(plan, "decode@box")
    for s, core in ((pre, "0"), (dec, "1")):
        assert s.gpus is None and s.device == "cpu"
        assert env(s)["VLLM_CPU_KVCACHE_SPACE"] == "3"
        assert env(s)["VLLM_CPU_OMP_THREADS_BIND"] == core
        assert not any(k.startswith("CUDA") or k.startswith("NVIDIA") for k in env(s))
        cmd = list(s.command)
        cfg = json.loads(cmd[cmd.index("--kv-transfer-config") + 1])
        assert cfg["kv_buffer_device"] == "cpu"
        assert cmd[cmd.index("--dtype") + 1] == CPU_DTYPE == "float32"
        assert "--block-size" not in cmd
        assert s.ipc == "host"  # /dev/shm: vLLM's CPU workers need more than Docker's 64 MiB
    compose = yaml.safe_load(render_all(plan)["box"])
    for name in ("prefill", "decode"):
        assert "deploy" not in compose["services"][name]
        assert "cpuset" not in compose["services"][name]  # breaks NIXL's core pinning
    assert plan.device == "cpu"


def test_an_operator_dtype_wins_and_no_binding_without_cores() -> None:
    plan = build_plan(load(prefill__extra_args=["--dtype", "bfloat16"]))
    cmd = list(svc(plan, "prefill@cpu-a").command)
    assert cmd.count("--dtype") == 1 and cmd[cmd.index("--dtype") + 1] == "bfloat16"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env(svc(plan, "decode@cpu-b"))


def test_the_cpu_header_and_summary_say_where_engines_run() -> None:
    plan = build_plan(load(ONE_HOST, cpu={"cores_per_engine": 1}))
    head = render_all(plan)["box"].split("name: ", 1)[0]
    assert "# device: cpu: no GPU reservation" in head
    assert "#   prefill    cores 0 " in head and "#   decode     cores 1 " in head
    summary = render_summary(plan)
    rows = {ln.split()[1]: ln.split() for ln in summary.splitlines() if ln.strip()[:2] == "1."}
    assert " cores " in summary and "GPUs" not in summary
    assert rows["prefill@box"][3] == "0" and rows["decode@box"][3] == "1"


def test_an_explicit_kv_buffer_device_cpu_is_kept_for_gpu_engines() -> None:
    inv = load(CPU, device=None, image=None, kv_transfer={"kv_buffer_device": "cpu"})
    plan = build_plan(inv)
    cmd = list(svc(plan, "decode@cpu-b").command)
    assert json.loads(cmd[cmd.index("--kv-transfer-config") + 1])["kv_buffer_device"] == "cpu"
    assert svc(plan, "decode@cpu-b").gpus == "all" and "--dtype" not in cmd
