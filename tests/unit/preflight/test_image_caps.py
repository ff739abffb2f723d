"""The after-pull probe's parser and verdicts on real text (fixtures/image_caps/README.md),
and the orchestration helpers of pdboot/preflight/image_probe.py that need no host."""

from __future__ import annotations

import dataclasses
import shlex

import pytest

from pdboot.inventory.load import load_inventory
from pdboot.plan.build import build_plan
from pdboot.preflight import image_probe
from pdboot.preflight.checks import image_caps as ic
from tests.unit.paths import FIXTURES, INVENTORIES

FIX = FIXTURES / "image_caps"
IMG = "vllm/vllm-openai:v0.33.0"
# REAL torch.cuda.get_arch_list() outputs (pytorch/pytorch#182250)
CU128 = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")
CU126 = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")


def standin() -> ic.ImageCaps:
    return ic.parse((FIX / "standin-rtx6000.txt").read_text())


def test_the_standin_answer_parses_after_nixls_own_lines() -> None:
    c = standin()
    assert c.arch_list == CU128 and c.devices == ("12.0", "12.0")
    assert c.backends == ("UCX",) and {"cuda", "ib"} <= set(c.uct_modules)
    assert [r.status for r in ic.verdicts(c, IMG, rdma=True)] == ["pass", "pass"]


def test_an_image_without_torch_or_nixl_fails_both() -> None:
    c = ic.parse((FIX / "no-torch-no-nixl.txt").read_text())
    arch, nixl = ic.verdicts(c, IMG, rdma=False)
    assert arch.status == "fail" and "No module named 'torch'" in arch.message
    assert nixl.status == "fail" and "No module named 'nixl'" in nixl.message
    assert "INSTALL_KV_CONNECTORS" in nixl.fix


def test_kernels_without_sm_120_fail_on_an_rtx_pro_6000() -> None:
    c = dataclasses.replace(standin(), arch_list=CU126)
    arch = ic.verdicts(c, IMG, rdma=False)[0]
    assert arch.status == "fail" and "compute capability 12.0" in arch.message
    assert "sm_90" in arch.message and "sm_120" in arch.fix


@pytest.mark.parametrize(
    ("archs", "cap", "ok"),
    [
        (CU128, "12.0", True),
        (CU126, "12.0", False),
        (CU126, "8.9", True),  # sm_86 cubins run on 8.9 (same major, later minor)
        (("sm_90a",), "9.0", True),
        (("sm_90a",), "10.0", False),
        (("sm_80", "compute_90"), "12.0", True),  # PTX JIT-compiles forward
        (("sm_100a",), "10.3", False),  # arch-specific cubins run only on their own
    ],
)
def test_coverage_follows_cudas_compatibility_rules(
    archs: tuple[str, ...], cap: str, ok: bool
) -> None:
    assert ic.covers(archs, cap) is ok


def test_ucx_without_cuda_fails_without_ib_fails_only_with_rdma() -> None:
    no_cuda = dataclasses.replace(standin(), uct_modules=("cma", "ib", "tcp"))
    assert ic.verdicts(no_cuda, IMG, rdma=False)[1].status == "fail"
    no_ib = dataclasses.replace(standin(), uct_modules=("cma", "cuda", "tcp"))
    assert ic.verdicts(no_ib, IMG, rdma=True)[1].status == "fail"
    assert ic.verdicts(no_ib, IMG, rdma=False)[1].status == "pass"


def test_no_answer_is_a_failure_with_the_containers_last_lines() -> None:
    text = (
        'docker: Error response from daemon: could not select device driver "" with '
        "capabilities: [[gpu]].\n"
    )
    c = ic.parse(text, 125)
    assert c.problem and "exit 125" in c.problem and "could not select device driver" in c.problem
    assert all(r.status == "fail" for r in ic.verdicts(c, IMG, rdma=False))


def test_the_command_is_one_docker_run_with_the_hosts_gpus() -> None:
    argv = ic.docker_argv(IMG, (0, 1))
    assert argv[:8] == [
        "docker",
        "run",
        "--rm",
        "--gpus",
        '"device=0,1"',
        "--entrypoint",
        "python3",
        IMG,
    ]
    assert argv[8] == "-c" and argv[9] == ic.PROBE
    assert shlex.split(shlex.join(argv)) == argv
    compile(ic.PROBE, "probe", "exec")


def test_the_probe_gets_the_gpus_of_the_hosts_engines() -> None:
    inv = load_inventory(INVENTORIES / "colocated.yaml")
    box = build_plan(inv).hosts["box"]
    engines = [s for s in box.services if s.is_engine]
    assert image_probe.host_gpus(engines) == (0, 1)  # prefill GPU 0 + decode GPU 1
    res = {"box": ic.verdicts(standin(), IMG, rdma=False)}
    assert not image_probe.failed(res)
    assert res["box"][0].id == ic.ARCH_ID and res["box"][0].status == "pass"
    bad = {"box": ic.verdicts(dataclasses.replace(standin(), arch_list=CU126), IMG, rdma=False)}
    assert image_probe.failed(bad) and bad["box"][0].fix


# --------------------------------------------------------------------------- device: cpu


def cpu_caps(name: str = "cpu-venv-tcp.txt") -> ic.ImageCaps:
    return ic.parse((FIX / name).read_text())


CPU_IMG = "registry.example:5000/vllm-cpu:0.32.0"


def test_a_cpu_torch_with_nixl_over_tcp_passes_for_device_cpu() -> None:
    c = cpu_caps()
    assert c.torch == "2.13.0+cpu" and c.torch_cuda == "" and c.tcp_backend is True
    assert c.backends == ("UCX",) and c.devices == () and c.arch_list == ()
    arch, nixl = ic.verdicts(c, CPU_IMG, rdma=False, device="cpu")
    assert arch.status == "pass" and "CPU build of PyTorch (2.13.0+cpu)" in arch.message
    assert nixl.status == "pass" and "UCX_TLS=tcp" in nixl.message


def test_a_cpu_torch_is_refused_for_cuda() -> None:
    arch, _ = ic.verdicts(cpu_caps(), IMG, rdma=False, expected=("12.0",))
    assert arch.status == "fail" and "is a CPU build (no CUDA)" in arch.message
    assert "device: cpu" in arch.message


def test_a_cuda_torch_is_refused_for_cpu() -> None:
    c = standin()  # 2.11.0+cu128, captured before the probe asked torch.version.cuda
    assert c.torch_cuda is None
    arch, _ = ic.verdicts(c, CPU_IMG, rdma=False, device="cpu")
    assert arch.status == "fail" and "is a CUDA build" in arch.message
    cuda = dataclasses.replace(c, torch_cuda="12.8")
    assert ic.verdicts(cuda, CPU_IMG, rdma=False, device="cpu")[0].status == "fail"


def test_no_tcp_transport_fails_for_cpu_with_nixls_own_error() -> None:
    c = cpu_caps("cpu-venv-no-tcp.txt")
    assert c.tcp_backend is False and "NIXL_ERR_BACKEND" in c.tcp_error
    _, nixl = ic.verdicts(c, CPU_IMG, rdma=False, device="cpu")
    assert nixl.status == "fail" and "UCX_TLS=tcp" in nixl.message and "TCP" in nixl.fix
    # a probe that never asked (an older pdboot) is not taken for a pass
    _, unasked = ic.verdicts(
        dataclasses.replace(c, tcp_backend=None, tcp_error=""), CPU_IMG, rdma=False, device="cpu"
    )
    assert unasked.status == "fail" and "not asked" in unasked.message


def test_cpu_images_without_torch_or_nixl_fail_both() -> None:
    c = ic.parse((FIX / "no-torch-no-nixl.txt").read_text())
    arch, nixl = ic.verdicts(c, CPU_IMG, rdma=False, device="cpu")
    assert arch.status == "fail" and "No module named 'torch'" in arch.message
    assert nixl.status == "fail" and "nixl-cu12" in nixl.fix


def test_cpu_rdma_still_needs_an_ib_transport() -> None:
    c = dataclasses.replace(cpu_caps(), uct_modules=("cma",))
    assert ic.verdicts(c, CPU_IMG, rdma=True, device="cpu")[1].status == "fail"
    assert ic.verdicts(cpu_caps(), CPU_IMG, rdma=True, device="cpu")[1].status == "pass"


def test_the_cpu_probe_runs_without_gpus_and_asks_for_tcp() -> None:
    argv = ic.docker_argv(CPU_IMG, "all", "cpu")
    assert "--gpus" not in argv and argv[-1] == "tcp" and argv[-2] == ic.PROBE
    assert ic.docker_argv(IMG, "all")[:5] == ["docker", "run", "--rm", "--gpus", "all"]


def test_the_real_cpu_engine_image_passes_for_cpu_and_fails_for_cuda() -> None:
    c = cpu_caps("vllm-cpu-0.32.0-image.txt")
    assert c.torch == "2.13.0+cpu" and c.tcp_backend is True and c.uct_modules == ("cma",)
    assert [r.status for r in ic.verdicts(c, CPU_IMG, rdma=False, device="cpu")] == [
        "pass",
        "pass",
    ]
    arch, nixl = ic.verdicts(c, CPU_IMG, rdma=False)
    assert arch.status == "fail" and "CPU build" in arch.message
    assert nixl.status == "fail" and "no CUDA transport" in nixl.message


def test_a_ucx_without_its_tcp_transport_fails_for_cpu() -> None:
    c = cpu_caps("vllm-cpu-0.32.0-no-sysfs.txt")
    arch, nixl = ic.verdicts(c, CPU_IMG, rdma=False, device="cpu")
    assert arch.status == "fail" and "/dev/urandom" in arch.message
    assert nixl.status == "fail" and "NIXL_ERR_BACKEND" in nixl.message
