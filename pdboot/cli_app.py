"""What every pdboot command shares: the typer app and its conventions (`-h`, `-V`, help
without type names, the exit codes), the consoles, the inventory argument and its default,
and the event views. The commands themselves are in cli.py (deploy verbs) and cli_ops.py
(the verbs around a running deployment)."""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from pdboot import __version__
from pdboot.cli_options import DEFAULT_INVENTORY, INVENTORY_ENV
from pdboot.exitcodes import EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:  # each command imports what it uses: `pdboot --version` loads none of it
    from rich.console import Console

    from pdboot.events import Emit
    from pdboot.inventory.schema import Inventory

EXIT_CODES = (
    "Exit codes: 0 success; 1 a check or deployment step failed; 2 bad usage, inventory or "
    "secret reference (`up --plan --detailed-exitcode`: 2 changes); 130 interrupted."
)


def _plain_help(params: list[Any]) -> list[Any]:
    """typer's help prints a value type beside every option (``<bool>`` on flags, which take
    no value, ``<float range> [x>=1]``, ``<path>``): an operator reads the metavar the option
    declares (SECONDS, DIR), or the option's own name, and the limits in its help text."""
    for p in params:
        if isinstance(p, TyperOption):
            if p.is_flag and p.metavar is None:
                p.metavar = ""
            elif p.metavar is None:
                p.metavar = (p.name or "value").upper()
            p._get_number_range_help_str = lambda: None  # type: ignore[method-assign]
        elif isinstance(p, TyperArgument):
            p.display_type_rich = lambda ctx: None  # type: ignore[method-assign]
            p._get_number_range_help_str = lambda: None  # type: ignore[method-assign]
    return params


class Command(TyperCommand):
    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_help(super().get_params(ctx))


class Group(TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_help(super().get_params(ctx))


app = typer.Typer(
    cls=Group,
    name="pdboot",
    help="Stand up a disaggregated prefill/decode vLLM deployment over SSH and Docker.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
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


def command(fn: Callable[..., None]) -> Callable[..., None]:
    """``app.command()``, with the docstring's hard line breaks joined (--help rewraps each
    paragraph to the terminal instead of breaking summaries mid-sentence) and the exit codes
    under every command's help."""
    doc = inspect.getdoc(fn) or ""
    paragraphs = [" ".join(p.split()) for p in doc.split("\n\n")]
    return app.command(help="\n\n".join(paragraphs), epilog=EXIT_CODES, cls=Command)(fn)


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
    raise typer.Exit(EXIT_USAGE)


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
        raise typer.Exit(EXIT_USAGE) from None


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
        raise typer.Exit(EXIT_USAGE)


def warn_example_addresses(inv: Inventory) -> None:
    """`render` works offline on an example as it is; it says what preflight/up will refuse."""
    for line in example_addresses(inv):
        note = f"note: {line} before preflight/up"
        stderr().print(note, style="yellow", markup=False, highlight=False, soft_wrap=True)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"pdboot {__version__}")  # plain: the one command that loads no rich
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", "-V", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    """pdboot: preflight, render, up, status, logs, down."""


def events_target(events: str | None, as_json: bool) -> str | None:
    """`--json` on a verb that emits events is `--events -`."""
    if as_json and events not in (None, "-"):
        stderr().print("--json and --events FILE: choose one", highlight=False, markup=False)
        raise typer.Exit(EXIT_USAGE)
    return "-" if as_json else events


@contextmanager
def views(events: str | None) -> Iterator[tuple[Emit, Console]]:
    """The terminal view (on stderr when the events go to stdout) plus, with --events,
    the JSON-lines view; yields (emit, the console the display uses)."""
    from pdboot.events import fan
    from pdboot.views.jsonl import JsonLinesView
    from pdboot.views.terminal import TerminalView

    console = stderr() if events == "-" else stdout()
    terminal = TerminalView(console)
    stream: IO[str] | None = None
    try:
        if events is None:
            yield terminal, console
            return
        try:
            stream = sys.stdout if events == "-" else open(events, "w", encoding="utf-8")  # noqa: SIM115
        except OSError as e:
            stderr().print(f"cannot write {events}: {e.strerror}", highlight=False, markup=False)
            raise typer.Exit(EXIT_USAGE) from None
        yield fan(terminal, JsonLinesView(stream)), console
    finally:
        terminal.close()
        if stream is not None and stream is not sys.stdout:
            stream.close()
