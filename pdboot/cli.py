"""The command line: arguments in, calls into the core, rich output out. No logic here.

Exit codes: 0 success, 1 a check or deployment step failed, 2 bad usage or inventory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console

from pdboot import __version__
from pdboot.inventory import Inventory, InventoryError, load_inventory

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

app = typer.Typer(
    name="pdboot",
    help="Stand up a disaggregated prefill/decode vLLM deployment over SSH and Docker.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)

InventoryArg = Annotated[Path, typer.Argument(help="The inventory YAML file.", show_default=False)]


def _load(path: Path) -> Inventory:
    try:
        return load_inventory(path)
    except InventoryError as e:
        for issue in e.issues:
            err.print(f"[red]error[/red] {issue}", highlight=False, markup=True, soft_wrap=True)
        raise typer.Exit(EXIT_USAGE) from None


def _not_yet(command: str) -> NoReturn:
    err.print(f"pdboot {command} is not implemented yet.")
    raise typer.Exit(EXIT_USAGE)


def _version(value: bool) -> None:
    if value:
        out.print(f"pdboot {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    """pdboot: preflight, render, up, status, logs, down."""


@app.command()
def render(inventory: InventoryArg) -> None:
    """Show the compose projects `up` would ship to each host (a dry run)."""
    _load(inventory)
    _not_yet("render")


@app.command()
def preflight(inventory: InventoryArg) -> None:
    """Check every host before anything is pulled."""
    _load(inventory)
    _not_yet("preflight")


@app.command()
def up(inventory: InventoryArg) -> None:
    """Pull, start decode, prefill, router; prove a request flows; print the endpoint."""
    _load(inventory)
    _not_yet("up")


@app.command()
def down(inventory: InventoryArg) -> None:
    """Stop and remove everything pdboot started (router, prefill, decode)."""
    _load(inventory)
    _not_yet("down")


@app.command()
def status(inventory: InventoryArg) -> None:
    """Show each service's state, health and whether it matches the inventory."""
    _load(inventory)
    _not_yet("status")


@app.command()
def logs(inventory: InventoryArg, service: str) -> None:
    """Show one service's logs."""
    _load(inventory)
    _not_yet("logs")


def main() -> None:
    app()
