"""tests/unit/builders.py, the one inventory builder of the unit tests: what it builds is what
pdboot's loader reads from the text an operator would write, and its changes do what they say."""

from __future__ import annotations

import pytest

from pdboot.inventory.load import InventoryError, parse_inventory
from tests.unit.builders import as_text, changed, inventory, inventory_doc

WRITTEN = """\
name: demo
model: m
hosts:
  p1: {address: 192.0.2.10}
  d1: {address: 192.0.2.11}
  r: {address: 192.0.2.12}
prefill: {hosts: [p1]}
decode: {hosts: [d1], engines_per_host: 2}
router: {host: r}
kv_transfer: {rdma: "off"}
"""


def test_the_default_is_the_written_1p1d() -> None:
    built = inventory(overrides={"decode.engines_per_host": 2, "kv_transfer.rdma": "off"})
    assert built == parse_inventory(WRITTEN)


def test_changes_replace_whole_values_make_sections_and_none_deletes() -> None:
    base = inventory_doc(overrides={"decode.data_parallel": {"size": 2, "expert_parallel": True}})
    doc = changed(base, {"decode.data_parallel": {"size": 4}, "watch.port": 9, "router.host": None})
    assert doc["decode"]["data_parallel"] == {"size": 4}  # replaced, not merged
    assert doc["watch"] == {"port": 9} and doc["router"] == {}
    assert base["router"] == {"host": "r"}  # the base is left as it was
    assert list(doc) == ["name", "model", "hosts", "prefill", "decode", "router", "watch"]
    assert as_text(doc).startswith("name: demo\nmodel: m\nhosts:\n")


def test_a_refused_change_is_the_loaders_refusal_with_its_line() -> None:
    with pytest.raises(InventoryError, match=r"^inv\.yaml:\d+: router"):
        inventory(overrides={"router.host": None}, source="inv.yaml")
