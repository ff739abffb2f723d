"""The command line: arguments in, calls into the core, rich output out. No logic here.

Exit codes (pdboot/exitcodes.py): 0 success, 1 a check or deployment step failed, 2 bad usage
or inventory, 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption

from pdboot import __version__
from pdboot.cli_options import (
    NO_ROLL,
    PLAN_HELP,
    YES_HELP,
    AcceptNewOpt,
    EventsOpt,
    InventoryArg,
    NoWaitOpt,
    RefreshOpt,
)
from pdboot.exitcodes import EXIT_FAILED, EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:  # each command imports what it uses: `pdboot --version` loads none of it
    from rich.console import Console

    from pdboot.events import Emit, Event
    from pdboot.inventory.schema import Inventory


def _without_flag_types(params: list[Any]) -> list[Any]:
    """typer's help prints a value type after every option, ``<bool>`` for flags too, which
    take no value: flags get an empty metavar."""
    for p in params:
        if isinstance(p, TyperOption) and p.is_flag and p.metavar is None:
            p.metavar = ""
    return params


class _Command(TyperCommand):
    def get_params(self, ctx: Any) -> list[Any]:
        return _without_flag_types(super().get_params(ctx))


class _Group(TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        return _without_flag_types(super().get_params(ctx))


app = typer.Typer(
    cls=_Group,
    name="pdboot",
    help="Stand up a disaggregated prefill/decode vLLM deployment over SSH and Docker.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
out: Console | None = None  # rich consoles, made on first use (tests may set their own)
err: Console | None = None


def _stdout() -> Console:
    global out
    if out is None:
        from rich.console import Console

        out = Console()
    return out


def _stderr() -> Console:
    global err
    if err is None:
        from rich.console import Console

        err = Console(stderr=True)
    return err


def command(fn: Callable[..., None]) -> Callable[..., None]:
    """``app.command()``, with the docstring's hard line breaks joined: --help rewraps each
    paragraph to the terminal instead of breaking summaries mid-sentence."""
    doc = inspect.getdoc(fn) or ""
    paragraphs = [" ".join(p.split()) for p in doc.split("\n\n")]
    return app.command(help="\n\n".join(paragraphs), cls=_Command)(fn)


def _load(path: Path) -> Inventory:
    """The validated inventory, or every problem printed as ``file:line: key: message``
    and exit 2."""
    from rich.text import Text

    from pdboot.inventory.load import InventoryError, load_inventory

    try:
        return load_inventory(path)
    except InventoryError as e:
        for issue in e.issues:
            # Text, not markup: messages quote user input and key paths like [0].
            _stderr().print(Text(str(issue), style="red"), highlight=False, soft_wrap=True)
        n = len(e.issues)
        _stderr().print(f"{n} problem{'s' if n != 1 else ''} in the inventory; nothing was done.")
        raise typer.Exit(EXIT_USAGE) from None


def _version(value: bool) -> None:
    if value:
        typer.echo(f"pdboot {__version__}")  # plain: the one command that loads no rich
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    """pdboot: preflight, render, up, status, logs, down."""


@command
def render(
    inventory: InventoryArg,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Write DIR/<host>/compose.yaml for every host that runs something.",
            metavar="DIR",
            show_default=False,
        ),
    ] = None,
    host: Annotated[
        str | None,
        typer.Option("--host", help="Only this host's project.", metavar="NAME"),
    ] = None,
) -> None:
    """Show the compose projects `up` would ship to each host (a dry run; no secrets)."""
    from pdboot.plan.build import build_plan
    from pdboot.plan.model import PROXY_CONF_FILE
    from pdboot.plan.proxy import proxy_conf_text
    from pdboot.plan.render import render_all, render_summary
    from pdboot.views.render import print_projects, print_written

    inv = _load(inventory)
    plan = build_plan(inv)
    texts = render_all(plan)
    if host is not None:
        if host not in texts:
            _stderr().print(
                f"host {host!r} runs nothing in this deployment; hosts that do: {', '.join(texts)}",
                highlight=False,
                markup=False,
            )
            raise typer.Exit(EXIT_USAGE)
        texts = {host: texts[host]}
    if out_dir is None:
        print_projects(_stdout(), texts)
        return
    summary = render_summary(plan)
    try:
        for name, text in texts.items():
            target = out_dir / name / "compose.yaml"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            if name == inv.router.host:  # the proxy's nginx.conf beside it (never the key)
                conf = proxy_conf_text(inv)
                (target.parent / PROXY_CONF_FILE).write_text(conf, encoding="utf-8")
        (out_dir / "summary.txt").write_text(summary, encoding="utf-8")
    except OSError as e:
        _stderr().print(f"cannot write {e.filename}: {e.strerror}", highlight=False, markup=False)
        raise typer.Exit(EXIT_FAILED) from None
    print_written(_stdout(), [out_dir / name / "compose.yaml" for name in texts], summary)


@command
def preflight(
    inventory: InventoryArg,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of tables.")
    ] = False,
    only: Annotated[
        list[str] | None,
        typer.Option("--only", help="Run only these checks: an id (gpu.driver) or an area (gpu)."),
    ] = None,
    skip: Annotated[
        list[str] | None,
        typer.Option("--skip", help="Skip these checks: an id or an area. Repeatable."),
    ] = None,
    accept_new_host_keys: AcceptNewOpt = False,
) -> None:
    """Check every host before anything is pulled."""
    from pdboot.preflight import run as pf
    from pdboot.preflight.checks import AREAS
    from pdboot.views import preflight as report

    inv = _load(inventory)
    sel = pf.Selection.of(
        [x for v in only or [] for x in v.split(",") if x],
        [x for v in skip or [] for x in v.split(",") if x],
    )
    if sel.unknown():
        _stderr().print(
            f"unknown check or area: {', '.join(sel.unknown())} (areas: {', '.join(AREAS)})"
        )
        raise typer.Exit(EXIT_USAGE)
    result = pf.run_preflight(inv, accept_new_host_keys=accept_new_host_keys, selection=sel)
    if json_out:
        sys.stdout.write(report.to_json(result) + "\n")
    else:
        report.print_report(result, _stdout())
    raise typer.Exit(EXIT_OK if result.ok else EXIT_FAILED)


@contextmanager
def _views(events: str | None) -> Iterator[tuple[Emit, Console]]:
    """The terminal view (on stderr when the events go to stdout) plus, with --events,
    the JSON-lines view; yields (emit, the console the display uses)."""
    from pdboot.events import fan
    from pdboot.views.jsonl import JsonLinesView
    from pdboot.views.terminal import TerminalView

    console = _stderr() if events == "-" else _stdout()
    terminal = TerminalView(console)
    stream: IO[str] | None = None
    try:
        if events is None:
            yield terminal, console
            return
        try:
            stream = sys.stdout if events == "-" else open(events, "w", encoding="utf-8")  # noqa: SIM115
        except OSError as e:
            _stderr().print(f"cannot write {events}: {e.strerror}", highlight=False, markup=False)
            raise typer.Exit(EXIT_USAGE) from None
        yield fan(terminal, JsonLinesView(stream)), console
    finally:
        terminal.close()
        if stream is not None and stream is not sys.stdout:
            stream.close()


@command
def stage(
    inventory: InventoryArg,
    refresh: RefreshOpt = False,
    accept_new_host_keys: AcceptNewOpt = False,
    no_wait: NoWaitOpt = False,
    events: EventsOpt = None,
) -> None:
    """Fetch the model's pinned commit into each engine host's HF cache; start nothing."""
    from pdboot.weights.command import stage as stage_weights

    inv = _load(inventory)
    with _views(events) as (emit, _):
        code = stage_weights(
            inv, emit, refresh=refresh, accept_new_host_keys=accept_new_host_keys, no_wait=no_wait
        )
        raise typer.Exit(code)


@command
def up(
    inventory: InventoryArg,
    skip_preflight: Annotated[
        bool,
        typer.Option("--skip-preflight", help="Do not run the preflight checks first."),
    ] = False,
    rollback: Annotated[
        bool,
        typer.Option("--rollback", help="On failure remove what was started (no roll)."),
    ] = False,
    accept_new_host_keys: AcceptNewOpt = False,
    no_wait: NoWaitOpt = False,
    events: EventsOpt = None,
    no_speed: Annotated[
        bool,
        typer.Option(
            "--no-speed",
            metavar="",
            help="Skip the long request per prefill->decode pair that measures KV speed.",
        ),
    ] = False,
    plan_only: Annotated[bool, typer.Option("--plan", metavar="", help=PLAN_HELP)] = False,
    no_rolling: Annotated[bool, typer.Option("--no-rolling", metavar="", help=NO_ROLL)] = False,
    yes: Annotated[bool, typer.Option("--yes", metavar="", help=YES_HELP)] = False,
    refresh_weights: RefreshOpt = False,
) -> None:
    """Pull, start decode and prefill, then the router; prove a request flows and the
    answers are right (correctness gate); measure the KV path; print the endpoint. On a
    running deployment, changes roll through the running router one engine at a time."""
    from pdboot.deploy import up as up_mod
    from pdboot.deploy.up_steps import UpOptions
    from pdboot.views.terminal import confirm_outage

    inv = _load(inventory)
    opts = UpOptions(
        skip_preflight=skip_preflight,
        speed=not no_speed,
        rollback=rollback,
        accept_new_host_keys=accept_new_host_keys,
        no_wait=no_wait,
        rolling=not no_rolling,
        plan_only=plan_only,
        yes=yes,
        refresh_weights=refresh_weights,
    )
    with _views(events) as (emit, console):
        from pdboot.views.preflight import up_gate

        gate = up_gate(console)
        code = up_mod.up(inv, opts, emit, preflight=gate, confirm=confirm_outage)
    raise typer.Exit(code)


@command
def down(
    inventory: InventoryArg,
    purge: Annotated[
        bool,
        typer.Option("--purge", help="Also remove the shipped files and the pulled images."),
    ] = False,
    accept_new_host_keys: AcceptNewOpt = False,
    no_wait: NoWaitOpt = False,
    events: EventsOpt = None,
) -> None:
    """Stop and remove everything pdboot started (router, prefill, decode)."""
    from pdboot.deploy import down as down_mod

    inv = _load(inventory)
    opts = down_mod.DownOptions(
        purge=purge, accept_new_host_keys=accept_new_host_keys, no_wait=no_wait
    )
    with _views(events) as (emit, _):
        code = down_mod.down(inv, opts, emit)
    raise typer.Exit(code)


@command
def status(
    inventory: InventoryArg,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
    watch: Annotated[
        float | None,
        typer.Option(
            "--watch",
            help="Refresh every SECONDS until Ctrl-C; P/D metrics show what happened in "
            "between (with --json: one object per line).",
            min=1,
        ),
    ] = None,
) -> None:
    """Show each service's state, health and whether it matches the inventory, and per
    engine its P/D metrics (KV transfers, failures, TTFT/ITL), the spread and flags."""
    from pdboot.deploy import status as status_mod
    from pdboot.events import StatusReport
    from pdboot.views.status import status_json
    from pdboot.views.terminal import TerminalView

    inv = _load(inventory)
    view = TerminalView(_stdout())

    def emit(event: Event) -> None:
        if not as_json:
            view(event)
        elif isinstance(event, StatusReport):
            doc = status_json(event)
            sys.stdout.write((json.dumps(json.loads(doc)) if watch else doc) + "\n")
            sys.stdout.flush()

    raise typer.Exit(status_mod.status(inv, emit, watch=watch))


@command
def bench(
    inventory: InventoryArg,
    tokenizer: Annotated[
        str,
        typer.Option(
            help="Local tokenizer directory (or a name in the local HF cache) for AIPerf."
        ),
    ],
    concurrency: Annotated[str, typer.Option(help="Comma-separated levels.")] = "1,4,16",
    isl: Annotated[int, typer.Option(help="Prompt tokens per request.")] = 512,
    osl: Annotated[int, typer.Option(help="Output tokens per request.")] = 128,
    requests: Annotated[int, typer.Option(help="Requests per level (0: AIPerf's).")] = 0,
    baseline_url: Annotated[
        str | None, typer.Option(help="Engine serving alone (default: the first decode engine).")
    ] = None,
    out_dir: Annotated[Path, typer.Option(help="Where results go.")] = Path("pdboot-bench"),
) -> None:
    """P/D through the router vs one engine alone, measured by AIPerf (the bench extra)."""
    from rich.table import Table
    from rich.text import Text

    from pdboot.bench import results as bench_results
    from pdboot.bench import run as bench_mod
    from pdboot.plan.build import build_plan

    cmd = bench_mod.aiperf_command()
    if cmd is None:
        _stderr().print(Text("AIPerf is not installed: pip install 'pdboot[bench]'"))
        raise typer.Exit(EXIT_USAGE)
    try:
        levels = [int(x) for x in concurrency.split(",") if x.strip()]
    except ValueError:
        _stderr().print(f"--concurrency: not a list of integers: {concurrency}")
        raise typer.Exit(EXIT_USAGE) from None
    plan = build_plan(_load(inventory))
    shape = bench_mod.LoadShape(isl=isl, osl=osl, requests_per_level=requests)
    rep = bench_mod.bench(plan, tokenizer, levels, out_dir, shape, cmd, baseline_url=baseline_url)
    table = Table(*bench_results.TABLE_HEADER)
    for row in bench_results.table_rows(rep.cells):
        table.add_row(*row)
    _stdout().print(table)
    _stdout().print(f"raw results: {rep.results}\nchart: {rep.chart}")
    for c in rep.refused:
        _stderr().print(
            Text(
                f"refused {c.role} at concurrency {c.concurrency}: {c.refused} ({c.artifacts})",
                style="red",
            )
        )
    raise typer.Exit(EXIT_FAILED if rep.refused else EXIT_OK)


@command
def logs(
    inventory: InventoryArg,
    service: Annotated[
        str, typer.Argument(help="Role, or role@host: decode, prefill@gpu-a, router.")
    ],
    tail: Annotated[int, typer.Option("--tail", "-n", help="Lines from the end.")] = 100,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing.")] = False,
    diagnose: Annotated[
        bool,
        typer.Option("--diagnose", help="Then print known causes and fixes in them."),
    ] = False,
) -> None:
    """Show one service's logs."""
    from rich.text import Text

    from pdboot.deploy import status as status_mod
    from pdboot.views.terminal import TerminalView

    inv = _load(inventory)

    def on_line(line: str) -> None:
        _stdout().print(Text.from_ansi(line), highlight=False, soft_wrap=True)

    code = status_mod.logs(
        inv, service, on_line, TerminalView(_stdout()), tail=tail, follow=follow, diagnose=diagnose
    )
    raise typer.Exit(code)


@app.command()
def watch(
    inventory: InventoryArg,
    listen: Annotated[str, typer.Option(help="ADDR[:PORT] for /metrics, /verdicts.")] = "127.0.0.1",
    no_restart: Annotated[bool, typer.Option("--no-restart", help="Alert, never restart.")] = False,
    events: EventsOpt = None,
) -> None:
    """Keep proving each P->D pair (Ctrl-C stops); a failing engine leaves the router till good."""
    from pdboot.deploy.watch_service import WatchOptions, run_watch
    from pdboot.views.watch import WatchView

    with _views(events) as (emit, console):
        opts = WatchOptions.parse(listen, restarts=not no_restart)
        raise typer.Exit(run_watch(_load(inventory), opts, WatchView(console, then=emit)))


def main() -> None:
    app()
