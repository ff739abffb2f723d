"""What every pdboot command shares: the typer app and its conventions (`-h`, `-V`, help
without type names, the exit codes) and the event views. The consoles and the inventory a
command reads are in console.py (no typer); the commands themselves in deploy.py (deploy
verbs), operations.py (the verbs around a running deployment) and export.py."""

from __future__ import annotations

import copy
import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from pdboot import __version__
from pdboot.cli import console as cli_console
from pdboot.cli.console import errors_as_json, stderr, stdout
from pdboot.exitcodes import EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:  # each command imports what it uses: `pdboot --version` loads none of it
    from rich.console import Console

    from pdboot.events import Emit

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
        params = super().get_params(ctx)
        # `-V`/`--version` on every command too (`pdboot up -V`): a copy of the root's own
        # option that hands the command no value (its function has no such parameter)
        root = ctx.find_root().command
        found = [p for p in root.params if p.name == "version"] if root is not self else []
        if found and not any(p.name == "version" for p in params):
            version = copy.copy(found[0])
            version.expose_value = False
            params = [*params[:-1], version, params[-1]]  # before --help, the last
        return _plain_help(params)


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


def command(fn: Callable[..., None]) -> Callable[..., None]:
    """``app.command()``, with the docstring's hard line breaks joined (--help rewraps each
    paragraph to the terminal instead of breaking summaries mid-sentence) and the exit codes
    under every command's help."""
    doc = inspect.getdoc(fn) or ""
    paragraphs = [" ".join(p.split()) for p in doc.split("\n\n")]
    return app.command(help="\n\n".join(paragraphs), epilog=EXIT_CODES, cls=Command)(fn)


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
    cli_console.json_errors = None  # each command says whether it answers in JSON
    cli_console.loaded_from = None


def events_target(events: str | None, as_json: bool, command: str) -> str | None:
    """`--json` on a verb that emits events is `--events -`."""
    if as_json and events not in (None, "-"):
        stderr().print("--json and --events FILE: choose one", highlight=False, markup=False)
        raise typer.Exit(EXIT_USAGE)
    target = "-" if as_json else events
    if target == "-":  # a refusal before the first event is the stream's `done` line
        errors_as_json("stream", command)
    return target


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
