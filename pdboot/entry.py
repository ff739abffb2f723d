"""The `pdboot` command's entry point (and `python -m pdboot`'s).

`pdboot --version` (`-V`) is what scripts and installers call to see whether pdboot is there; it
answers before the CLI framework (typer, click) is imported, about half of the start-up cost
of every other command. `pdboot preflight INVENTORY [--json] [-v]` starts its OpenSSH batches
here, before those imports (transport/headstart.py), and runs without typer
(cli_preflight.py). Everything else goes to the typer app in cli.py."""

from __future__ import annotations

import gc
import os
import sys

from pdboot import __version__


def main() -> None:
    # The start-up imports (typer, pydantic's schemas, the checks) make ~10^5 objects and
    # almost no garbage. CPython's default (a collection every 700 allocations) cost ~25 ms
    # of the ~300 ms before `preflight` can send its batches; at 50,000, one collection still
    # cost ~10 ms; `preflight --json` on 2 hosts allocates ~57,000 and now collects none.
    # Collections stay on for the long-running verbs (watch, status --watch), just rarer.
    gc.set_threshold(100_000, 10, 10)
    # pydantic hands every validation to the plugins installed beside it, found by reading
    # every installed package's entry points (~4 ms of each start): the inventory's values
    # (secret references among them) are pdboot's own, not shown to a plugin, unless the
    # operator sets PYDANTIC_DISABLE_PLUGINS themselves.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    try:
        _dispatch()
    finally:
        # At exit CPython collects every generation again while it tears the modules down:
        # ~40 ms of the ~50 ms a `preflight` spent after its report was written. Objects
        # frozen here are left to the process's end; atexit handlers still run.
        gc.freeze()


def _dispatch() -> None:
    if sys.argv[1:] in (["--version"], ["-V"]):
        print(f"pdboot {__version__}")
        return
    if sys.argv[1:2] == ["preflight"]:
        from pdboot.cli_preflight import plain_line, run_plain

        line = plain_line(sys.argv[2:])
        if line is not None:  # its SSH handshakes go first, beside the imports; no typer
            from pdboot.transport.headstart import begin

            begin(line.inventory)
            run_plain(line)
    from pdboot.cli import main as cli_main  # typer and click: only for a real command

    cli_main()
