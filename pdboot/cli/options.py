"""The command-line options several pdboot commands share (each command module declares
the rest)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdboot.cli.console import DEFAULT_INVENTORY, INVENTORY_ENV

InventoryArg = Annotated[
    Path | None,
    typer.Argument(
        help=f"The inventory YAML file (default: ${INVENTORY_ENV}, else ./{DEFAULT_INVENTORY}).",
        metavar="INVENTORY",
        show_default=False,
    ),
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

JsonEventsOpt = Annotated[
    bool,
    typer.Option(
        "--json",
        metavar="",
        help="Print one JSON object per event on stdout (the same as --events -).",
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

PLAN_HELP = (
    "Show each step of the change (capacity, endpoint up) and what differs per engine; "
    "change nothing. Exit 0 unless it fails (see --detailed-exitcode)."
)
DETAILED_HELP = "With --plan: exit 0 no changes, 2 changes, 1 error (as terraform plan)."
NO_ROLL = "Recreate every changed engine at once (and the router when its workers change)."
YES_HELP = "Accept the outage of a tier that cannot roll."
REFRESH_HELP = "Move to the commit model_revision names now (default: the staged one)."
RefreshOpt = Annotated[bool, typer.Option("--refresh-weights", help=REFRESH_HELP)]
