"""What a pdboot command does around its work, without the CLI framework: the consoles, the
inventory it reads (the argument, else $PDBOOT_INVENTORY, else ./inventory.yaml) with its
problems printed, and example addresses refused. A command run with --json also gets those
refusals as JSON on stdout (``json_errors``; pdboot/diagnostics.py's shape): a JSON document
for render, status and preflight, its event stream's `done` line for up, down and stage.

A refusal ends the command with ``SystemExit(code)``: typer lets that through with its code."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NoReturn

from pdboot.diagnostics import Diagnostic
from pdboot.exitcodes import EXIT_USAGE

if TYPE_CHECKING:  # each command imports what it uses: `pdboot --version` loads none of it
    from rich.console import Console

    from pdboot.inventory.load import InventoryIssue
    from pdboot.inventory.schema import Inventory

INVENTORY_ENV = "PDBOOT_INVENTORY"
DEFAULT_INVENTORY = Path("inventory.yaml")

out: Console | None = None  # rich consoles, made on first use (tests may set their own)
err: Console | None = None

JsonErrors = Literal["document", "stream"]
# (how, the command) while a command runs with --json; app.py's root callback clears it
json_errors: tuple[JsonErrors, str] | None = None
loaded_from: Path | None = None  # the inventory file the command read (for file:line)


def errors_as_json(how: JsonErrors, command: str) -> None:
    """From here on a refusal is also printed as JSON on stdout (`--json`)."""
    global json_errors
    json_errors = (how, command)


def refuse(diagnostics: list[Diagnostic], code: int = EXIT_USAGE) -> NoReturn:
    """End the command with ``code``; under --json the diagnostics go to stdout as JSON (the
    words were printed on stderr already)."""
    if json_errors is not None:
        import json

        from pdboot.diagnostics import error_document

        how, command = json_errors
        if how == "document":
            doc = json.dumps(error_document(diagnostics), indent=2)
        else:
            from pdboot.views.jsonl import refused_json

            doc = refused_json(command, diagnostics, code)
        sys.stdout.write(doc + "\n")
        sys.stdout.flush()
    raise SystemExit(code)


def stdout() -> Console:
    global out
    if out is None:
        from rich.console import Console

        out = Console()
    return out


def stderr() -> Console:
    global err
    if err is None:
        from rich.console import Console

        err = Console(stderr=True)
    return err


def inventory_path(given: Path | None) -> Path:
    """The inventory a command reads: the argument, else $PDBOOT_INVENTORY, else
    ./inventory.yaml when it exists (exit 2 naming all three when none is there)."""
    if given is not None:
        return given
    env = os.environ.get(INVENTORY_ENV, "")
    if env:
        return Path(env)
    if DEFAULT_INVENTORY.is_file():
        return DEFAULT_INVENTORY
    why = (
        f"no inventory: give INVENTORY, set {INVENTORY_ENV}, or create ./{DEFAULT_INVENTORY} "
        "(examples/ has some to start from)"
    )
    stderr().print(why, highlight=False, markup=False, soft_wrap=True)
    refuse([Diagnostic("error", why)])


def load(path: Path | None) -> Inventory:
    """The validated inventory, or every problem printed as ``file:line: key: message``
    and exit 2."""
    from pdboot.inventory.load import InventoryError, load_inventory

    global loaded_from
    given = inventory_path(path)
    try:
        inv = load_inventory(given)
    except InventoryError as e:
        from rich.text import Text  # only to report: `preflight --json` loads no rich

        for issue in e.issues:
            # Text, not markup: messages quote user input and key paths like [0].
            stderr().print(Text(str(issue), style="red"), highlight=False, soft_wrap=True)
        n = len(e.issues)
        stderr().print(
            f"{n} problem{'s' if n != 1 else ''} in the inventory; nothing was done.",
            soft_wrap=True,
        )
        refuse([_diagnostic(i) for i in e.issues])
    loaded_from = given
    return inv


def _diagnostic(issue: InventoryIssue) -> Diagnostic:
    where = f"{issue.file}:{issue.line}" if issue.line else issue.file
    said = str(issue).removeprefix(f"{where}: ")  # "key.path: message"
    return Diagnostic("error", said, "", issue.file, issue.line)


def example_addresses(inv: Inventory) -> list[Diagnostic]:
    """One per host whose address is from the documentation ranges (an example's), at the
    line of its ``address`` in the inventory read."""
    from pdboot.inventory.load import key_lines
    from pdboot.inventory.safety import is_documentation_address

    names = [n for n, h in inv.hosts.items() if is_documentation_address(h.address)]
    if not names:
        return []
    file = str(loaded_from) if loaded_from is not None else None
    lines = key_lines(file, [("hosts", n, "address") for n in names]) if file else []
    return [
        Diagnostic(
            "error",
            f"hosts.{name}.address: {inv.hosts[name].address} is a documentation address "
            "(an example's): put the host's own address there",
            "",
            file,
            lines[i] if lines else None,
        )
        for i, name in enumerate(names)
    ]


def located(d: Diagnostic) -> str:
    """``file:line: summary``, as the inventory's problems print."""
    if d.file is None:
        return d.summary
    return f"{d.file}:{d.line}: {d.summary}" if d.line else f"{d.file}: {d.summary}"


def refuse_example_addresses(inv: Inventory) -> None:
    """Before a verb connects: an address from the documentation ranges (an example's,
    unedited) would only time out after seconds; exit 2 naming each at once."""
    found = example_addresses(inv)
    for d in found:
        stderr().print(located(d), style="red", highlight=False, markup=False, soft_wrap=True)
    if found:
        refuse(found)


def warn_example_addresses(inv: Inventory) -> None:
    """`render` works offline on an example as it is; it says what preflight/up will refuse."""
    for d in example_addresses(inv):
        note = f"note: {located(d)} before preflight/up"
        stderr().print(note, style="yellow", markup=False, highlight=False, soft_wrap=True)
