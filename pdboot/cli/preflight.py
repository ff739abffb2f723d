"""`pdboot preflight`'s body: deploy.py's typer command reads the arguments and calls
``preflight``, which checks every host and prints the report."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from pdboot.cli.console import load, refuse_example_addresses, stderr, stdout
from pdboot.exitcodes import EXIT_FAILED, EXIT_OK, EXIT_USAGE


def preflight(
    inventory: Path | None,
    *,
    json_out: bool = False,
    only: Sequence[str] = (),
    skip: Sequence[str] = (),
    accept_new_host_keys: bool = False,
    verbose: bool = False,
) -> int:
    """Check every host before anything is pulled; the exit code (exit 2 for a bad inventory)."""
    inv = load(inventory)
    from pdboot.preflight import run as pf
    from pdboot.preflight.checks import AREAS
    from pdboot.views import preflight as report

    sel = pf.Selection.of(
        [x for v in only for x in v.split(",") if x],
        [x for v in skip for x in v.split(",") if x],
    )
    if sel.unknown():
        stderr().print(
            f"unknown check or area: {', '.join(sel.unknown())} (areas: {', '.join(AREAS)})"
        )
        return EXIT_USAGE
    refuse_example_addresses(inv)
    result = pf.run_preflight(inv, accept_new_host_keys=accept_new_host_keys, selection=sel)
    if json_out:
        sys.stdout.write(report.to_json(result) + "\n")
    else:
        report.print_report(result, stdout(), verbose=verbose)
    # a reader of stdout gone (`| head`) shows here, inside the command, where click turns
    # it into exit 1 without a traceback, not at the interpreter's exit
    sys.stdout.flush()
    return EXIT_OK if result.ok else EXIT_FAILED
