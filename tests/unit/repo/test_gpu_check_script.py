"""scripts/gpu_check.py (`make gpu-wheels`, `make gpu-check`): the parts that run without a
GPU run here for real -- the capture writes blocks that pdboot's own parse_sections reads
back (exit codes, a timeout), the inventory loads through pdboot's loader with one `local`
host, the wheel download asks for the GPU host's interpreter and only the runtime
dependencies, and the folder packs into one archive. The GPU run itself is CONTRIBUTING's."""

from __future__ import annotations

import importlib.util
import itertools
import sys
import tarfile
from pathlib import Path
from types import ModuleType

from pdboot.inventory.load import parse_inventory
from pdboot.preflight.checks import gpu, gpu_settings, parse_sections, rdma, topo
from tests.unit.paths import FIXTURES, ROOT


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod
    spec.loader.exec_module(mod)
    return mod


G = _script()


def test_captured_blocks_read_back_through_parse_sections() -> None:
    text, timings = G.capture(
        ["echo one; echo two >&2", "printf 'no newline'; exit 3", "sleep 5"], 1
    )
    s = parse_sections(text)
    assert s["echo one; echo two >&2"].output == "one\ntwo\n"
    assert s["echo one; echo two >&2"].rc == 0
    assert (s["printf 'no newline'; exit 3"].output, s["printf 'no newline'; exit 3"].rc) == (
        "no newline\n",
        3,
    )
    assert s["sleep 5"].rc == 124 and "timed out" in s["sleep 5"].output
    assert [t["exit"] for t in timings] == [0, 3, 124]


def test_it_captures_exactly_the_lines_preflight_runs() -> None:
    cmds = G.pdboot_commands()
    for line in (gpu.QUERY, gpu.APPS, gpu.VERSION, gpu.KMOD, topo.COMMAND, rdma.IBV):
        assert line in cmds
    assert {gpu_settings.P2P, gpu_settings.HMM} <= set(cmds)  # ACS / IOMMU, HMM
    assert {"nvidia-smi -q", "cat /proc/cmdline", "ls /sys/kernel/iommu_groups"} <= set(G.EXTRA)


def test_a_spent_budget_records_the_rest_as_not_run() -> None:
    text, timings = G.capture(["sleep 2", "echo never"], timeout_s=10, budget_s=1)
    s = parse_sections(text)
    assert s["sleep 2"].rc == 124  # cut at the budget, not at its own 10 s
    assert s["echo never"].rc == 124 and "budget spent" in s["echo never"].output
    assert [t["exit"] for t in timings] == [124, 124]


def test_the_inventory_is_one_local_host_with_the_default_requirements() -> None:
    inv = parse_inventory(G.INVENTORY, "gpucheck.yaml")
    assert [h.address for h in inv.hosts.values()] == ["local"]
    # the defaults: an H100/H200 shows what preflight says to a host that is not Blackwell
    assert inv.requirements.compute_capability == "12.0"


def test_the_wheels_are_for_the_gpu_hosts_python_and_only_the_runtime_deps() -> None:
    reqs = G.runtime_requirements()
    assert {"typer>=0.12", "fabric>=3.2", "pydantic>=2.6,<3"} <= set(reqs)
    assert not any(r.startswith(("pytest", "mypy", "ruff")) for r in reqs)
    cmd = G.download_command(Path("/w"), "3.12", reqs)
    assert "--only-binary=:all:" in cmd
    pairs = set(itertools.pairwise(cmd))
    assert {("--python-version", "3.12"), ("--abi", "cp312"), ("--dest", "/w")} <= pairs
    assert ("--platform", "manylinux2014_x86_64") in pairs
    assert cmd[-len(reqs) :] == reqs


def test_readme_names_the_gpu_from_pdboots_own_query(tmp_path: Path) -> None:
    smi = parse_sections((FIXTURES / "derived" / "rtx6000x2-r580-healthy.txt").read_text())
    g0 = G.first_gpu(smi[gpu.QUERY].output)
    assert g0["compute_cap"] == "12.0" and "RTX PRO 6000" in g0["name"]
    assert "compute capability 12.0" in G.readme(g0, "today")
    assert G.first_gpu("bash: nvidia-smi: command not found\n") == {}


def test_the_output_folder_packs_into_one_archive(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "smi.txt").write_text(G.block("true", "", 0))
    (out / "preflight.json").write_text("{}")
    tar = G.pack(out)
    with tarfile.open(tar) as t:
        assert sorted(t.getnames()) == ["out/preflight.json", "out/smi.txt"]
