"""The `status` table: one line per service when that fits the width, else two."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pdboot.diagnostics import FORMAT_VERSION
from pdboot.events import ServiceStatus, StatusReport
from pdboot.plan.degraded import describe, engine_url
from pdboot.plan.watch.verdicts import WatchVerdicts
from pdboot.verify.pdstatus import PDStatus


def human_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def short_image(ref: str) -> str:
    """`10.77.2.1:5000/vllm/vllm-openai:v0.33.0` -> `vllm-openai:v0.33.0` (the full
    reference is in --json); a digest is cut to 12 hex digits."""
    name = ref.rsplit("/", 1)[-1]
    m = re.match(r"^(.*sha256:)([0-9a-f]{12})[0-9a-f]*$", name)
    return m.group(1) + m.group(2) if m else name


def short_endpoint(url: str) -> str:
    """`http://10.77.2.10:8201` -> `10.77.2.10:8201`."""
    return engine_url(url).split("://", 1)[-1]


def print_status(out: Console, report: StatusReport) -> None:
    rows = list(report.services)
    pd: PDStatus | None = report.pd
    if pd is not None and pd.window_seconds is not None and out.is_terminal:
        out.clear()  # --watch: each report replaces the last
    out.print(status_table(rows, report.deployment, out.width))
    for line in reason_lines(rows):
        out.print(Text(line, style="red"), highlight=False, soft_wrap=True)
    for line in nic_lines(rows) + core_lines(rows) + rank_lines(rows):
        out.print(line, highlight=False, markup=False)
    if report.revision:
        out.print(
            f"weights: {report.deployment} engines load commit {report.revision}",
            highlight=False,
            markup=False,
        )
    w = report.workers
    for url in w.foreign if w is not None else ():
        out.print(Text(f"router: foreign worker {url} (pdboot did not register it)", "red"))
    for url in w.missing if w is not None else ():
        out.print(Text(f"router: engine {url} is missing from its workers", "red"))
    if w is not None and w.plain:
        plain = ", ".join(w.plain)
        out.print(Text(f"router: degraded, serving plain (no P/D) from {plain}", "bold yellow"))
    out.print("healthy" if report.healthy else "[red]not healthy[/red]")
    if pd is not None and pd.engines:
        print_pd(out, pd)
    if report.watch is not None:
        print_watch(out, report.watch)


def reason_lines(rows: list[ServiceStatus]) -> list[str]:
    """Why each unreachable host's state is unknown, once per host."""
    seen: dict[str, str] = {}
    for r in rows:
        if r.state == "unreachable" and r.host not in seen:
            seen[r.host] = r.reason or "no cause recorded"
    return [f"{host} unreachable: {why}" for host, why in seen.items()]


def print_watch(out: Console, w: WatchVerdicts) -> None:
    """watch's last verdict per pair (and what it holds out of the router)."""
    if w.error:
        out.print(Text(f"watch: {w.error} ({w.url})", style="yellow"), highlight=False)
        return
    if w.serving != "pd":
        out.print(
            Text(
                f"watch: serving {describe(w.serving)} for {w.serving_seconds:.0f} s",
                style="bold yellow",
            ),
            highlight=False,
        )
    out.print(f"watch: last verdict per pair (after {w.rounds} rounds)", highlight=False)
    for p in w.pairs:
        mark = Text("ok  ", style="green") if p.ok else Text("FAIL", style="bold red")
        line = Text("  ").append(mark).append(f" {p.prefill} -> {p.decode}  {p.seconds:.2f} s")
        if not p.ok:
            line.append(f"  {p.reason}", style="red")
        out.print(line, highlight=False, soft_wrap=True)
    if w.out_of_rotation:
        out.print(
            Text(f"  out of the router: {', '.join(w.out_of_rotation)}", style="yellow"),
            highlight=False,
        )


def _ms(q: dict[str, float | None] | None) -> str:
    """p50/p90/p99 in milliseconds, "-" where nothing was observed."""
    if not q:
        return "-"
    return "/".join("-" if v is None else f"{v * 1000:.0f}" for v in q.values())


def _n(x: float) -> str:
    return f"{x:.0f}"


def pd_table(pd: PDStatus) -> Table:
    """One line per engine; fits 80 columns for names up to ~20 characters."""
    what = "totals since start" if pd.window_seconds is None else f"last {pd.window_seconds:.0f}s"
    table = Table(
        title=f"P/D metrics, {what} (TTFT, ITL: p50/p90/p99 ms)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1, 0, 0),
        pad_edge=False,
        show_edge=False,
    )
    for col in ("engine", "reqs", "xfers", "KV MB", "fail", "exp", "TTFT", "ITL"):
        table.add_column(
            col, no_wrap=True, overflow="fold", justify="left" if col == "engine" else "right"
        )
    for e in pd.engines:
        if not e.scraped:
            table.add_row(Text(e.service, style="bold"), Text(e.error, style="red"))
            continue
        failed = Text(_n(e.failed_transfers), style="red" if e.failed_transfers else "")
        table.add_row(
            Text(e.service, style="bold"),
            _n(e.requests),
            _n(e.kv_transfers),
            f"{e.kv_megabytes:.0f}",
            failed,
            _n(e.expired_leases),
            _ms(e.ttft),
            _ms(e.itl),
        )
    return table


def print_pd(out: Console, pd: PDStatus) -> None:
    out.print(pd_table(pd))
    for sp in pd.spread:
        if sp.requests:
            parts = ", ".join(f"{k} {v:.0f}" for k, v in sp.requests.items())
            out.print(f"{sp.tier} spread: {parts}")
    for f in pd.flags:
        style = "red" if f.level == "fail" else "yellow"
        out.print(Text(f"{'error' if f.level == 'fail' else 'warning'}: {f.message}", style=style))


def nic_lines(rows: list[ServiceStatus]) -> list[str]:
    """Each engine's UCX_NET_DEVICES with its distance (when RDMA picked one)."""
    nics = [r for r in rows if r.nic]
    if not nics:
        return []
    width = max(len(r.service) for r in nics)
    return ["UCX_NET_DEVICES per engine:"] + [f"  {r.service:<{width}}  {r.nic}" for r in nics]


def core_lines(rows: list[ServiceStatus]) -> list[str]:
    """device: cpu: the cores each engine's threads are bound to."""
    cpu = [r for r in rows if r.cores]
    if not cpu:
        return []
    width = max(len(r.service) for r in cpu)
    return ["CPU cores per engine:"] + [f"  {r.service:<{width}}  {r.cores}" for r in cpu]


def rank_lines(rows: list[ServiceStatus]) -> list[str]:
    """Each data-parallel engine's ranks: the plan's, and what the head's /metrics shows."""
    dp = [r for r in rows if r.ranks]
    if not dp:
        return []
    width = max(len(r.service) for r in dp)
    return ["Data-parallel ranks:"] + [f"  {r.service:<{width}}  {r.ranks}" for r in dp]


def status_json(report: StatusReport) -> str:
    """`status --json`: one document (its keys are a stable interface)."""
    doc: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "deployment": report.deployment,
        "endpoint": report.endpoint,
        "healthy": report.healthy,
        "services": [asdict(r) for r in report.services],
        "pd": report.pd.as_json() if report.pd is not None else None,
        "watch": asdict(report.watch) if report.watch is not None else None,
        "router_workers": asdict(report.workers) if report.workers is not None else None,
    }
    return json.dumps(doc, indent=2)


def _cells(r: ServiceStatus) -> dict[str, Text]:
    state_style = "green" if r.state == "running" else "red"
    if not r.planned:
        match = Text("not in inventory", style="yellow")
    else:
        match = {
            True: Text("yes"),
            False: Text("changed", style="yellow"),
            None: Text("-"),
        }[r.matches_inventory]
    return {
        "service": Text(r.service, style="bold"),
        "state": Text(r.state, style=state_style),
        "health": Text(r.health, style="green" if r.health == "ok" else "red"),
        "uptime": Text(human_seconds(r.uptime_seconds)),
        "image": Text(short_image(r.image)),
        "matches": match,
        "endpoint": Text(short_endpoint(r.endpoint)),
    }


def status_table(rows: list[ServiceStatus], deployment: str, width: int) -> Table:
    """One line per service when that fits the width; otherwise two lines per service
    (uptime under the state, whether the config matches under the image). Addresses,
    tags and service names are never broken; only health details and the like wrap."""
    cells = [_cells(r) for r in rows]
    wide = _table(
        deployment, ["service", "state", "health", "uptime", "image", "matches", "endpoint"], cells
    )
    if Console(width=10_000).measure(wide).maximum <= width:
        return wide
    narrow = []
    for c in cells:
        matches = {"yes": Text("config matches", style="dim"), "-": Text("")}.get(
            c["matches"].plain,
            Text.assemble("config ", c["matches"])
            if c["matches"].plain == "changed"
            else c["matches"],
        )
        narrow.append(
            {
                "service": c["service"],
                "state": Text("\n").join([c["state"], Text(c["uptime"].plain, style="dim")]),
                "health": c["health"],
                "image / config": Text("\n").join([c["image"], matches]),
                "endpoint": c["endpoint"],
            }
        )
    return _table(deployment, ["service", "state", "health", "image / config", "endpoint"], narrow)


def _table(deployment: str, columns: list[str], rows: list[dict[str, Text]]) -> Table:
    table = Table(
        title=f"deployment {deployment}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1, 0, 0),  # with the box's blank separator: two spaces between columns
        pad_edge=False,
        show_edge=False,
    )
    for col in columns:
        # only health details may wrap (between words, in the two-line form); the rest
        # are tokens an operator copies (names, tags, addresses): never broken
        words = col == "health" and "uptime" not in columns
        table.add_column(col, no_wrap=not words, overflow="fold", min_width=10 if words else None)
    for r in rows:
        table.add_row(*(r[c] for c in columns))
    return table
