"""docs/preflight.md names every check id preflight can emit: its index is what
scripts/gen_preflight_ids.py writes from the ids in pdboot/preflight/ (the scan
docs/troubleshooting.md is generated from), so an id added to the code fails here until the
page is regenerated."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from tests.unit.paths import ROOT

DOC = ROOT / "docs" / "preflight.md"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_committed_index_is_the_generated_one() -> None:
    gen = _load("gen_preflight_ids")
    text = DOC.read_text(encoding="utf-8")
    assert gen.render(text, gen._scan()) == text, "run: python3 scripts/gen_preflight_ids.py"


def test_every_check_id_appears_on_the_page() -> None:
    ids = _load("gen_troubleshooting").check_ids()
    assert {"secrets.env", "weights.revision", "ssh.connect", "gpu.driver"} <= ids
    text = DOC.read_text(encoding="utf-8")
    assert sorted(i for i in ids if f"`{i}`" not in text) == []


def test_an_id_new_to_the_code_would_change_the_index() -> None:
    gen = _load("gen_preflight_ids")
    text = DOC.read_text(encoding="utf-8")
    ids = gen._scan()
    grown = gen.render(text, ids | {"gpu.brand_new"})
    assert grown != text and "[`gpu.brand_new`](troubleshooting.md#gpubrand_new)" in grown
    assert gen.render(grown, ids) == text  # and regenerating puts it back
