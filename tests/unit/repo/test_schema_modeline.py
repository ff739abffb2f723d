"""`pdboot schema` says how to wire it into an editor, and examples/ show it: each example's
first line is the YAML language server's modeline naming examples/inventory.schema.json,
which is what `pdboot schema` prints today (regenerate: `pdboot schema >
examples/inventory.schema.json`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import yaml

from pdboot.inventory.jsonschema import MODELINE, schema_text
from tests.unit.cli.test_cli import run
from tests.unit.paths import ROOT

SAVED = ROOT / "examples" / "inventory.schema.json"
EXAMPLES = [*sorted((ROOT / "examples").glob("*.yaml")), ROOT / "inventory.example.yaml"]
_MODELINE = re.compile(r"^# yaml-language-server: \$schema=(\S+)$")


def test_the_saved_schema_is_what_pdboot_schema_prints() -> None:
    assert SAVED.read_text() == schema_text(), "run: pdboot schema > examples/inventory.schema.json"


def test_every_example_names_the_schema_on_its_first_line() -> None:
    schema = json.loads(SAVED.read_text())
    for path in EXAMPLES:
        first = path.read_text().splitlines()[0]
        m = _MODELINE.match(first)
        assert m, (path.name, first)
        named = (path.parent / m.group(1)).resolve()
        assert named == SAVED.resolve(), path.name
        # and the example is valid by it, as the editor will say
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)


def test_pdboot_schema_prints_the_schema_and_how_to_use_it() -> None:
    code, out, err = run("schema")
    assert code == 0 and out == schema_text()
    assert MODELINE in err and "pdboot schema > inventory.schema.json" in err


def test_dash_v_answers_on_every_command() -> None:
    for argv in (["-V"], ["up", "-V"], ["render", "--version"], ["export", "k8s", "-V"]):
        code, out, _ = run(*argv)
        assert code == 0 and out.startswith("pdboot "), argv
    code, out, _ = run("status", "-h")
    assert "--version" in out and "-V" in out
    assert Path(SAVED).is_file()
