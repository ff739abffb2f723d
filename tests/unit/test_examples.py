"""Every inventory in examples/ loads and renders (they are also rendered and checked from
outside, so a broken one must fail here first)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pdboot.inventory.load import load_inventory
from pdboot.plan.build import build_plan
from pdboot.plan.render import render_all, render_summary

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
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
