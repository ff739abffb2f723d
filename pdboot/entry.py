"""The `pdboot` command's entry point (and `python -m pdboot`'s).

`pdboot --version` (`-V`) is what scripts and installers call to see whether pdboot is there; it
answers before the CLI framework (typer, click) is imported, about half of the start-up cost
of every other command. Everything else goes to the typer app in cli/main.py."""

from __future__ import annotations

import os
import sys

from pdboot import __version__


def main() -> None:
    # pydantic hands every validation to the plugins installed beside it, found by reading
    # every installed package's entry points (~4 ms of each start): the inventory's values
    # (secret references among them) are pdboot's own, not shown to a plugin, unless the
    # operator sets PYDANTIC_DISABLE_PLUGINS themselves.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    if sys.argv[1:] in (["--version"], ["-V"]):
        print(f"pdboot {__version__}")
        return
    from pdboot.cli.main import main as cli_main  # typer and click: only for a real command

    cli_main()
