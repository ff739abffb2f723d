"""Every inventory in examples/ loads and renders (they are also rendered and checked from
outside, so a broken one must fail here first)."""

from __future__ import annotations

import pytest
import yaml

from pdboot.inventory.load import load_inventory
from pdboot.plan.build import build_plan
from pdboot.plan.render import render_all, render_summary
from tests.unit.paths import ROOT

EXAMPLES = ROOT / "examples"
FILES = sorted(p.name for p in EXAMPLES.glob("*.yaml"))


def test_there_are_examples() -> None:
    assert len(FILES) >= 4
    assert "rtx6000-2x8-tp1-4p4d.yaml" in FILES and "rtx6000-1x8-colocated.yaml" in FILES


@pytest.mark.parametrize("name", FILES)
def test_example_loads_and_renders(name: str) -> None:
    inv = load_inventory(EXAMPLES / name)
    plan = build_plan(inv)
    texts = render_all(plan)
    assert set(texts) == set(plan.hosts)
    for host, text in texts.items():
        doc = yaml.safe_load(text)
        assert set(doc["services"]) == {s.name for s in plan.hosts[host].services}
    assert "Endpoint:" in render_summary(plan)
    # addresses are documentation ones: nobody is reached by trying an example as is
    assert all(h.address.startswith("192.0.2.") for h in inv.hosts.values())


def test_the_8_gpu_examples_use_every_gpu() -> None:
    for name in ("rtx6000-2x8-tp1-4p4d.yaml", "rtx6000-2x8-tp2-groups.yaml"):
        plan = build_plan(load_inventory(EXAMPLES / name))
        for host in ("gpu-a", "gpu-b"):
            used = [
                g for s in plan.hosts[host].services if s.gpus not in (None, "all") for g in s.gpus
            ]
            assert sorted(used) == list(range(8)), (name, host)
    colo = build_plan(load_inventory(EXAMPLES / "rtx6000-1x8-colocated.yaml"))
    assert len(colo.hosts["box"].services) == 10  # 8 engines, router, proxy


def test_the_example_inventory_shows_every_key() -> None:
    """inventory.example.yaml holds every key of the schema, set or commented out (issue 33):
    an operator learns the inventory from it; `pdboot schema` is the same as JSON Schema."""
    import re

    from pdboot.inventory.jsonschema import inventory_schema

    schema = inventory_schema()
    defs = schema["$defs"]
    keys: set[tuple[str, ...]] = set()

    def walk(node: dict, path: tuple[str, ...]) -> None:
        if "$ref" in node:
            node = defs[node["$ref"].split("/")[-1]]
        for sub in node.get("anyOf", []) + node.get("allOf", []):
            walk(sub, path)
        if isinstance(node.get("items"), dict):
            walk(node["items"], path)
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], path)
        for k, v in node.get("properties", {}).items():
            keys.add((*path, k))
            walk(v, (*path, k))

    walk(schema, ())
    text = (ROOT / "inventory.example.yaml").read_text()
    missing = [
        ".".join(k)
        for k in sorted(keys)
        if not re.search(rf"^[ #]*(- )?{re.escape(k[-1])}:|[{{,] *{re.escape(k[-1])}:", text, re.M)
    ]
    assert missing == []


def test_the_inventory_reference_is_generated_and_every_key_has_words() -> None:
    """docs/inventory-reference.md is scripts/gen_inventory_reference.py's output (run it after
    changing the models or the example), and no key is left without a word about it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gen_ref", ROOT / "scripts" / "gen_inventory_reference.py"
    )
    assert spec and spec.loader
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    text = gen.reference_text()
    assert (ROOT / "docs" / "inventory-reference.md").read_text() == text
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) > 100
    assert [r for r in rows if r.endswith("|  |")] == []
