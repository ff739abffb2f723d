"""The command-line options several pdboot commands share (cli.py declares the rest)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

InventoryArg = Annotated[
    Path, typer.Argument(help="The inventory YAML file.", metavar="INVENTORY", show_default=False)
]

AcceptNewOpt = Annotated[
    bool,
    typer.Option(
        "--accept-new-host-keys",
        metavar="",
        help="Record unknown SSH host keys (like OpenSSH accept-new); changed keys still fail.",
    ),
]
NoWaitOpt = Annotated[
    bool,
    typer.Option(
        "--no-wait",
        metavar="",
        help="If another run holds this deployment's lock, exit 1 at once instead of waiting.",
    ),
]

EventsOpt = Annotated[
    str | None,
    typer.Option(
        "--events",
        help="Also write one JSON object per event to FILE ('-': stdout; the display then "
        "goes to stderr).",
        metavar="FILE",
    ),
]

PLAN_HELP = "Show each step of the change (capacity, endpoint up); change nothing. Exit 1: changes."
NO_ROLL = "Recreate every changed engine at once (and the router when its workers change)."
YES_HELP = "Accept the outage of a tier that cannot roll."
REFRESH_HELP = "Move to the commit model_revision names now (default: the staged one)."
RefreshOpt = Annotated[bool, typer.Option("--refresh-weights", help=REFRESH_HELP)]
