"""The inventory's JSON Schema, from the pydantic models that validate it (`pdboot schema`):
editors that speak JSON Schema (VS Code's YAML extension, JetBrains) complete keys and flag
mistakes as an operator types. The schema describes the shape; the cross-field rules
(inventory/rules.py) run only at load, where errors carry file:line."""

from __future__ import annotations

from typing import Any

from pdboot.inventory.schema import Inventory

DIALECT = "https://json-schema.org/draft/2020-12/schema"


def inventory_schema() -> dict[str, Any]:
    schema = Inventory.model_json_schema(mode="validation")
    return {
        "$schema": DIALECT,
        "title": "pdboot inventory",
        "description": "One P/D deployment: hosts, model, tiers, router (pdboot render/up/down).",
        **{k: v for k, v in schema.items() if k != "title"},
    }


SCHEMA_FILE = "inventory.schema.json"  # examples/ holds a copy; each example names it
MODELINE = f"# yaml-language-server: $schema={SCHEMA_FILE}"


def schema_text() -> str:
    """What `pdboot schema` prints (and examples/inventory.schema.json holds)."""
    import json

    return json.dumps(inventory_schema(), indent=2) + "\n"
