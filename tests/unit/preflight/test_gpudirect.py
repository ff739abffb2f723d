"""rdma.gpudirect on real text: the kernel release and /proc/driver/nvidia/version lines
of the H200 capture (open modules) and the R550 line (proprietary)."""

from __future__ import annotations

from pathlib import Path

from pdboot.inventory.schema import Requirements
from pdboot.preflight.checks import HostContext, Section, gdr
from pdboot.preflight.checks.facts import HostFacts
from pdboot.preflight.checks.rdma import Port, RdmaFacts
from tests.unit.paths import FIXTURES

FIX = FIXTURES


def _line(path: Path, prefix: str) -> str:
    return next(ln for ln in path.read_text().splitlines() if ln.startswith(prefix))


H200_NVRM = _line(FIX / "h200-host" / "host.txt", "NVRM version:")
R550_NVRM = _line(FIX / "derived" / "r550-old-driver.txt", "NVRM version:")
H200_KERNEL = "6.18.44-fc-v657-gpu"  # `uname -a` of the same capture


def out(kernel: str, nvrm: str, *modules: str) -> str:
    return "\n".join([f"kernel={kernel}", *(f"module={m}" for m in modules), f"nvrm={nvrm}"])


def test_open_modules_on_a_new_kernel_give_dmabuf() -> None:
    f = gdr.parse_text(out(H200_KERNEL, H200_NVRM))
    assert f.kernel == (6, 18) and f.open_modules and f.dmabuf
    r = gdr.verdict(f)
    assert r.status == "pass" and "dma-buf" in r.message


def test_proprietary_modules_need_nvidia_peermem() -> None:
    r = gdr.verdict(gdr.parse_text(out("5.15.0-107-generic", R550_NVRM)))
    assert r.status == "warn" and "proprietary" in r.message
    assert "modprobe nvidia_peermem" in r.fix
    r = gdr.verdict(gdr.parse_text(out("5.15.0-107-generic", R550_NVRM, "nvidia_peermem")))
    assert r.status == "pass" and "nvidia_peermem" in r.message


def test_open_modules_on_an_old_kernel_have_no_dmabuf() -> None:
    r = gdr.verdict(gdr.parse_text(out("5.4.0-150-generic", H200_NVRM)))
    assert r.status == "warn" and "older than 5.12" in r.message


def test_judged_only_when_rdma_will_be_used() -> None:
    s = {"gdr": Section(out(H200_KERNEL, R550_NVRM), 0)}
    on = HostContext("h", ("decode",), Requirements(), rdma_mode="on")
    auto = HostContext("h", ("decode",), Requirements(), rdma_mode="auto")
    found = gdr.parse(on, s)
    assert found is not None and not found.dmabuf
    assert gdr.parse(on, {}) is None  # the command did not run
    none = RdmaFacts([], [], [])
    usable = RdmaFacts(["uverbs0"], [Port("mlx5_0", 1, "ACTIVE", "InfiniBand")], [])
    assert [r.status for r in gdr.evaluate(on, HostFacts(rdma=none, gdr=found))] == ["warn"]
    assert gdr.evaluate(auto, HostFacts(rdma=none, gdr=found)) == []
    assert gdr.evaluate(auto, HostFacts(gdr=found)) == []  # RDMA not checked
    ids = [r.id for r in gdr.evaluate(auto, HostFacts(rdma=usable, gdr=found))]
    assert ids == [gdr.CHECK_ID]
    assert gdr.commands(HostContext("h", ("decode",), Requirements(), rdma_mode="off")) == []
