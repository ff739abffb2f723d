"""The terminal view: what an operator sees during `up`, `down` and `status`.

On a terminal: pull progress bars that give way to one line per image, a live table while
waiting (each service's state and its latest log line). In a log (not a terminal): only
the finished lines, and a plain "waiting ..." line per service every 5 s.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.filesize import decimal
from rich.live import Live
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TransferSpeedColumn,
)
from rich.prompt import Confirm
from rich.table import Column, Table
from rich.text import Text

from pdboot import events as ev
from pdboot.ansi import strip_ansi
from pdboot.views.status import print_status

PLAIN_WAIT_EVERY = 5.0
ACTION_STYLE = {"unchanged": "dim", "create": "green", "recreate": "yellow", "remove": ""}
LEVEL_STYLE = {"info": "", "warn": "yellow", "error": "red"}


# the pull's progress display stays up through these (weights stage during the pull)
PULL_STAGE_EVENTS = (ev.PullProgress, ev.PullDone, ev.WeightsProgress, ev.WeightsDone)
WEIGHTS_TASK = "\0weights"  # a task key no image reference can be


class TerminalView:
    def __init__(self, console: Console) -> None:
        self.out = console
        self._lock = threading.RLock()  # hosts emit from their own threads
        self._progress: Progress | None = None
        self._tasks: dict[tuple[str, str], TaskID] = {}
        self._live: Live | None = None
        self._last_plain = 0.0
        self._preflight_seen: list[ev.PreflightHost | ev.PreflightCheck] = []
        self._handlers: dict[type[ev.Event], Callable[[Any], None]] = {
            ev.StageStarted: self._stage,
            ev.PreflightHost: self._preflight_seen.append,
            ev.PreflightCheck: self._preflight_seen.append,
            ev.PreflightDone: self._preflight,
            ev.PullProgress: self._pull_progress,
            ev.PullDone: self._pull_done,
            ev.WeightsPinned: self._weights_pinned,
            ev.WeightsProgress: self._weights_progress,
            ev.WeightsDone: self._weights_done,
            ev.ServiceAction: self._action,
            ev.WaitTick: self._tick,
            ev.ServiceReady: self._ready,
            ev.TierReady: self._tier_ready,
            ev.Failure: self._failure,
            ev.HostErrors: self._host_errors,
            ev.KVVerdict: self._kv,
            ev.GateVerdict: self._gate,
            ev.KVSpeed: self._speed,
            ev.Diagnosis: self._diagnosis,
            ev.Rollback: lambda e: self._print(
                "rolling back (--rollback): removing this deployment's containers"
            ),
            ev.Stopped: lambda e: self._print(f"stopped {e.role}: " + ", ".join(e.services)),
            ev.Endpoint: self._endpoint,
            ev.Interrupted: self._interrupted,
            ev.Note: lambda e: self._print(Text(e.message, style=LEVEL_STYLE[e.level])),
            ev.ImageCheck: self._image_check,
            ev.RollPlanned: self._roll_step,
            ev.RollProgress: lambda e: self._print(f"  step {e.number}: {e.phase} {e.detail}"),
            ev.RollStopped: self._roll_stopped,
            ev.StatusReport: lambda e: print_status(self.out, e),
            ev.Done: self._done,
        }

    def __call__(self, event: ev.Event) -> None:
        with self._lock:
            if not isinstance(event, PULL_STAGE_EVENTS):
                self._stop_progress()
            if not isinstance(event, (ev.WaitTick, ev.ServiceReady)):
                self._stop_live()
            handler = self._handlers.get(type(event))
            if handler is not None:
                handler(event)

    def close(self) -> None:
        with self._lock:
            self._stop_progress()
            self._stop_live()

    def _print(self, what: str | Text) -> None:
        self.out.print(what, soft_wrap=True, highlight=False)

    # ---- stages

    def _stage(self, e: ev.StageStarted) -> None:
        if e.stage == "pull":
            self._start_progress(e.services)
        elif e.stage == "wait":
            self._last_plain = 0.0
            self._live = Live(console=self.out, transient=True, auto_refresh=False)
            self._live.start()

    def _preflight(self, e: ev.PreflightDone) -> None:
        if self._preflight_seen:  # a line per host, then every failure and warning with its fix
            from pdboot.views.preflight import from_events, print_compact

            print_compact(from_events(self._preflight_seen), self.out)
            self._preflight_seen = []
        if e.skipped:
            self._print("preflight skipped (--skip-preflight)")
        elif not e.ok:
            self._print(Text("preflight failed: nothing was pulled or started", style="red"))

    def _image_check(self, e: ev.ImageCheck) -> None:
        style = {"pass": "", "warn": "yellow", "fail": "red", "skip": "dim"}[e.status]
        self._print(Text(f"{e.host}: {e.check} {e.status}: {e.message}", style=style))
        if e.fix and e.status != "pass":
            self._print(f"  fix: {e.fix}")

    # ---- pull

    def _start_progress(self, items: tuple[str, ...]) -> None:
        self._progress = Progress(
            TextColumn("{task.description}", table_column=Column(overflow="fold")),
            BarColumn(bar_width=10),
            # never folded ("20.0/20… MB" was): the description gives way first
            DownloadColumn(table_column=Column(no_wrap=True)),
            TransferSpeedColumn(table_column=Column(no_wrap=True)),
            TextColumn("{task.fields[note]}", table_column=Column(no_wrap=True)),
            console=self.out,
            transient=False,
            disable=not self.out.is_terminal,  # a log gets only the finished lines
        )
        self._tasks = {}
        for item in items:
            host, _, img = item.partition(": ")
            # the bar shows the image's last path component (room for the numbers at 80
            # columns); the finished line names it in full
            short = img.rsplit("/", 1)[-1]
            self._tasks[(host, img)] = self._progress.add_task(
                f"{host}: {short}", total=None, note="checking"
            )
        self._progress.start()

    def _stop_progress(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def _pull_progress(self, e: ev.PullProgress) -> None:
        task = self._tasks.get((e.host, e.image))
        if self._progress is not None and task is not None:
            self._progress.update(task, completed=e.done, total=e.total or None, note=e.status)

    def _pull_done(self, e: ev.PullDone) -> None:
        task = self._tasks.get((e.host, e.image))
        if self._progress is not None and task is not None:
            # a finished bar gives way to one plain line naming the image in full,
            # the same on a terminal and in a log
            self._progress.update(task, visible=False)
        if e.pulled:
            line = f"{e.host}: {e.image} pulled ({decimal(e.bytes)} in {e.seconds:.1f}s)"
            if e.digest:
                line = line[:-1] + f", {e.digest[:19]})"
        else:
            line = f"{e.host}: {e.image} already present ({(e.digest or '')[:19]})"
        console = self._progress.console if self._progress is not None else self.out
        console.print(line, soft_wrap=True, highlight=False)

    # ---- weights (staged while the images pull: their bars share the pull's display)

    def _weights_pinned(self, e: ev.WeightsPinned) -> None:
        asked = "" if e.revision == e.commit else f" ({e.revision})"
        self._print(f"weights: {e.model} at commit {e.commit}{asked}, {decimal(e.bytes)}")

    def _weights_progress(self, e: ev.WeightsProgress) -> None:
        if self._progress is None:
            return
        key = (e.host, WEIGHTS_TASK)
        if key not in self._tasks:
            self._tasks[key] = self._progress.add_task(f"{e.host}: weights", total=None, note="")
        self._progress.update(self._tasks[key], completed=e.done, total=e.total or None)

    def _weights_done(self, e: ev.WeightsDone) -> None:
        task = self._tasks.get((e.host, WEIGHTS_TASK))
        if self._progress is not None and task is not None:
            self._progress.update(task, visible=False)
        how = "already in the HF cache" if e.cached else f"fetched in {e.seconds:.1f}s"
        line = f"{e.host}: weights {e.commit[:12]} {how} ({decimal(e.bytes)})"
        console = self._progress.console if self._progress is not None else self.out
        console.print(line, soft_wrap=True, highlight=False)

    # ---- converge and wait

    def _action(self, e: ev.ServiceAction) -> None:
        self._print(
            Text.assemble(
                (f"{e.service:<28}", "bold"), (f"{e.action:<10}", ACTION_STYLE[e.action]), e.reason
            )
        )

    def _roll_step(self, e: ev.RollPlanned) -> None:
        up = "endpoint up" if e.endpoint_up else "ENDPOINT DOWN"
        head = Text.assemble(
            (f"step {e.number} ", "bold"),
            (f"{e.action:<9}", "cyan"),
            ", ".join(e.services),
            f"  ({e.how})",
        )
        self._print(head)
        self._print(f"    {e.reason}; serving: {', '.join(e.capacity)}; {up}")
        if e.outage:
            self._print(Text(f"    outage: {e.outage}", style=LEVEL_STYLE["warn"]))

    def _roll_stopped(self, e: ev.RollStopped) -> None:
        self._print(Text(f"roll stopped at step {e.number}; engines now:", style="bold red"))
        for key, config in e.engines:
            self._print(f"  {key:<28} {config}")

    def _stop_live(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _console(self) -> Console:
        return self._live.console if self._live is not None else self.out

    def _ready(self, e: ev.ServiceReady) -> None:
        self._console().print(f"[green]ready[/green] {e.service} after {e.seconds:.1f}s")

    def _tick(self, e: ev.WaitTick) -> None:
        if self.out.is_terminal:
            if self._live is not None:
                self._live.update(tick_table(e), refresh=True)
        elif e.elapsed - self._last_plain >= PLAIN_WAIT_EVERY:
            # a log, not a terminal: one line per waiting service every 5 s
            self._last_plain = e.elapsed
            for s in e.services:
                if s.state != "ready" and e.elapsed > 0:
                    line = s.phase or strip_ansi(s.log_line)[:120]
                    self._console().print(
                        Text(f"waiting {s.service} {e.elapsed:.0f}s: {s.detail} | {line}")
                    )

    def _tier_ready(self, e: ev.TierReady) -> None:
        names = "+".join(e.tiers)
        tier = f"{names} tier" if len(e.tiers) == 1 else f"{names} tiers"
        self._print(f"{tier} ready ({e.condition}) after {e.seconds:.1f}s")

    def _failure(self, e: ev.Failure) -> None:
        self._print(Text(f"error: {e.message}", style="red"))
        if e.first_error:
            self._print(Text(f"first error in the log of {e.service}:", style="bold"))
            for line in e.first_error:
                self._print(Text(f"  {line}", style="bold red"))
        n = len(e.log_lines)
        self._print(Text(f"--- last {n} log lines of {e.service} ---", style="bold"))
        for line in e.log_lines:
            self._print(Text.from_ansi(line))
        self._print(Text("---", style="bold"))
        for line in e.diagnosis:
            self._print(Text(line, style="bold red"))

    def _host_errors(self, e: ev.HostErrors) -> None:
        for host, msg in e.errors:
            self._print(Text(f"error: {e.what} {host}: {msg}", style="red"))

    # ---- proof, endpoint, end

    def _diagnosis(self, e: ev.Diagnosis) -> None:
        for line in e.lines:
            self._print(Text(line, style="bold red"))

    def _kv(self, e: ev.KVVerdict) -> None:
        self._print(Text.assemble(("test completion: ", "bold"), repr(e.completion[:80])))
        if not e.ok:
            cause = f" ({e.cause})" if e.cause else ""
            self._print(Text(f"error: {e.message}{cause}", style="red"))
        else:
            self._print(Text(e.message, style="green" if e.confirmed else "yellow"))

    def _gate(self, e: ev.GateVerdict) -> None:
        style = {"ok": "green", "warn": "yellow", "fail": "red"}[e.level]
        prefix = {"ok": "", "warn": "warning: ", "fail": "error: "}[e.level]
        first, *rest = e.message.splitlines()
        self._print(Text(prefix + first, style=style))
        for line in rest:
            self._print(Text(line, style=style if line.startswith("  ") else ""))

    def _speed(self, e: ev.KVSpeed) -> None:
        for p in e.pairs:
            self._print(Text.assemble(("KV speed: ", "bold"), p.line))
            if p.advice:
                self._print(Text(f"warning: {p.advice}", style="yellow"))

    def _endpoint(self, e: ev.Endpoint) -> None:
        self._print(Text.assemble(("endpoint: ", "bold"), e.url))
        self._print(Text.assemble(("model:    ", "bold"), e.model))
        self._print(Text(e.curl))

    def _interrupted(self, e: ev.Interrupted) -> None:
        if not e.started:
            self._print(Text("interrupted before anything was started", style="yellow"))
            return
        self._print(Text("interrupted: stopped waiting", style="yellow"))
        if e.running:
            self._print("running now:")
            for key, state in e.running:
                self._print(f"  {key:<28} {state}")
        else:
            self._print("nothing of this deployment is running")
        self._print("`pdboot up` continues from here; `pdboot down` removes it")

    def _done(self, e: ev.Done) -> None:
        if e.exit_code != 0 or not e.summary:
            return
        if e.command == "up":
            self.out.print(f"[green]up[/green]: {e.summary}")
        elif e.command == "down" and e.summary.startswith("removed"):
            self.out.print(f"[green]down[/green]: {e.summary}")
        else:
            self._print(e.summary)


def tick_table(e: ev.WaitTick) -> Table:
    table = Table(box=None, show_header=False, pad_edge=False)
    for s in e.services:
        mark = "[green]ready[/green]" if s.state == "ready" else f"[yellow]{s.state}[/yellow]"
        table.add_row(s.service, mark, f"{e.elapsed:5.1f}s", Text(s.detail), progress_cell(s))
    return table


def progress_cell(s: ev.ServiceWait) -> Text:
    """The engine's start-up phase with a bar where vLLM counts (shard k of n); else its
    latest log line, cut at the end (the start of a line says what it is about)."""
    if s.state == "ready":
        return Text("")
    if s.phase:
        bar = ""
        if s.done is not None and s.total:
            filled = round(10 * min(s.done, s.total) / s.total)
            bar = "[" + "#" * filled + "." * (10 - filled) + "] "
        return Text(bar + s.phase, style="cyan", no_wrap=True, overflow="ellipsis")
    return Text(strip_ansi(s.log_line), style="dim", no_wrap=True, overflow="ellipsis")


def confirm_outage(outages: list[str]) -> bool:
    """`up`'s question before a tier that cannot roll goes down (the outages were printed
    above it); asked only on a terminal: without one the outage needs --yes."""
    return sys.stdin.isatty() and Confirm.ask("This change takes a tier down. Go on?")
