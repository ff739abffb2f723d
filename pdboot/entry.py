"""The `pdboot` command's entry point (and `python -m pdboot`'s).

`pdboot --version` (`-V`) is what scripts and installers call to see whether pdboot is there; it
answers before the CLI framework (typer, click) is imported, about half of the start-up cost
of every other command. `pdboot preflight INVENTORY` starts its OpenSSH batches here, before
those imports (transport/headstart.py). Everything goes to the typer app in cli.py."""

from __future__ import annotations

import gc
import sys

from pdboot import __version__


def main() -> None:
    # The start-up imports (typer, pydantic's schemas, the checks) make ~10^5 objects and no
    # garbage; a collection every 700 allocations (CPython's default) cost ~25 ms of the
    # ~300 ms before `preflight` can send its batches. Collections stay on, just rarer.
    gc.set_threshold(50_000, 10, 10)
    if sys.argv[1:] in (["--version"], ["-V"]):
        print(f"pdboot {__version__}")
        return
    if sys.argv[1:2] == ["preflight"]:  # its SSH handshakes go first, beside the imports
        from pdboot.transport.headstart import begin

        begin(sys.argv[2:])
    from pdboot.cli import main as cli_main  # typer and click: only for a real command

    cli_main()
