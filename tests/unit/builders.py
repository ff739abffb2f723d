"""One way for unit tests to build an inventory: a document with the fields a test cares about,
changed by dotted paths, then YAML text read by pdboot's own loader (parse_inventory), so every
rule and every ``file:line`` a test meets is the real one.

    inventory()                                   # 1P1D: p1 -> d1, router on r
    inventory(hosts={"a": "192.0.2.10"}, prefill=["a"], decode=["a"], router="a")
    inventory(overrides={"decode.engines_per_host": 2, "kv_transfer.rdma": "off"})
    inventory(overrides={"router.host": None})    # None deletes: an inventory with a hole
    load(changed(BASE, {"prefill.gpus": [0]}), "inv.yaml")   # a test's own base, changed

Tests whose subject is the text itself (YAML syntax, hostile documents, line numbers of a
hand-written layout) keep their text; everything else starts here.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from pdboot.inventory.load import parse_inventory
from pdboot.inventory.schema import Inventory

# TEST-NET-1 addresses (RFC 5737): nothing answers there, and pdboot never connects in a unit test
HOSTS: Mapping[str, str] = {"p1": "192.0.2.10", "d1": "192.0.2.11", "r": "192.0.2.12"}


def inventory_doc(
    hosts: Mapping[str, str] = HOSTS,
    prefill: Sequence[str] = ("p1",),
    decode: Sequence[str] = ("d1",),
    router: str = "r",
    *,
    name: str = "demo",
    model: str = "m",
    device: str | None = None,
    image: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The inventory as a document: ``hosts`` maps names to addresses, the tiers name hosts,
    then ``overrides`` (see ``changed``). Keys come in the order an operator writes them."""
    doc: dict[str, Any] = {"name": name, "model": model}
    if device is not None:
        doc["device"] = device
    if image is not None:
        doc["image"] = image
    doc["hosts"] = {h: {"address": a} for h, a in hosts.items()}
    doc["prefill"] = {"hosts": list(prefill)}
    doc["decode"] = {"hosts": list(decode)}
    doc["router"] = {"host": router}
    return changed(doc, overrides or {})


def changed(doc: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``doc`` with each ``"a.b.c": value`` set (the mappings on the way are made
    when missing; the value replaces what was there, whole); the value None deletes the key."""
    data = copy.deepcopy(dict(doc))
    for dotted, value in overrides.items():
        keys = dotted.split(".")
        node = data
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        if value is None:
            node.pop(keys[-1], None)
        else:
            node[keys[-1]] = copy.deepcopy(value)
    return data


def as_text(doc: Mapping[str, Any]) -> str:
    """YAML of ``doc``, keys in the document's order."""
    return yaml.safe_dump(dict(doc), sort_keys=False)


def load(doc: Mapping[str, Any], source: str = "inventory.yaml") -> Inventory:
    """The Inventory pdboot reads from ``doc``'s YAML in a file named ``source``."""
    return parse_inventory(as_text(doc), source)


def inventory(
    hosts: Mapping[str, str] = HOSTS,
    prefill: Sequence[str] = ("p1",),
    decode: Sequence[str] = ("d1",),
    router: str = "r",
    *,
    source: str = "inventory.yaml",
    **kw: Any,
) -> Inventory:
    """``load(inventory_doc(...))``: the keywords are inventory_doc's."""
    return load(inventory_doc(hosts, prefill, decode, router, **kw), source)
