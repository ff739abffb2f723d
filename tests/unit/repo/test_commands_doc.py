"""docs/commands.md has an entry for every verb `pdboot -h` lists (a `- \\`pdboot VERB` item or
a heading naming it), `export`'s subcommands included."""

from __future__ import annotations

import re

import typer.main

from pdboot.cli.main import app
from tests.unit.paths import ROOT

DOC = ROOT / "docs" / "commands.md"


def verbs() -> list[str]:
    """The commands `pdboot -h` lists (hidden ones are not), and `export`'s as `export k8s`."""
    group = typer.main.get_command(app)
    ctx = group.make_context("pdboot", [], resilient_parsing=True)
    out = []
    for name in group.list_commands(ctx):  # type: ignore[attr-defined]
        cmd = group.get_command(ctx, name)  # type: ignore[attr-defined]
        if cmd is None or cmd.hidden:
            continue
        out.append(name)
        if hasattr(cmd, "list_commands"):
            sub_ctx = cmd.make_context(name, [], parent=ctx, resilient_parsing=True)
            out += [f"{name} {s}" for s in cmd.list_commands(sub_ctx)]
    return out


def _documented(text: str, verb: str) -> bool:
    head, *sub = verb.split()
    entry = rf"^(- `pdboot {re.escape(head)}[ `]|#+ .*`pdboot {re.escape(head)}[ `])"
    lines = [ln for ln in text.splitlines() if re.match(entry, ln)]
    # `export slurm|k8s`: one entry may name several subcommands
    return bool(lines) and all(any(s in ln for ln in lines) for s in sub)


def test_the_verbs_are_read_from_the_cli() -> None:
    found = verbs()
    assert {"render", "preflight", "stage", "up", "down", "schema", "bench", "export k8s"} <= set(
        found
    )


def test_every_verb_has_its_entry() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert [v for v in verbs() if not _documented(text, v)] == []


def test_a_missing_entry_is_seen() -> None:
    assert not _documented("- `pdboot render X`: shows\n", "stage")
    assert _documented("- `pdboot stage INVENTORY`: fetches\n", "stage")
    assert not _documented("- `pdboot export slurm INVENTORY`\n", "export k8s")
