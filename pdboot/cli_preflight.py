"""`pdboot preflight`, without the CLI framework: cli.py's typer command calls ``preflight``,
and entry.py calls ``run_plain`` for the command line operators type most, `pdboot preflight
INVENTORY [--json] [-v]`, before typer is imported. typer's import and its reading of the
arguments cost ~35 ms of CPU on the path before the batches can be sent."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple, NoReturn

from pdboot.cli_base import load, refuse_example_addresses, stderr, stdout
from pdboot.exitcodes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE

_FLAGS = {"--json", "-v", "--verbose"}


class PlainLine(NamedTuple):
    """`pdboot preflight INVENTORY` with --json and -v/--verbose at most."""

    inventory: Path
    json_out: bool
    verbose: bool


def plain_line(args: Sequence[str]) -> PlainLine | None:
    """The arguments after `preflight` as typer reads them, when they are one inventory path
    and --json / -v / --verbose at most; None for any other line (typer reads those)."""
    names = [a for a in args if not a.startswith("-")]
    flags = [a for a in args if a.startswith("-")]
    if len(names) != 1 or any(f not in _FLAGS for f in flags):
        return None
    return PlainLine(Path(names[0]), "--json" in flags, "-v" in flags or "--verbose" in flags)


def run_plain(line: PlainLine) -> NoReturn:
    """Run it and exit as typer's command would: its exit code, 130 on Ctrl-C, and 1 without
    a traceback when the reader of stdout has gone (`| head`)."""
    try:
        code = preflight(line.inventory, json_out=line.json_out, verbose=line.verbose)
        sys.stdout.flush()  # a reader gone shows here, not at the interpreter's exit
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except BrokenPipeError:
        # what is still buffered must not fail again at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = EXIT_FAILED
    sys.exit(code)


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
    from pdboot.transport.headstart import current

    head_start = current()  # OpenSSH batches started by entry.py, before the imports
    inv = load(inventory)
    opening = None
    if not only and not skip:  # no selection to refuse: the handshakes overlap the imports
        from pdboot.inventory.rules import deployment_hosts
        from pdboot.transport.preconnect import Opening

        refuse_example_addresses(inv)
        ahead = head_start.hosts if head_start is not None else set()
        rest = [h for h in deployment_hosts(inv) if h not in ahead]
        if rest:  # paramiko's connects (a host whose OpenSSH batch fails connects later)
            opening = Opening(inv, rest, accept_new_host_keys=accept_new_host_keys)
    try:
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
        if opening is None:
            refuse_example_addresses(inv)
        result = pf.run_preflight(
            inv,
            accept_new_host_keys=accept_new_host_keys,
            selection=sel,
            opening=opening,
            head_start=head_start,
        )
    finally:
        if opening is not None:
            opening.close_untaken()
        if head_start is not None:
            head_start.close()
    if json_out:
        sys.stdout.write(report.to_json(result) + "\n")
    else:
        report.print_report(result, stdout(), verbose=verbose)
    return EXIT_OK if result.ok else EXIT_FAILED
