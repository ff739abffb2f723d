"""Inventory errors in the operator's words (issue 33): what a key takes, never pydantic's
regex or a model's class name."""

from __future__ import annotations

import json
import re

import pytest

from pdboot.inventory.jsonschema import inventory_schema
from pdboot.inventory.load import _PATTERN_WORDS, InventoryError, parse_inventory
from tests.unit.paths import INVENTORIES

BASE = (INVENTORIES / "1p1d.yaml").read_text()


def messages(text: str) -> list[str]:
    with pytest.raises(InventoryError) as e:
        parse_inventory(text)
    return [str(i) for i in e.value.issues]


def test_every_pattern_in_the_schema_has_words() -> None:
    patterns = set(re.findall(r'"pattern": "((?:[^"\\]|\\.)*)"', json.dumps(inventory_schema())))
    assert patterns, "the schema has patterns"
    missing = {json.loads(f'"{p}"') for p in patterns} - set(_PATTERN_WORDS)
    assert missing == set()


@pytest.mark.parametrize(
    ("old", "new", "words"),
    [
        (r"^name: .*$", "name: Bad Name", "lower-case letters, digits"),
        (r"^router:", "router: 5\nunused:", "must be a mapping"),
        (r"^model_revision: .*$|\Z", "model_revision: ../x\n", "branch, tag or commit"),
    ],
)
def test_messages_say_what_the_key_takes(old: str, new: str, words: str) -> None:
    found = messages(re.sub(old, new, BASE, count=1, flags=re.M))
    assert any(words in m for m in found), found
    assert not any("should match pattern" in m or "instance of" in m for m in found), found
