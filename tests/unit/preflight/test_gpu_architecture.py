"""gpu.compute_cap names the architecture: on the real H200 capture (compute capability 9.0)
with the default requirements (RTX PRO 6000 Blackwell, 12.0) it says the host is Hopper, not
Blackwell, and gives both ways out; the Blackwell profile and a 9.0 requirement pass."""

from __future__ import annotations

from pathlib import Path

from pdboot.inventory.schema import Requirements
from pdboot.preflight.checks import GpuNeed, HostContext, Section, gpu, parse_sections
from pdboot.preflight.checks.facts import HostFacts
from tests.unit.paths import FIXTURES

H200 = FIXTURES / "h200-host"
RTX = FIXTURES / "derived" / "rtx6000x2-r580-healthy.txt"


def _sections(path: Path) -> dict[str, Section]:
    return parse_sections(path.read_text(encoding="utf-8"))


def _h200_sections() -> dict[str, Section]:
    """The real capture, under the keys gpu.parse reads: its full --format=csv query (a header
    and units: parse_query takes the field names from the header)."""
    smi, host = _sections(H200 / "smi.txt"), _sections(H200 / "host.txt")
    query = next(v for k, v in smi.items() if k.endswith("--format=csv") and "pcie" in k)
    return {
        "query": query,
        "kmod": host[gpu.KMOD],
        "version": smi[gpu.VERSION],
        "apps": Section("", 0),  # the capture's apps query used other fields; none ran
    }


def _compute_cap(sections: dict[str, Section], req: Requirements) -> tuple[str, str, str]:
    ctx = HostContext("gpu", ("decode",), req, gpu_needs=(GpuNeed("decode", 1, "all"),))
    facts = gpu.parse(ctx, sections)
    assert facts is not None and facts.gpus
    r = next(r for r in gpu.evaluate(ctx, HostFacts(gpu=facts)) if r.id == "gpu.compute_cap")
    return r.status, r.message, r.fix or ""


def test_the_real_h200_is_reported_as_hopper_not_blackwell_with_its_fix() -> None:
    status, msg, fix = _compute_cap(_h200_sections(), Requirements())
    assert status == "warn"
    assert msg.startswith("NVIDIA H200: compute capability 9.0 (Hopper, sm_90), not Blackwell;")
    assert "requirements.compute_capability is 12.0 (Blackwell, sm_120)" in msg
    assert "run on Blackwell hosts (RTX PRO 6000 Blackwell)" in fix
    assert "requirements: {gpu_name: 'H200', compute_capability: '9.0'}" in fix
    assert "image built for sm_90" in fix


def test_the_h200_passes_when_the_inventory_asks_for_hopper() -> None:
    req = Requirements(gpu_name="H200", compute_capability="9.0")
    assert _compute_cap(_h200_sections(), req)[:2] == ("pass", "compute capability 9.0 (Hopper)")


def test_the_rtx_pro_6000_profile_is_blackwell() -> None:
    s = _sections(RTX)
    sections = {
        k: s.get(c, Section("", 0))
        for k, c in (
            ("query", gpu.QUERY),
            ("kmod", gpu.KMOD),
            ("version", gpu.VERSION),
            ("apps", gpu.APPS),
        )
    }
    assert _compute_cap(sections, Requirements())[:2] == (
        "pass",
        "compute capability 12.0 (Blackwell)",
    )


def test_an_unknown_capability_is_named_without_guessing_an_architecture() -> None:
    g = gpu.parse_query("0, NVIDIA Future, GPU-1, 600.1, 1000, 0, 1000, 13.5, Disabled, 0")
    ctx = HostContext("gpu", ("decode",), Requirements())
    r = gpu._other_architecture(ctx, [g[0].name], [g[0].compute_cap])
    assert "compute capability 13.5 (sm_135);" in r.message and "not Blackwell" not in r.message
