"""device: cpu preflight: the parsers on real captures (tests/unit/fixtures/cpu/; the facts
stored beside each capture are compared by test_checks_fixtures.py), what the verdicts
decide on in them, and the verdicts from facts: each failure with its fix; the GPU checks
skipped with the reason."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from pdboot.preflight.checks import CpuNeed, HostContext, ParseError, Section, cpu, parse_sections
from pdboot.preflight.checks.facts import HostFacts
from pdboot.preflight.checks.host import DiskFacts, HostSysFacts, Mount
from pdboot.preflight.run import contexts, evaluate_host, host_commands
from tests.unit.builders import CPU_REHEARSAL, changed, inventory_doc, load
from tests.unit.paths import FIXTURES

FIX = FIXTURES / "cpu"


def test_the_captures_hold_what_the_checks_decide_on() -> None:
    this = parse_sections((FIX / "this-machine.txt").read_text(encoding="utf-8"))
    info = cpu.parse_lscpu(this[cpu.LSCPU].output)
    assert info.arch == "x86_64" and info.online == (0, 1) and info.numa == ((0, 1),)
    assert info.nixl_cores == (1,)  # the last core of NUMA node 0: where NIXL pins itself
    flags = cpu.parse_flags(this[cpu.FLAGS].output)
    assert {"avx2", "f16c", "avx512f", "avx512_bf16"} <= flags and "amx_bf16" not in flags
    whole = parse_sections((FIX / "this-machine-cpuinfo.txt").read_text(encoding="utf-8"))
    assert cpu.parse_flags(whole["cat /proc/cpuinfo"].output) == flags
    mem = cpu.parse_free(this[cpu.FREE].output)
    assert mem.total == 25276059648 and mem.available == 24141819904
    m7i = cpu.parse_lscpu(
        parse_sections((FIX / "aws-m7i-lscpu.txt").read_text(encoding="utf-8"))[cpu.LSCPU].output
    )
    assert m7i.online == tuple(range(8)) and m7i.numa == () and m7i.nixl_cores == (7,)
    assert {"amx_bf16", "amx_tile"} <= m7i.flags and m7i.model.endswith("8488C")


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        (cpu.parse_flags, "processor : 0\nmodel name : x\n"),
        (cpu.parse_lscpu, "bash: lscpu: command not found\n"),
        (cpu.parse_free, "Mem: 1 2 3\n"),
        (cpu.parse_id_list, "0-x"),
    ],
)
def test_parsers_refuse_text_they_do_not_understand(
    parser: Callable[[str], Any], text: str
) -> None:
    with pytest.raises(ParseError):
        parser(text)


def test_id_lists_as_lscpu_writes_them() -> None:
    assert cpu.parse_id_list("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert cpu.parse_id_list("5") == (5,)


# --------------------------------------------------------------------------- verdicts

REHEARSAL = CPU_REHEARSAL
CPU = inventory_doc(
    {"box": "192.0.2.30"},
    ["box"],
    ["box"],
    "box",
    **REHEARSAL,
    overrides={"cpu": {"kv_cache_gib": 1, "cores_per_engine": 1}},
)


def ctx_of(doc: Mapping[str, Any] = CPU, host: str = "box") -> HostContext:
    return contexts(load(doc, "inv.yaml"))[host]


def this_machine() -> str:
    return (FIX / "this-machine.txt").read_text(encoding="utf-8")


def by_id(results: list[Any]) -> dict[str, Any]:
    return {r.id: r for r in results}


def test_a_cpu_host_runs_cpu_checks_and_skips_the_gpu_ones_with_the_reason() -> None:
    ctx = ctx_of()
    lines = [c.line for c in host_commands(ctx)]
    assert cpu.LSCPU in lines and cpu.FREE in lines and cpu.FLAGS in lines
    assert not any("nvidia-smi" in ln for ln in lines)
    results, facts = evaluate_host(ctx, this_machine())
    r = by_id(results)
    for cid in ("gpu.driver", "gpu.topology", "docker.nvidia_runtime", "docker.image_cuda"):
        assert r[cid].status == "skip" and "device: cpu" in r[cid].message
    assert not [x for x in results if x.id.startswith("gpu.") and x.status != "skip"]
    assert r["cpu.flags"].status == "pass" and "_C (AVX512" in r["cpu.flags"].message
    assert r["cpu.cores"].status == "pass", r["cpu.cores"].message
    assert "decode@box 1; prefill@box 0" in r["cpu.cores"].message
    assert "NIXL pins its thread to core 1" in r["cpu.cores"].message
    assert r["cpu.memory"].status == "pass"
    assert r["cpu.ucx_tcp"].status == "pass"
    assert facts.cpu is not None and facts.cpu.info is not None


def test_a_gpu_host_runs_no_cpu_checks() -> None:
    ctx = ctx_of(
        changed(CPU, {"device": None, "cpu": None, "decode.gpus": [1], "prefill.gpus": [0]})
    )
    assert not [c for c in host_commands(ctx) if c.area == "cpu"]
    results, _ = evaluate_host(ctx, this_machine())
    assert not [r for r in results if r.area == "cpu"]
    assert "gpu.driver" not in by_id(results) or by_id(results)["gpu.driver"].status != "skip"


def test_missing_flags_fail_with_a_fix() -> None:
    ctx = ctx_of(changed(CPU, {"requirements.cpu_flags": ["avx2", "amx_tile"]}))
    r = by_id(evaluate_host(ctx, this_machine())[0])["cpu.flags"]
    assert (
        r.status == "fail" and "lacks amx_tile" in r.message and "requirements.cpu_flags" in r.fix
    )


def test_bf16_on_an_amx_cpu_is_warned_about() -> None:
    ctx = ctx_of(changed(CPU, {"prefill.extra_args": ["--dtype", "bfloat16"]}))
    flags = cpu.parse_flags(this_machine().split("### exit", 1)[0])
    amx = flags | {"amx_bf16", "amx_tile"}
    f = cpu.CpuFacts(Section("", 0), Section("", 0), Section("", 0), amx, None, None)
    r = by_id(cpu._flags(ctx, f))
    assert r["cpu.dtype"].status == "warn" and "prefill@box" in r["cpu.dtype"].message
    f_no_amx = dataclasses.replace(f, flags=flags)
    assert "cpu.dtype" not in by_id(cpu._flags(ctx, f_no_amx))


def test_cores_the_host_lacks_fail_with_a_fix() -> None:
    ctx = ctx_of(changed(CPU, {"cpu.cores_per_engine": 2}))
    r = by_id(evaluate_host(ctx, this_machine())[0])["cpu.cores"]
    assert r.status == "fail" and "decode@box: core(s) [2, 3]" in r.message
    assert "cpus or cpu.cores_per_engine" in r.fix


def test_memory_kv_cache_and_overhead_per_engine() -> None:
    ctx = ctx_of(changed(CPU, {"cpu.kv_cache_gib": 10}))
    r = by_id(evaluate_host(ctx, this_machine())[0])["cpu.memory"]
    # 2 x (10 + 2) GiB = 24 GiB > 22.5 GiB available on this machine
    assert r.status == "fail" and "24.0 GiB" in r.message and "cpu.kv_cache_gib" in r.fix
    ok = by_id(evaluate_host(ctx_of(), this_machine())[0])["cpu.memory"]
    assert ok.status == "pass" and "2 engine(s) x (1 GiB KV cache + ~2 GiB) = 6.0 GiB" in ok.message


def _with_shm(avail_kib: int) -> HostFacts:
    m = Mount("tmpfs", avail_kib, avail_kib, "/dev/shm")
    disk = DiskFacts("/var/lib/docker", "/", m, m, m)
    return HostFacts(host=HostSysFacts(Section("", 0), disk, Section("", 0), ()))


def test_shm_needs_512_mib_free_per_engine() -> None:
    ctx = ctx_of()
    assert cpu._shm(ctx, _with_shm(1 << 20)).status == "pass"  # 1 GiB for 2 engines
    r = cpu._shm(ctx, _with_shm(600 << 10))
    assert r.status == "fail" and "Insufficient space in /dev/shm" in r.message
    assert "remount" in r.fix


@pytest.mark.parametrize(
    ("tls", "rdma", "status"),
    [
        ("tcp", "off", "pass"),
        ("rc,ud", "off", "fail"),
        ("^tcp", "auto", "fail"),
        ("^rc", "off", "pass"),
        ("rc", "on", "pass"),
        ("all", "off", "pass"),
    ],
)
def test_ucx_needs_tcp_without_rdma(tls: str, rdma: str, status: str) -> None:
    r = cpu._ucx_tcp(ctx_of(changed(CPU, {"kv_transfer": {"rdma": rdma, "ucx": {"tls": tls}}})))
    assert r.status == status, r.message
    if status == "fail":
        assert "tcp" in r.fix


def test_unparsed_output_is_said_so() -> None:
    ctx = ctx_of()
    out = f"### $ {cpu.FLAGS}\n### exit=1\n### $ {cpu.LSCPU}\nnope\n### exit=0\n"
    r = by_id(evaluate_host(ctx, out)[0])
    assert r["cpu.flags"].status == "fail" and "could not parse" in r["cpu.flags"].message
    assert r["cpu.cores"].status == "fail" and "could not parse" in r["cpu.cores"].message
    assert r["cpu.memory"].status == "fail"


def test_cpu_needs_carry_each_engines_cores_and_dtype() -> None:
    ctx = ctx_of()
    assert ctx.cpu_engines == (
        CpuNeed("decode@box", (1,), 1, "float32"),
        CpuNeed("prefill@box", (0,), 1, "float32"),
    )
    assert ctx.cpu_host and not ctx.gpus_here and ctx.cpu_kv_gib == 1


def test_tier_agreement_counts_pdboots_cpu_dtype() -> None:
    from pdboot.preflight.checks import agreement

    same = changed(CPU, {"prefill.extra_args": ["--dtype", "float32"]})
    assert agreement.evaluate(load(same, "inv.yaml")).status == "pass"
    differ = changed(CPU, {"prefill.extra_args": ["--dtype", "bfloat16"]})
    r = agreement.evaluate(load(differ, "inv.yaml"))
    assert r.status == "fail" and "prefill 'bfloat16', decode 'float32'" in r.message


def test_tp_ranks_left_to_vllm_need_a_numa_node_each() -> None:
    doc = inventory_doc(
        {"box": "192.0.2.30", "box2": "192.0.2.31"},
        ["box2"],
        ["box"],
        "box",
        **REHEARSAL,
        overrides={"prefill.tensor_parallel_size": 2, "decode.tensor_parallel_size": 2},
    )
    r = by_id(evaluate_host(ctx_of(doc, "box2"), this_machine())[0])["cpu.cores"]
    assert r.status == "fail" and "prefill@box2" in r.message and "this host has 1" in r.message
    assert "cpu.cores_per_engine" in r.fix
