"""gpu.acs and gpu.iommu on the derived captures of fixtures/acs/ (README there): ACS
redirects on the switch ports above the GPUs warn with the ACS fix, root ports alone do not;
translated IOMMU groups of the GPUs warn with `iommu=pt`; lspci without root or missing
says the check is skipped; a one-GPU host skips both, saying why."""

from __future__ import annotations

import dataclasses

from pdboot.inventory.schema import Requirements
from pdboot.preflight.checks import HostContext, Section, gpu, gpu_acs, parse_sections
from pdboot.preflight.checks.facts import HostFacts
from tests.unit.paths import FIXTURES

CTX = HostContext("gpu", ("decode",), Requirements())


def acs_facts(name: str) -> gpu_acs.AcsFacts:
    s = parse_sections((FIXTURES / "acs" / name).read_text())
    keyed = {c.key: s.get(c.line, Section("", None)) for c in gpu_acs.commands(CTX)}
    f = gpu_acs.parse(CTX, keyed)
    assert f is not None
    return f


def results(name: str, n_gpus: int = 2) -> dict[str, tuple[str, str, str]]:
    gpus = tuple(
        gpu.Gpu(
            i, "NVIDIA H100 PCIe", f"GPU-{i}", "580.95.05", 81559, 0, 81559, "9.0", "Disabled", 0
        )
        for i in range(n_gpus)
    )
    g = gpu.GpuFacts(query=Section("", 0), gpus=gpus, driver="580.95.05", cuda="13.0")
    out = gpu_acs.evaluate(CTX, HostFacts(gpu=g, gpu_acs=acs_facts(name)))
    return {r.id: (r.status, r.message, r.fix) for r in out}


def test_acs_redirects_on_the_switch_ports_warn_with_the_fix() -> None:
    r = results("derived-2gpu-switch-acs-on.txt")
    status, msg, fix = r["gpu.acs"]
    assert status == "warn"
    assert "0000:1a:08.0: ReqRedir+ CmpltRedir+" in msg and "0000:1a:10.0" in msg
    assert "0000:00:01.0" not in msg and "0000:40:01.0" not in msg  # root ports left out
    assert "setpci" in fix and "ACSCtl" in fix
    status, msg, fix = r["gpu.iommu"]
    assert status == "warn" and "group 31: DMA-FQ" in msg and "intel_iommu=on" in msg
    assert "iommu=pt" in fix


def test_the_fixed_host_passes_both() -> None:
    r = results("derived-2gpu-acs-off-iommu-pt.txt")
    assert r["gpu.acs"][0] == "pass" and "3 PCIe switch ports" in r["gpu.acs"][1]
    assert r["gpu.iommu"][0] == "pass" and "iommu=pt" in r["gpu.iommu"][1]


def test_root_ports_alone_do_not_warn() -> None:
    f = acs_facts("derived-2gpu-switch-acs-on.txt")
    assert f.bridges is not None
    only_roots = tuple(b for b in f.bridges if b.root_port)
    assert f.gpus is not None and gpu_acs.acs_verdict(f.gpus, only_roots).status == "pass"
    # and a switch port counts only above a GPU: 0000:1a:08.0 is above 1b, not 1c
    assert [b.bdf for b in gpu_acs.bridges_above(f.bridges, "0000:1c:00.0")] == [
        "0000:00:01.0",
        "0000:19:00.0",
        "0000:1a:10.0",
    ]


def test_without_root_or_lspci_acs_is_skipped_saying_why() -> None:
    r = results("derived-no-root-no-iommu.txt")
    assert r["gpu.acs"][0] == "skip" and "only to root" in r["gpu.acs"][1]
    assert "sudo lspci -vvv" in r["gpu.acs"][2]
    assert r["gpu.iommu"][0] == "pass" and "IOMMU is off" in r["gpu.iommu"][1]
    r = results("derived-no-lspci.txt")
    assert r["gpu.acs"][0] == "skip" and "exit 127" in r["gpu.acs"][1]
    assert "pciutils" in r["gpu.acs"][2]


def test_one_gpu_skips_both_saying_why() -> None:
    r = results("derived-2gpu-switch-acs-on.txt", n_gpus=1)
    assert {k: v[0] for k, v in r.items()} == {"gpu.acs": "skip", "gpu.iommu": "skip"}
    assert "one GPU" in r["gpu.acs"][1]


def test_old_kernels_without_type_files_read_the_command_line() -> None:
    f = acs_facts("derived-2gpu-switch-acs-on.txt")
    no_types = dataclasses.replace(f, iommu_types=None)
    verdict = gpu_acs.iommu_verdict(no_types, f.gpus or ())
    assert verdict is not None and verdict.status == "warn"
    pt = dataclasses.replace(no_types, cmdline=("intel_iommu=on", "iommu=pt"))
    verdict = gpu_acs.iommu_verdict(pt, f.gpus or ())
    assert verdict is not None and verdict.status == "pass"


def test_no_gpus_here_runs_nothing() -> None:
    assert gpu_acs.commands(HostContext("router", ("router",), Requirements())) == []
