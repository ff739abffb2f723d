"""What a pdboot command does around its work, without the CLI framework: the consoles, the
inventory it reads (the argument, else $PDBOOT_INVENTORY, else ./inventory.yaml) with its
problems printed, and example addresses refused.

A refusal ends the command with ``SystemExit(code)``: typer lets that through with its code."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from pdboot.exitcodes import EXIT_USAGE

if TYPE_CHECKING:  # each command imports what it uses: `pdboot --version` loads none of it
    from rich.console import Console

    from pdboot.inventory.schema import Inventory

INVENTORY_ENV = "PDBOOT_INVENTORY"
DEFAULT_INVENTORY = Path("inventory.yaml")

out: Console | None = None  # rich consoles, made on first use (tests may set their own)
err: Console | None = None


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
    stderr().print(
        f"no inventory: give INVENTORY, set {INVENTORY_ENV}, or create ./{DEFAULT_INVENTORY} "
        "(examples/ has some to start from)",
        highlight=False,
        markup=False,
    )
    raise SystemExit(EXIT_USAGE)


def load(path: Path | None) -> Inventory:
    """The validated inventory, or every problem printed as ``file:line: key: message``
    and exit 2."""
    from pdboot.inventory.load import InventoryError, load_inventory

    try:
        return load_inventory(inventory_path(path))
    except InventoryError as e:
        from rich.text import Text  # only to report: `preflight --json` loads no rich

        for issue in e.issues:
            # Text, not markup: messages quote user input and key paths like [0].
            stderr().print(Text(str(issue), style="red"), highlight=False, soft_wrap=True)
        n = len(e.issues)
        stderr().print(f"{n} problem{'s' if n != 1 else ''} in the inventory; nothing was done.")
        raise SystemExit(EXIT_USAGE) from None


def example_addresses(inv: Inventory) -> list[str]:
    """One line per host whose address is from the documentation ranges (an example's)."""
    from pdboot.inventory.safety import is_documentation_address

    return [
        f"hosts.{name}: {h.address} is a documentation address (an example's): put the "
        "host's own address there"
        for name, h in inv.hosts.items()
        if is_documentation_address(h.address)
    ]


def refuse_example_addresses(inv: Inventory) -> None:
    """Before a verb connects: an address from the documentation ranges (an example's,
    unedited) would only time out after seconds; exit 2 naming each at once."""
    found = example_addresses(inv)
    for line in found:
        stderr().print(line, style="red", highlight=False, markup=False)
    if found:
        raise SystemExit(EXIT_USAGE)


def warn_example_addresses(inv: Inventory) -> None:
    """`render` works offline on an example as it is; it says what preflight/up will refuse."""
    for line in example_addresses(inv):
        note = f"note: {line} before preflight/up"
        stderr().print(note, style="yellow", markup=False, highlight=False, soft_wrap=True)
