"""The verbs around a running deployment: logs, bench, watch, observability (Prometheus and
Grafana files for it), and the inventory's schema.
Registered on app.py's app when main.py imports this module (after the deploy verbs, the
order --help lists)."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from pdboot.cli.app import command, events_target, views
from pdboot.cli.console import load, refuse_example_addresses, stderr, stdout
from pdboot.cli.options import AcceptNewOpt, EventsOpt, InventoryArg, JsonEventsOpt
from pdboot.exitcodes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from pdboot.timestamps import parse_rfc3339

# Go's durations, as `docker compose logs --since` reads them (42m, 1h30m, 1.5h, 500ms), and days
_DURATION = re.compile(r"^(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
SINCE_FORMS = (
    "a duration back from now (30s, 10m, 1h30m, 2d), an RFC 3339 time "
    "(2026-12-04T10:00:00Z, 2026-12-04T11:00:00+01:00) or a Unix time (1764842400)"
)


def since_time(value: str, now: float) -> int:
    """`--since` as `docker compose logs` reads it: a duration back from now, an RFC 3339 time
    or Unix seconds; the Unix time the logs start at. ValueError naming the forms otherwise."""
    text = value.strip()
    if _DURATION.match(text):
        back = sum(float(n) * _UNIT_S[u] for n, u in _DURATION_PART.findall(text))
        return int(now - back)
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return int(float(text))
    if "T" in text.upper() and re.search(r"(Z|[+-]\d\d:\d\d)$", text.upper()):
        stamp = parse_rfc3339(text.upper())
        if stamp is not None:
            return int(stamp.timestamp())
    if re.fullmatch(r"\d{4}-\d\d-\d\d([T ][\d:.]+)?", text):
        raise ValueError(f"a time needs its zone (Z or +01:00); it takes {SINCE_FORMS}")
    raise ValueError(f"not a time: it takes {SINCE_FORMS}")


def tail_lines(value: str) -> int | None:
    """`--tail` as compose reads it: a number of lines, or all (None)."""
    if value.strip().lower() == "all":
        return None
    if not value.strip().isdigit():
        raise ValueError("a number of lines, or all")
    return int(value)


@command
def logs(
    inventory: InventoryArg = None,
    service: Annotated[
        str | None,
        typer.Argument(
            help="Role, or role@host: decode, prefill@gpu-a, router (default: every service).",
            metavar="SERVICE",
            show_default=False,
        ),
    ] = None,
    tail: Annotated[
        str,
        typer.Option(
            "--tail", "-n", help="Lines from the end of each service's log, or all.", metavar="N"
        ),
    ] = "100",
    since: Annotated[
        str | None,
        typer.Option(
            help="Only lines since then: 10m, 1h30m, 2d, 2026-12-04T10:00:00Z or Unix seconds.",
            metavar="WHEN",
        ),
    ] = None,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Keep printing new lines of every service shown."),
    ] = False,
    timestamps: Annotated[
        bool,
        typer.Option("--timestamps", "-t", help="Docker's RFC 3339 time before each line."),
    ] = False,
    diagnose: Annotated[
        bool,
        typer.Option("--diagnose", help="Then print known causes and fixes in them."),
    ] = False,
    accept_new_host_keys: AcceptNewOpt = False,
) -> None:
    """Show a service's logs, or without SERVICE every service's, each line after its
    name."""
    from rich.text import Text

    from pdboot.deploy import logs as logs_mod
    from pdboot.views.terminal import TerminalView

    if service is None and inventory is not None and not inventory.exists():
        # `pdboot logs decode` with the inventory from $PDBOOT_INVENTORY or ./inventory.yaml
        inventory, service = None, str(inventory)
    try:
        start = None if since is None else since_time(since, time.time())
    except ValueError as e:
        stderr().print(f"--since {since!r}: {e}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(EXIT_USAGE) from None
    try:
        lines = tail_lines(tail)
    except ValueError as e:
        stderr().print(f"--tail {tail!r}: {e}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(EXIT_USAGE) from None
    inv = load(inventory)
    refuse_example_addresses(inv)

    def on_line(line: str) -> None:
        stdout().print(Text.from_ansi(line), highlight=False, soft_wrap=True)

    opts = logs_mod.LogOptions(lines, follow, diagnose, start, accept_new_host_keys, timestamps)
    raise typer.Exit(logs_mod.logs(inv, service, on_line, TerminalView(stdout()), opts))


@command
def bench(
    tokenizer: Annotated[
        str,
        typer.Option(
            help="Local tokenizer directory (or a name in the local HF cache) for AIPerf.",
            metavar="DIR",
        ),
    ],
    inventory: InventoryArg = None,
    concurrency: Annotated[
        str, typer.Option(help="Comma-separated levels.", metavar="LIST")
    ] = "1,4,16",
    isl: Annotated[int, typer.Option(help="Prompt tokens per request.", metavar="N")] = 512,
    osl: Annotated[int, typer.Option(help="Output tokens per request.", metavar="N")] = 128,
    requests: Annotated[
        int, typer.Option(help="Requests per level (0: AIPerf's).", metavar="N")
    ] = 0,
    ttft_ms: Annotated[
        float, typer.Option(help="Goodput's time-to-first-token target.", metavar="MS")
    ] = 2000.0,
    itl_ms: Annotated[
        float, typer.Option(help="Goodput's inter-token-latency target.", metavar="MS")
    ] = 50.0,
    baseline_url: Annotated[
        str | None,
        typer.Option(
            help="Engine serving alone, or comma-separated independent engines whose "
            "figures add up (default: the first decode engine).",
            metavar="URL[,URL...]",
        ),
    ] = None,
    out_dir: Annotated[
        Path,
        typer.Option("--out", "--out-dir", help="Where results go.", metavar="DIR"),
    ] = Path("pdboot-bench"),
) -> None:
    """P/D through the router vs the same GPUs as independent engines, measured by AIPerf.

    Goodput: requests/s that met both --ttft-ms and --itl-ms. Per GPU: P/D over every
    engine's GPUs, one engine alone over its own (what the same GPUs give as independent
    engines). Writes results.json and chart.svg; the verdict is the chart's title."""
    from rich.table import Table
    from rich.text import Text

    from pdboot.bench import results as bench_results
    from pdboot.bench import run as bench_mod
    from pdboot.plan.build import build_plan

    cmd = bench_mod.aiperf_command()
    if cmd is None:
        hint = f"pip install 'aiperf=={bench_mod.AIPERF_VERSION}' (or set PDBOOT_AIPERF)"
        stderr().print(Text(f"AIPerf is not installed: {hint}"))
        raise typer.Exit(EXIT_USAGE)
    try:
        levels = [int(x) for x in concurrency.split(",") if x.strip()]
    except ValueError:
        stderr().print(f"--concurrency: not a list of integers: {concurrency}")
        raise typer.Exit(EXIT_USAGE) from None
    plan = build_plan(load(inventory))
    from pdboot.bench.goodput import Targets

    shape = bench_mod.LoadShape(
        isl=isl, osl=osl, requests_per_level=requests, targets=Targets(ttft_ms, itl_ms)
    )
    rep = bench_mod.bench(plan, tokenizer, levels, out_dir, shape, cmd, baseline_url=baseline_url)
    table = Table(*bench_results.TABLE_HEADER)
    for row in bench_results.table_rows(rep.cells):
        table.add_row(*row)
    stdout().print(table)
    stdout().print(Text(rep.verdict.line, style="bold"))
    stdout().print(f"raw results: {rep.results}\nchart: {rep.chart}")
    for c in rep.refused:
        stderr().print(
            Text(
                f"refused {c.role} at concurrency {c.concurrency}: {c.refused} ({c.artifacts})",
                style="red",
            )
        )
    raise typer.Exit(EXIT_FAILED if rep.refused else EXIT_OK)


@command
def watch(
    inventory: InventoryArg = None,
    listen: Annotated[
        str, typer.Option(help="ADDR[:PORT] for /metrics, /verdicts.", metavar="ADDR[:PORT]")
    ] = "127.0.0.1",
    no_restart: Annotated[bool, typer.Option("--no-restart", help="Alert, never restart.")] = False,
    events: EventsOpt = None,
    as_json: JsonEventsOpt = False,
    accept_new_host_keys: AcceptNewOpt = False,
) -> None:
    """Keep proving each P->D pair (Ctrl-C stops); a failing engine leaves the router till
    good."""
    from pdboot.deploy.watch.service import WatchOptions, run_watch
    from pdboot.views.watch import WatchView

    target = events_target(events, as_json, "watch")
    inv = load(inventory)
    refuse_example_addresses(inv)
    with views(target) as (emit, console):
        opts = WatchOptions.parse(listen, restarts=not no_restart, accept_new=accept_new_host_keys)
        raise typer.Exit(run_watch(inv, opts, WatchView(console, then=emit)))


@command
def observability(
    inventory: InventoryArg = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Write DIR/prometheus.yml, the alert rules beside it and DIR/grafana/.",
            metavar="DIR",
            show_default=False,
        ),
    ] = None,
) -> None:
    """The Prometheus scrape config for this deployment (every engine, the router's metrics,
    the watch service), with --out also pdboot's alert rules and Grafana dashboard."""
    from importlib import resources

    from pdboot.plan.build import build_plan
    from pdboot.plan.prometheus import RULES_FILE, scrape_config_text

    text = scrape_config_text(build_plan(load(inventory)))
    if out_dir is None:
        sys.stdout.write(text)
        return
    shipped = resources.files("pdboot") / "observability"
    files = {
        out_dir / "prometheus.yml": text,
        out_dir / RULES_FILE: (shipped / "prometheus" / RULES_FILE).read_text(encoding="utf-8"),
        out_dir / "grafana" / "pdboot-watch.json": (
            shipped / "grafana" / "pdboot-watch.json"
        ).read_text(encoding="utf-8"),
    }
    try:
        for path, body in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body, encoding="utf-8")
    except OSError as e:
        stderr().print(f"cannot write {e.filename}: {e.strerror}", highlight=False, markup=False)
        raise typer.Exit(EXIT_FAILED) from None
    for path in files:
        stdout().print(f"wrote {path}", highlight=False, markup=False)


@command
def schema() -> None:
    """Print the inventory's JSON Schema (for editors: completion and checks as you type).
    Save it and name it on the inventory's first line, as examples/ do:
    `# yaml-language-server: $schema=inventory.schema.json`."""
    from pdboot.inventory.jsonschema import schema_text

    sys.stdout.write(schema_text())
    stderr().print(SCHEMA_HINT, highlight=False, markup=False, soft_wrap=True)


# how an editor finds it: the YAML language server (VS Code's YAML extension, Neovim's yamlls,
# Helix, Zed) reads this modeline; examples/inventory.schema.json is the saved copy
SCHEMA_HINT = (
    "save it (pdboot schema > inventory.schema.json) and put this line first in the "
    "inventory: # yaml-language-server: $schema=inventory.schema.json "
    "(or point it at examples/inventory.schema.json in pdboot's repository)"
)
