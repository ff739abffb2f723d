"""The command line: arguments in, calls into the core, rich output out. No logic here.

Exit codes: 0 success, 1 a check or deployment step failed, 2 bad usage or inventory.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.rule import Rule
from rich.syntax import Syntax
from rich.text import Text

from pdboot import __version__
from pdboot.inventory import Inventory, InventoryError, load_inventory
from pdboot.plan import build_plan
from pdboot.render import render_all, render_summary

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

app = typer.Typer(
    name="pdboot",
    help="Stand up a disaggregated prefill/decode vLLM deployment over SSH and Docker.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)

InventoryArg = Annotated[
    Path, typer.Argument(help="The inventory YAML file.", metavar="INVENTORY", show_default=False)
]


def _load(path: Path) -> Inventory:
    """The validated inventory, or every problem printed as ``file:line: key: message``
    and exit 2."""
    try:
        return load_inventory(path)
    except InventoryError as e:
        for issue in e.issues:
            # Text, not markup: messages quote user input and key paths like [0].
            err.print(Text(str(issue), style="red"), highlight=False, soft_wrap=True)
        n = len(e.issues)
        err.print(f"{n} problem{'s' if n != 1 else ''} in the inventory; nothing was done.")
        raise typer.Exit(EXIT_USAGE) from None


def _not_yet(command: str) -> NoReturn:
    err.print(f"pdboot {command} is not implemented yet.")
    raise typer.Exit(EXIT_USAGE)


def _version(value: bool) -> None:
    if value:
        out.print(f"pdboot {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    """pdboot: preflight, render, up, status, logs, down."""


@app.command()
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
    inv = _load(inventory)
    plan = build_plan(inv)
    texts = render_all(plan, inv)
    if host is not None:
        if host not in texts:
            err.print(
                f"host {host!r} runs nothing in this deployment; hosts that do: "
                f"{', '.join(texts)}",
                highlight=False,
                markup=False,
            )
            raise typer.Exit(EXIT_USAGE)
        texts = {host: texts[host]}
    if out_dir is None:
        _print_projects(texts)
        return
    summary = render_summary(plan, inv)
    try:
        for name, text in texts.items():
            target = out_dir / name / "compose.yaml"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        (out_dir / "summary.txt").write_text(summary, encoding="utf-8")
    except OSError as e:
        err.print(f"cannot write {e.filename}: {e.strerror}", highlight=False, markup=False)
        raise typer.Exit(EXIT_FAILED) from None
    for name in texts:
        out.print(f"wrote {out_dir / name / 'compose.yaml'}", highlight=False, markup=False)
    out.print(summary, end="", highlight=False, markup=False, soft_wrap=True)


def _print_projects(texts: dict[str, str]) -> None:
    if not out.is_terminal:
        # Piped: plain text, one YAML document per host.
        sys.stdout.write("---\n".join(texts.values()))
        return
    for name, text in texts.items():
        out.print(Rule(f"{name}/compose.yaml"))
        out.print(Syntax(text, "yaml", background_color="default"))


AcceptNewOpt = Annotated[
    bool,
    typer.Option(
        "--accept-new-host-keys",
        help="Record unknown SSH host keys (like OpenSSH accept-new); changed keys still fail.",
    ),
]
NoWaitOpt = Annotated[
    bool,
    typer.Option(
        "--no-wait",
        help="If another run holds this deployment's lock, exit 1 at once instead of waiting.",
    ),
]


@app.command()
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
    from pdboot import preflight as pf
    from pdboot import report
    from pdboot.checks import AREAS

    inv = _load(inventory)
    sel = pf.Selection.of(
        [x for v in only or [] for x in v.split(",") if x],
        [x for v in skip or [] for x in v.split(",") if x],
    )
    if sel.unknown():
        err.print(
            f"unknown check or area: {', '.join(sel.unknown())} (areas: {', '.join(AREAS)})"
        )
        raise typer.Exit(EXIT_USAGE)
    result = pf.run_preflight(inv, accept_new_host_keys=accept_new_host_keys, selection=sel)
    if json_out:
        sys.stdout.write(report.to_json(result) + "\n")
    else:
        report.print_report(result, out)
    raise typer.Exit(EXIT_OK if result.ok else EXIT_FAILED)


@app.command()
def up(
    inventory: InventoryArg,
    skip_preflight: Annotated[
        bool, typer.Option("--skip-preflight", help="Do not run the preflight checks first.")
    ] = False,
    rollback: Annotated[
        bool,
        typer.Option("--rollback", help="On failure remove what was started (default: keep it)."),
    ] = False,
    accept_new_host_keys: AcceptNewOpt = False,
    no_wait: NoWaitOpt = False,
) -> None:
    """Pull, start decode, prefill, router; prove a request flows; print the endpoint."""
    from pdboot import deploy

    inv = _load(inventory)
    opts = deploy.UpOptions(
        skip_preflight=skip_preflight,
        rollback=rollback,
        accept_new_host_keys=accept_new_host_keys,
        no_wait=no_wait,
    )
    raise typer.Exit(deploy.up(inv, opts, out, preflight=deploy.default_preflight()))


@app.command()
def down(
    inventory: InventoryArg,
    purge: Annotated[
        bool,
        typer.Option("--purge", help="Also remove the shipped files and the pulled images."),
    ] = False,
    accept_new_host_keys: AcceptNewOpt = False,
    no_wait: NoWaitOpt = False,
) -> None:
    """Stop and remove everything pdboot started (router, prefill, decode)."""
    from pdboot import deploy

    inv = _load(inventory)
    opts = deploy.DownOptions(
        purge=purge, accept_new_host_keys=accept_new_host_keys, no_wait=no_wait
    )
    raise typer.Exit(deploy.down(inv, opts, out))


@app.command()
def status(
    inventory: InventoryArg,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """Show each service's state, health and whether it matches the inventory."""
    from pdboot import status as status_mod

    inv = _load(inventory)
    raise typer.Exit(status_mod.status(inv, out, as_json=as_json))


@app.command()
def logs(
    inventory: InventoryArg,
    service: Annotated[
        str, typer.Argument(help="Role, or role@host: decode, prefill@gpu-a, router.")
    ],
    tail: Annotated[int, typer.Option("--tail", "-n", help="Lines from the end.")] = 100,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing.")] = False,
) -> None:
    """Show one service's logs."""
    from pdboot import status as status_mod

    inv = _load(inventory)
    raise typer.Exit(status_mod.logs(inv, service, out, tail=tail, follow=follow))


def main() -> None:
    app()
