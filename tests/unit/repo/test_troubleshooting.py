"""docs/troubleshooting.md is what scripts/gen_troubleshooting.py writes, and it has a
section for every log signature and every preflight check id; `up`'s outputs link them."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

from rich.console import Console

from pdboot.preflight.checks import CheckResult
from pdboot.preflight.run import HostReport, PreflightResult
from pdboot.verify.diagnose import SIGNATURES, diagnose
from pdboot.views import preflight as report
from tests.unit.paths import ROOT

DOC = ROOT / "docs" / "troubleshooting.md"


def _gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_troubleshooting", ROOT / "scripts" / "gen_troubleshooting.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _anchors() -> set[str]:
    return set(re.findall(r'<a id="([^"]+)"></a>', DOC.read_text(encoding="utf-8")))


def test_the_committed_doc_is_the_generated_one() -> None:
    assert DOC.read_text(encoding="utf-8") == _gen().render(), (
        "run: python3 scripts/gen_troubleshooting.py > docs/troubleshooting.md"
    )


def test_every_log_signature_has_a_section_with_its_cause_and_fix() -> None:
    text = DOC.read_text(encoding="utf-8")
    anchors = _anchors()
    for s in SIGNATURES:
        assert f"log-{s.id}" in anchors, s.id
        assert s.cause in text and s.fix in text, s.id


def test_every_preflight_check_id_has_a_section() -> None:
    ids = _gen().check_ids()
    # the ids the preflight's real runs produce, as a floor for the scan
    assert {"gpu.nvidia_smi", "network.side_channel", "host.disk_docker", "ssh.connect"} <= ids
    assert ids - _anchors() == set()


def test_a_check_id_added_to_the_code_would_be_missing_from_the_doc(tmp_path: Path) -> None:
    """The scan sees a new id in the source (so a doc not regenerated fails the tests)."""
    gen = _gen()
    (tmp_path / "new.py").write_text('X = CheckResult("gpu.brand_new", "fail", "m", "f")\n')
    gen.PREFLIGHT = tmp_path
    assert gen.check_ids() == {"gpu.brand_new"}
    assert gen.preflight_entries() == {"gpu.brand_new": [("fail", "m", "f")]}
    assert "gpu.brand_new" not in _anchors()


def test_fixes_in_the_doc_are_the_ones_preflight_prints() -> None:
    text = DOC.read_text(encoding="utf-8")
    section = text.split('<a id="gpu.nvidia_smi"></a>', 1)[1].split("<a id=", 1)[0]
    assert "nvidia-smi not found: no NVIDIA driver installed" in section
    assert "install an R580+ NVIDIA driver" in section


def test_up_links_a_diagnosis_and_a_failed_preflight_check_to_their_sections() -> None:
    found = diagnose({"decode@h2": ["RuntimeError: NIXL compatibility hash mismatch"]})
    assert found[0].lines()[-1] == "  see docs/troubleshooting.md#log-nixl_compat_hash"
    assert "log-nixl_compat_hash" in _anchors()
    res = PreflightResult(
        {"h": HostReport("h", True, [CheckResult("gpu.nvidia_smi", "fail", "no", "install")])}
    )
    console = Console(record=True, width=200, color_system=None)
    report.print_compact(res, console)
    assert "see docs/troubleshooting.md#gpu.nvidia_smi" in console.export_text()
    assert "gpu.nvidia_smi" in _anchors()
