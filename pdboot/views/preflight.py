"""Preflight results -> a rich table per host (areas with failures first, the fix under
each failure or warning) and a one-line verdict; or the JSON of design.md."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from pdboot.preflight.checks import AREAS, STATUS_ORDER, CheckResult
from pdboot.preflight.run import HostReport, PreflightResult

if TYPE_CHECKING:  # rich loads with the tables: `preflight --json` prints without it
    from rich.console import Console
    from rich.table import Table

    from pdboot.events import PreflightCheck, PreflightHost


TROUBLESHOOTING = "docs/troubleshooting.md"  # a section per check id (its anchor)
STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
MARK = {"pass": "ok", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


def ordered(checks: list[CheckResult]) -> list[CheckResult]:
    """Grouped by area; areas whose worst result is worst come first; inside an area,
    failures first, then warnings, passes, skips (stable otherwise)."""
    worst: dict[str, int] = {}
    for c in checks:
        worst[c.area] = min(worst.get(c.area, 9), STATUS_ORDER[c.status])

    def key(ic: tuple[int, CheckResult]) -> tuple[int, int, int, int, int]:
        i, c = ic
        area_pos = AREAS.index(c.area) if c.area in AREAS else len(AREAS)
        first = 0 if c.area == "ssh" else 1  # how we reached the host, then what we found
        return (first, worst[c.area], area_pos, STATUS_ORDER[c.status], i)

    return [c for _, c in sorted(enumerate(checks), key=key)]


def host_table(h: HostReport) -> Table:
    from rich.table import Table
    from rich.text import Text

    state = "reachable" if h.reachable else "[bold red]UNREACHABLE[/]"
    t = Table(
        title=f"[bold]{h.name}[/] ({state}{f', {h.seconds:.1f}s' if h.seconds else ''})",
        title_justify="left",
        show_lines=False,
        expand=False,
    )
    t.add_column("", no_wrap=True)
    t.add_column("check", no_wrap=True)
    t.add_column("result", overflow="fold")
    last_area = None
    for c in ordered(h.checks):
        if last_area is not None and c.area != last_area:
            t.add_section()
        last_area = c.area
        t.add_row(Text(MARK[c.status], style=STYLE[c.status]), c.id, Text(c.message))
        if c.fix and c.status in ("fail", "warn"):
            t.add_row("", "", Text(f"fix: {c.fix}", style="cyan"))
    return t


def counts(result: PreflightResult) -> dict[str, int]:
    n = {"pass": 0, "warn": 0, "fail": 0, "skip": 0}
    for h in result.hosts.values():
        for c in h.checks:
            n[c.status] += 1
    return n


def verdict(result: PreflightResult) -> str:
    n = counts(result)
    bad = [name for name, h in result.hosts.items() if not h.ok]
    down = [name for name, h in result.hosts.items() if not h.reachable]
    if result.ok:
        warn = f" ({n['warn']} warning{'s' if n['warn'] != 1 else ''})" if n["warn"] else ""
        return f"PASS: {len(result.hosts)} host(s) ready for `pdboot up`{warn}"
    fails = f"{n['fail']} failure{'s' if n['fail'] != 1 else ''} on {', '.join(bad)}"
    # each unreachable host's own cause is in its ssh.connect line of the report above
    unreach = f" (unreachable: {', '.join(down)})" if down else ""
    return f"FAIL: {fails}{unreach}; fix them before `pdboot up`"


def print_report(result: PreflightResult, console: Console, verbose: bool = False) -> None:
    """Every check per host with ``verbose``; else a host's failures and warnings (each
    with its fix and what it made preflight skip) and one "N passed" line."""
    from rich.text import Text

    for h in result.hosts.values():
        if verbose:
            console.print(host_table(h))
        else:
            print_host_short(h, console)
        console.print()
    style = "bold green" if result.ok else "bold red"
    console.print(Text(verdict(result), style=style))


def passed_line(h: HostReport) -> str:
    """``25 passed, 2 skipped (-v shows every check)``."""
    n = {"pass": 0, "warn": 0, "fail": 0, "skip": 0}
    for c in h.checks:
        n[c.status] += 1
    skipped = f", {n['skip']} skipped" if n["skip"] else ""
    return f"{n['pass']} passed{skipped} (-v shows every check)"


def print_host_short(h: HostReport, console: Console) -> None:
    from rich.table import Table
    from rich.text import Text

    from pdboot.preflight.cascade import skipped_because

    state = "reachable" if h.reachable else "[bold red]UNREACHABLE[/]"
    took = f", {h.seconds:.1f}s" if h.seconds else ""
    console.print(f"[bold]{h.name}[/] ({state}{took})")
    rows = [c for c in ordered(h.checks) if c.status in ("fail", "warn")]
    if rows:
        t = Table.grid(padding=(0, 1))
        t.add_column(no_wrap=True)  # indent
        t.add_column(no_wrap=True)
        t.add_column(no_wrap=True)
        t.add_column(overflow="fold")
        for c in rows:
            t.add_row("", Text(MARK[c.status], style=STYLE[c.status]), c.id, Text(c.message))
            if c.fix:
                t.add_row("", "", "", Text(f"fix: {c.fix}", style="cyan"))
            after = skipped_because(h.checks, c.id)
            if after:
                t.add_row("", "", "", Text(f"so not judged: {', '.join(after)}", style="dim"))
        console.print(t)
    console.print(Text(f"  {passed_line(h)}", style="green"), highlight=False)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def host_summary(h: HostReport) -> str:
    """`decode: 25 passed, 1 warning, 1 skipped (1.0s)`: one line per host for `up`."""
    n = {"pass": 0, "warn": 0, "fail": 0, "skip": 0}
    for c in h.checks:
        n[c.status] += 1
    parts = [f"{n['pass']} passed"]
    if n["fail"]:
        parts.append(_plural(n["fail"], "failure"))
    if n["warn"]:
        parts.append(_plural(n["warn"], "warning"))
    if n["skip"]:
        parts.append(f"{n['skip']} skipped")
    state = "" if h.reachable else "UNREACHABLE, "
    took = f" ({h.seconds:.1f}s)" if h.seconds else ""
    return f"{h.name}: {state}{', '.join(parts)}{took}"


def print_compact(result: PreflightResult, console: Console) -> None:
    """What `up` shows: a line per host, then only the failures and warnings with their
    fixes (the full tables are `pdboot preflight`'s)."""
    from rich.table import Table
    from rich.text import Text

    for h in result.hosts.values():
        style = "" if h.ok else "bold red"
        console.print(Text(host_summary(h), style=style), highlight=False)
        rows = [c for c in ordered(h.checks) if c.status in ("fail", "warn")]
        if not rows:
            continue
        t = Table.grid(padding=(0, 1))
        t.add_column(no_wrap=True)  # indent
        t.add_column(no_wrap=True)
        t.add_column(no_wrap=True)
        t.add_column(overflow="fold")
        for c in rows:
            t.add_row("", Text(MARK[c.status], style=STYLE[c.status]), c.id, Text(c.message))
            if c.fix:
                t.add_row("", "", "", Text(f"fix: {c.fix}", style="cyan"))
            if c.status == "fail":
                t.add_row("", "", "", Text(f"see {TROUBLESHOOTING}#{c.id}", style="dim"))
        console.print(t)
    style = "bold green" if result.ok else "bold red"
    console.print(Text(verdict(result), style=style))
    if not result.ok:
        console.print("`pdboot preflight INVENTORY` shows every check", highlight=False)


def to_json(result: PreflightResult, now: datetime | None = None) -> str:
    """design.md's object (``ok``, ``hosts.<name>.reachable``, ``.checks``: kept as they
    are, other tools read them) plus pdboot's ``version``, an RFC 3339 UTC ``timestamp``,
    the ``counts`` per status and each host's typed ``facts``."""
    from pdboot import __version__
    from pdboot.diagnostics import FORMAT_VERSION
    from pdboot.preflight.facts_json import facts_json

    base = result.as_json()
    hosts = base["hosts"]
    assert isinstance(hosts, dict)
    for name, h in result.hosts.items():
        hosts[name]["facts"] = facts_json(h.facts)
    at = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    out = {
        "format_version": FORMAT_VERSION,
        "version": __version__,
        "timestamp": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "counts": counts(result),
        **base,
    }
    return json.dumps(out, indent=2)


def from_events(events: list[PreflightHost | PreflightCheck]) -> PreflightResult:
    """`up`'s preflight events back into the report print_compact shows."""
    # here: `pdboot preflight` itself builds none of events.py's ~35 record classes
    from pdboot.events import PreflightHost

    hosts: dict[str, HostReport] = {}
    for e in events:
        if isinstance(e, PreflightHost):
            hosts[e.host] = HostReport(e.host, e.reachable, seconds=e.seconds)
        else:
            hosts[e.host].checks.append(CheckResult(e.id, e.status, e.message, e.fix))
    return PreflightResult(hosts)
