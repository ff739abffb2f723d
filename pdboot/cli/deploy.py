"""The deploy verbs (render, preflight, stage, up, down, status): arguments in, calls into the
core, a view out. No logic here. What every command shares (the app, the inventory default,
the views) is in app.py and console.py; the verbs around a running deployment (logs, bench,
watch, schema) in operations.py; main.py puts them all on one app.

Exit codes (pdboot/exitcodes.py): 0 success, 1 a check or deployment step failed, 2 bad usage
or inventory, 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pdboot.cli.app import command, events_target, views
from pdboot.cli.console import (
    errors_as_json,
    load,
    refuse,
    refuse_example_addresses,
    stderr,
    stdout,
    warn_example_addresses,
)
from pdboot.cli.options import (
    DETAILED_HELP,
    NO_ROLL,
    PLAN_HELP,
    YES_HELP,
    AcceptNewOpt,
    EventsOpt,
    InventoryArg,
    JsonEventsOpt,
    NoWaitOpt,
    RefreshOpt,
)
from pdboot.diagnostics import Diagnostic
from pdboot.exitcodes import EXIT_FAILED, EXIT_USAGE

if TYPE_CHECKING:
    from pdboot.events import Event
    from pdboot.inventory.schema import Inventory
    from pdboot.plan.model import Plan


@command
def render(
    inventory: InventoryArg = None,
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
    as_json: Annotated[
        bool,
        typer.Option("--json", help="One JSON object: each host's compose text and services."),
    ] = False,
    clean: Annotated[
        bool,
        typer.Option(
            "--clean",
            help="With --out: remove the projects of hosts the deployment no longer has "
            "(without it, render refuses such a folder).",
        ),
    ] = False,
) -> None:
    """Show the compose projects `up` would ship to each host (a dry run; no secrets)."""
    from pdboot.plan.build import build_plan
    from pdboot.plan.render import render_all, render_summary
    from pdboot.views.render import print_projects, projects_json

    if as_json:
        errors_as_json("document", "render")
    inv = load(inventory)
    warn_example_addresses(inv)
    plan = build_plan(inv)
    texts = render_all(plan)
    summary = render_summary(plan, inv.weights, inv.model_revision)
    hosts = set(texts)  # every host that runs something, before --host picks one
    if host is not None:
        if host not in texts:
            why = (
                f"host {host!r} runs nothing in this deployment; hosts that do: {', '.join(texts)}"
            )
            stderr().print(why, highlight=False, markup=False, soft_wrap=True)
            refuse([Diagnostic("error", why)])
        texts = {host: texts[host]}
    if as_json:
        sys.stdout.write(projects_json(plan, texts, summary) + "\n")
        return
    if out_dir is None:
        print_projects(stdout(), stderr(), texts, summary)
        return
    _write_out(inv, plan, out_dir, texts, hosts, summary, clean=clean)


def _write_out(
    inv: Inventory,
    plan: Plan,
    out_dir: Path,
    texts: dict[str, str],
    hosts: set[str],
    summary: str,
    *,
    clean: bool,
) -> None:
    """`render --out DIR`: refuse (or with --clean empty) the folders of hosts the deployment
    no longer has, then write every project."""
    from pdboot.inventory.ingress_rules import ingress_hosts
    from pdboot.plan.model import KEEPALIVED_CONF_FILE, PROXY_CONF_FILE
    from pdboot.plan.proxy import proxy_conf_text
    from pdboot.views.render import print_written
    from pdboot.views.render_out import remove_stale, stale_host_dirs, write_projects

    stale = stale_host_dirs(out_dir, hosts)
    if stale and not clean:
        names = ", ".join(p.name for p in stale)
        stderr().print(
            f"{out_dir} holds projects of hosts this deployment no longer has ({names}): "
            "--clean removes them, or choose another folder",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_USAGE)
    # beside each ingress host's compose.yaml: the proxy's nginx.conf (never the key) and
    # keepalived.conf where a virtual IP moves
    beside: dict[str, dict[str, str]] = {
        h: {PROXY_CONF_FILE: proxy_conf_text(inv)} for h in ingress_hosts(inv)
    }
    for h, conf in plan.keepalived_confs.items():
        beside.setdefault(h, {})[KEEPALIVED_CONF_FILE] = conf
    try:
        kept = remove_stale(stale)
        written = write_projects(out_dir, texts, beside, summary)
    except OSError as e:
        stderr().print(f"cannot write {e.filename}: {e.strerror}", highlight=False, markup=False)
        raise typer.Exit(EXIT_FAILED) from None
    for path in kept:
        stderr().print(
            f"kept {path}: pdboot did not write it", highlight=False, markup=False, soft_wrap=True
        )
    print_written(stdout(), [p for p in stale if p not in kept], written, summary)


@command
def preflight(
    inventory: InventoryArg = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of tables.")
    ] = False,
    only: Annotated[
        list[str] | None,
        typer.Option(
            "--only",
            help="Run only these checks: an id (gpu.driver) or an area (gpu).",
            metavar="CHECK",
        ),
    ] = None,
    skip: Annotated[
        list[str] | None,
        typer.Option(
            "--skip", help="Skip these checks: an id or an area. Repeatable.", metavar="CHECK"
        ),
    ] = None,
    accept_new_host_keys: AcceptNewOpt = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "-v", "--verbose", help="Show every check (default: failures, warnings, a count)."
        ),
    ] = False,
) -> None:
    """Check every host before anything is pulled."""
    from pdboot.cli.preflight import preflight as check

    if json_out:
        errors_as_json("document", "preflight")
    code = check(
        inventory,
        json_out=json_out,
        only=only or [],
        skip=skip or [],
        accept_new_host_keys=accept_new_host_keys,
        verbose=verbose,
    )
    raise typer.Exit(code)


@command
def stage(
    inventory: InventoryArg = None,
    refresh: RefreshOpt = False,
    accept_new_host_keys: AcceptNewOpt = False,
    no_wait: NoWaitOpt = False,
    events: EventsOpt = None,
    as_json: JsonEventsOpt = False,
) -> None:
    """Fetch the model's pinned commit into each engine host's HF cache; start nothing."""
    from pdboot.deploy.stage import stage as stage_weights

    target = events_target(events, as_json, "stage")
    inv = load(inventory)
    refuse_example_addresses(inv)
    with views(target) as (emit, _):
        code = stage_weights(
            inv, emit, refresh=refresh, accept_new_host_keys=accept_new_host_keys, no_wait=no_wait
        )
        raise typer.Exit(code)


@command
def up(
    inventory: InventoryArg = None,
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
    as_json: JsonEventsOpt = False,
    no_speed: Annotated[
        bool,
        typer.Option(
            "--no-speed",
            metavar="",
            help="Skip the long request per prefill->decode pair that measures KV speed.",
        ),
    ] = False,
    plan_only: Annotated[bool, typer.Option("--plan", metavar="", help=PLAN_HELP)] = False,
    detailed_exitcode: Annotated[
        bool, typer.Option("--detailed-exitcode", metavar="", help=DETAILED_HELP)
    ] = False,
    no_rolling: Annotated[bool, typer.Option("--no-rolling", metavar="", help=NO_ROLL)] = False,
    yes: Annotated[bool, typer.Option("--yes", metavar="", help=YES_HELP)] = False,
    refresh_weights: RefreshOpt = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", "--check", hidden=True, help="Not here: --plan.")
    ] = False,
) -> None:
    """Pull, start decode and prefill, then the router; prove a request flows and the
    answers are right (correctness gate); measure the KV path; print the endpoint. On a
    running deployment, changes roll through the running router one engine at a time."""
    from pdboot.deploy import up as up_mod
    from pdboot.deploy.up_options import UpOptions
    from pdboot.views.terminal import confirm_outage

    target = events_target(events, as_json, "up")
    if dry_run:  # the other tools' words for it (kubectl, ansible): say which flag it is here
        _refuse_usage(
            "up has no --dry-run or --check: `pdboot up --plan` shows the steps and changes "
            "nothing (`pdboot render` shows the compose files)"
        )
    if detailed_exitcode and not plan_only:
        _refuse_usage("--detailed-exitcode goes with --plan")
    inv = load(inventory)
    opts = UpOptions(
        skip_preflight=skip_preflight,
        speed=not no_speed,
        rollback=rollback,
        accept_new_host_keys=accept_new_host_keys,
        no_wait=no_wait,
        rolling=not no_rolling,
        plan_only=plan_only,
        detailed_exitcode=detailed_exitcode,
        yes=yes,
        refresh_weights=refresh_weights,
    )
    refuse_example_addresses(inv)
    with views(target) as (emit, _):
        from pdboot.deploy.preflight_gate import preflight_gate

        gate = preflight_gate(emit)
        code = up_mod.up(inv, opts, emit, preflight=gate, confirm=confirm_outage)
    raise typer.Exit(code)


def _refuse_usage(why: str) -> None:
    """Exit 2 with ``why`` on stderr (and, under --json, as JSON on stdout)."""
    stderr().print(why, highlight=False, markup=False, soft_wrap=True)
    refuse([Diagnostic("error", why)])


@command
def down(
    inventory: InventoryArg = None,
    purge: Annotated[
        bool,
        typer.Option("--purge", help="Also remove the shipped files and the pulled images."),
    ] = False,
    accept_new_host_keys: AcceptNewOpt = False,
    no_wait: NoWaitOpt = False,
    events: EventsOpt = None,
    as_json: JsonEventsOpt = False,
) -> None:
    """Stop and remove everything pdboot started (router, prefill, decode)."""
    from pdboot.deploy import down as down_mod

    target = events_target(events, as_json, "down")
    inv = load(inventory)
    opts = down_mod.DownOptions(
        purge=purge, accept_new_host_keys=accept_new_host_keys, no_wait=no_wait
    )
    refuse_example_addresses(inv)
    with views(target) as (emit, _):
        code = down_mod.down(inv, opts, emit)
    raise typer.Exit(code)


@command
def status(
    inventory: InventoryArg = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
    watch: Annotated[
        float | None,
        typer.Option(
            "--watch",
            help="Refresh every SECONDS until Ctrl-C; P/D metrics show what happened in "
            "between (with --json: one object per line); at least 1.",
            min=1,
            metavar="SECONDS",
        ),
    ] = None,
    accept_new_host_keys: AcceptNewOpt = False,
) -> None:
    """Show each service's state, health and whether it matches the inventory, and per
    engine its P/D metrics (KV transfers, failures, TTFT/ITL), the spread and flags."""
    from pdboot.deploy import status as status_mod
    from pdboot.events import StatusReport
    from pdboot.views.status import status_json
    from pdboot.views.terminal import TerminalView

    if as_json:
        errors_as_json("document", "status")
    inv = load(inventory)
    refuse_example_addresses(inv)
    view = TerminalView(stdout())

    def emit(event: Event) -> None:
        if not as_json:
            view(event)
        elif isinstance(event, StatusReport):
            doc = status_json(event)
            sys.stdout.write((json.dumps(json.loads(doc)) if watch else doc) + "\n")
            sys.stdout.flush()

    code = status_mod.status(inv, emit, watch=watch, accept_new_host_keys=accept_new_host_keys)
    raise typer.Exit(code)
