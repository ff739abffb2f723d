"""gpu.p2p and gpu.hmm on published `nvidia-smi topo -p2p r` outputs and the uvm_disable_hmm
parameter (fixtures/p2p/, README there): blocked pairs inside a tensor-parallel engine fail
with the ACS / IOMMU fix, pairs between engines warn, HMM on under CUDA 13 with several GPUs
warns with the modprobe option; a one-GPU host or an older CUDA is not judged."""

from __future__ import annotations

import pytest

from pdboot.inventory.schema import Requirements
from pdboot.preflight.checks import (
    GpuNeed,
    HostContext,
    ParseError,
    Section,
    gpu,
    gpu_settings,
    parse_sections,
)
from pdboot.preflight.checks.facts import HostFacts
from tests.unit.builders import rtx_gpus
from tests.unit.paths import FIXTURES

P2P = FIXTURES / "p2p"


def sections(name: str) -> dict[str, Section]:
    return parse_sections((P2P / name).read_text())


def facts(name: str, n_gpus: int, cuda: str = "13.0") -> HostFacts:
    s = sections(name)
    settings = gpu_settings.parse(
        ctx(),
        {
            "p2p": s.get(gpu_settings.P2P, Section("", None)),
            "hmm": s.get(gpu_settings.HMM, Section("", None)),
        },
    )
    gpus = rtx_gpus(n_gpus, "NVIDIA RTX PRO 6000")
    g = gpu.GpuFacts(query=Section("", 0), gpus=gpus, driver="580.95.05", cuda=cuda)
    return HostFacts(gpu=g, gpu_settings=settings)


def ctx(*needs: GpuNeed) -> HostContext:
    return HostContext("gpu", ("decode",), Requirements(), gpu_needs=needs)


def by_id(c: HostContext, f: HostFacts) -> dict[str, tuple[str, str, str]]:
    return {r.id: (r.status, r.message, r.fix or "") for r in gpu_settings.evaluate(c, f)}


def test_the_published_matrices_parse() -> None:
    h100 = gpu_settings.parse_p2p(sections("h100x8-ok.txt")[gpu_settings.P2P].output)
    assert len(h100) == 56 and set(h100.values()) == {"OK"}
    l4 = gpu_settings.parse_p2p(sections("l4x2-cns.txt")[gpu_settings.P2P].output)
    assert l4 == {(0, 1): "CNS", (1, 0): "CNS"}
    assert (
        gpu_settings.parse_p2p(sections("derived-1gpu-hmm-off.txt")[gpu_settings.P2P].output) == {}
    )
    # the header underlined on a terminal (escape codes), tabs instead of spaces
    assert gpu_settings.parse_p2p("\t\x1b[4mGPU0\tGPU1\x1b[0m\n GPU0\tX\tNS\n GPU1\tNS\tX\n") == {
        (0, 1): "NS",
        (1, 0): "NS",
    }


@pytest.mark.parametrize("text", ["", "GPU0 GPU1\n GPU0 X\n", "no matrix here\n"])
def test_malformed_matrices_raise_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        gpu_settings.parse_p2p(text)


def test_a_tp_engine_over_a_blocked_pair_fails_with_the_acs_iommu_fix() -> None:
    c = ctx(GpuNeed("decode", 4, (0, 1, 2, 3)))
    status, msg, fix = by_id(c, facts("derived-4gpu-two-islands-hmm-on.txt", 4))["gpu.p2p"]
    assert status == "fail"
    assert "GPU 0 <-> GPU 2: CNS (chipset not supported)" in msg and "GPU 0 <-> GPU 1" not in msg
    assert "ACS" in fix and "iommu=pt" in fix


def test_blocked_pairs_only_between_engines_warn() -> None:
    c = ctx(GpuNeed("prefill", 2, (0, 1)), GpuNeed("decode", 2, (2, 3)))
    status, msg, _ = by_id(c, facts("derived-4gpu-two-islands-hmm-on.txt", 4))["gpu.p2p"]
    assert status == "warn" and "GPU 1 <-> GPU 3: CNS" in msg


def test_all_ok_passes_and_one_gpu_is_not_judged() -> None:
    c = ctx(GpuNeed("decode", 8, "all"))
    assert by_id(c, facts("h100x8-ok.txt", 8))["gpu.p2p"][0] == "pass"
    assert "gpu.p2p" not in by_id(
        ctx(GpuNeed("decode", 1, "all")), facts("derived-1gpu-hmm-off.txt", 1)
    )


def test_hmm_on_with_several_gpus_under_cuda_13_warns_with_the_modprobe_option() -> None:
    c = ctx(GpuNeed("decode", 4, "all"))
    status, msg, fix = by_id(c, facts("derived-4gpu-two-islands-hmm-on.txt", 4))["gpu.hmm"]
    assert status == "warn" and "uvm_disable_hmm=N" in msg and "CUDA 13.0" in msg
    assert "options nvidia_uvm uvm_disable_hmm=1" in fix
    # the same host under a CUDA 12 driver: not judged
    assert "gpu.hmm" not in by_id(c, facts("derived-4gpu-two-islands-hmm-on.txt", 4, "12.8"))


def test_hmm_off_or_unloaded_passes() -> None:
    c = ctx(GpuNeed("decode", 2, "all"))
    assert by_id(c, facts("derived-1gpu-hmm-off.txt", 2))["gpu.hmm"][0] == "pass"
    unloaded = by_id(c, facts("derived-uvm-not-loaded.txt", 2))["gpu.hmm"]
    assert unloaded[0] == "pass" and "not loaded" in unloaded[1]


def test_the_commands_run_on_gpu_hosts_only() -> None:
    lines = [c.line for c in gpu_settings.commands(ctx(GpuNeed("decode", 1, "all")))]
    assert lines == [gpu_settings.P2P, gpu_settings.HMM]
    router = HostContext("r", ("router",), Requirements())
    assert gpu_settings.commands(router) == []
