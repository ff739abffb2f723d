"""One CLI convention on every verb: -h and -V, help without value types, the exit codes in
every --help, --json where a verb has machine output, one --out, --accept-new-host-keys on
every verb that connects, the inventory from $PDBOOT_INVENTORY or ./inventory.yaml, and
terraform's plan codes."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path

import jsonschema
import pytest
import typer.main
import yaml
from typer.testing import CliRunner

from pdboot import __version__
from pdboot.cli.main import app
from pdboot.cli.operations import since_time
from pdboot.inventory import yamlsafe
from tests.unit.paths import UNIT

HERE = UNIT
ROOT = HERE.parents[1]
ONE = HERE / "inventories" / "1p1d.yaml"
runner = CliRunner()
VERBS = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
CONNECTS = {"preflight", "stage", "up", "down", "status", "logs", "watch"}
EVENTS = {"stage", "up", "down", "watch"}  # verbs whose machine output is the event stream
TYPE_WORDS = re.compile(r"<(bool|str|int|float|path|text|list\[str\])>|range\]|\{INVENTORY\}")


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = runner.invoke(app, list(args), env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def test_every_verb_is_covered() -> None:
    assert {
        "render",
        "preflight",
        "stage",
        "up",
        "down",
        "status",
        "logs",
        "bench",
        "watch",
        "schema",
    } <= set(VERBS)


@pytest.mark.parametrize("verb", VERBS)
def test_help_short_flag_no_types_and_exit_codes(verb: str) -> None:
    code, text = run(verb, "-h")
    assert code == 0, text
    words = " ".join(line.strip(" │") for line in text.splitlines())
    assert not TYPE_WORDS.search(text), TYPE_WORDS.search(text)
    assert "Exit codes: 0 success; 1" in " ".join(words.split())


@pytest.mark.parametrize("verb", sorted(CONNECTS))
def test_verbs_that_connect_take_accept_new_host_keys(verb: str) -> None:
    cmd = typer.main.get_command(app).commands[verb]  # type: ignore[attr-defined]
    assert "--accept-new-host-keys" in {o for p in cmd.params for o in p.opts}


@pytest.mark.parametrize("verb", sorted(EVENTS | {"render", "preflight", "status"}))
def test_verbs_with_machine_output_take_json(verb: str) -> None:
    cmd = typer.main.get_command(app).commands[verb]  # type: ignore[attr-defined]
    opts = {o for p in cmd.params for o in p.opts}
    assert "--json" in opts
    if verb in EVENTS:
        assert "--events" in opts  # kept: other tools read it


def test_one_out_option() -> None:
    for verb in ("render", "bench"):
        cmd = typer.main.get_command(app).commands[verb]  # type: ignore[attr-defined]
        assert "--out" in {o for p in cmd.params for o in p.opts}


def test_short_version_and_root_help() -> None:
    code, text = run("-V")
    assert code == 0 and text.strip() == f"pdboot {__version__}"
    code, text = run("-h")
    assert code == 0 and "Exit codes" in text and "schema" in text


def test_json_and_events_file_together_is_usage(tmp_path: Path) -> None:
    code, text = run("down", str(ONE), "--json", "--events", str(tmp_path / "e.jsonl"))
    assert code == 2 and "choose one" in text


def test_detailed_exitcode_needs_plan() -> None:
    code, text = run("up", str(ONE), "--detailed-exitcode")
    assert code == 2 and "goes with --plan" in text


def test_inventory_from_the_environment_then_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PDBOOT_INVENTORY", raising=False)
    code, text = run("render")
    assert code == 2 and "PDBOOT_INVENTORY" in text and "./inventory.yaml" in text
    code, text = run("render", env={"PDBOOT_INVENTORY": str(ONE)})
    assert code == 0 and "services:" in text
    (tmp_path / "inventory.yaml").write_text(ONE.read_text())
    code, text = run("render")
    assert code == 0 and "services:" in text


def test_render_json_is_json_with_every_service() -> None:
    result = runner.invoke(app, ["render", str(ONE), "--json"])
    assert result.exit_code == 0
    doc = json.loads(result.stdout)  # notes go to stderr: stdout is the JSON alone
    assert set(doc["hosts"]) and doc["endpoint"].endswith("/v1")
    roles = {s["role"] for s in doc["services"]}
    assert {"prefill", "decode", "router"} <= roles
    for host, item in doc["hosts"].items():
        assert yaml.safe_load(item["compose"])["services"], host
    engines = [s for s in doc["services"] if s["role"] in ("prefill", "decode")]
    assert all("--kv-transfer-config" in s["command"] for s in engines)


def test_schema_is_json_schema_that_accepts_every_example() -> None:
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    schema = json.loads(result.stdout)  # the hint to save it goes to stderr
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    examples = [*sorted((ROOT / "examples").glob("*.yaml")), ROOT / "inventory.example.yaml"]
    for path in examples:
        _, data = yamlsafe.load(path.read_text())  # as pdboot reads it
        errors = [e.message for e in validator.iter_errors(data)]
        assert errors == [], (path.name, errors[:3])
    # and it refuses what the loader refuses: an unknown top-level key
    doc = yaml.safe_load(ONE.read_text()) | {"routre": {}}
    assert any("routre" in e.message for e in validator.iter_errors(doc))


@pytest.mark.parametrize(
    ("value", "back"), [("30s", 30), ("10m", 600), ("2h", 7200), ("1d", 86400), ("1.5m", 90)]
)
def test_since_durations(value: str, back: int) -> None:
    assert since_time(value, 1_000_000.0) == 1_000_000 - back


def test_since_times_need_a_zone() -> None:
    t = since_time("2026-12-04T10:00:00Z", 0.0)
    assert t == int(datetime(2026, 12, 4, 10, tzinfo=timezone.utc).timestamp())
    with pytest.raises(ValueError):
        since_time("2026-12-04T10:00:00", 0.0)
    with pytest.raises(ValueError):
        since_time("ten minutes", 0.0)


def test_bad_since_is_usage() -> None:
    code, text = run("logs", str(ONE), "decode", "--since", "yesterday")
    assert code == 2 and "--since 'yesterday'" in text


@pytest.mark.parametrize("verb", sorted(CONNECTS | {"watch"}))
def test_an_unedited_example_address_is_refused_before_connecting(verb: str) -> None:
    # 1p1d.yaml's hosts are 192.0.2.x (RFC 5737): trying them costs seconds of timeouts
    code, text = run(verb, str(ONE))
    assert code == 2 and "192.0.2.10 is a documentation address" in text, text


@pytest.mark.parametrize(
    ("address", "doc"),
    [
        ("192.0.2.7", True),
        ("198.51.100.1", True),
        ("203.0.113.9", True),
        ("2001:db8::1", True),
        ("gpu-a.example.com", True),
        ("h.test", True),
        ("10.77.1.10", False),
        ("gpu-a.lab.internal", False),
        ("192.0.3.1", False),
        ("local", False),
    ],
)
def test_documentation_addresses(address: str, doc: bool) -> None:
    from pdboot.inventory.safety import is_documentation_address

    assert is_documentation_address(address) is doc


def test_render_notes_documentation_addresses_and_still_renders() -> None:
    # offline on an unedited example works, and says what preflight/up will refuse
    result = runner.invoke(app, ["render", str(ONE)])
    assert result.exit_code == 0 and "services:" in result.stdout
    assert "192.0.2.10 is a documentation address" in result.stderr
