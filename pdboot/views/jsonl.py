"""The machine view: one JSON object per event and line, with ``format_version``, ``event``
(its kind) and ``ts`` (UTC, ISO 8601), for an operator's CI or a dashboard (`pdboot up
--events FILE`). An event that reports a failure or a warning (`host_errors`, `failure`, an
error or warning `note`) also carries ``diagnostics``, in the one shape of
pdboot/diagnostics.py, whichever command and step it comes from."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import IO, Any

from pdboot.diagnostics import Diagnostic, Severity, versioned
from pdboot.events import Done, Event, Failure, HostErrors, Note, PullProgress

PROGRESS_EVERY_SECONDS = 1.0  # a pull streams many progress events; keep one a second


def diagnostics_of(event: Event) -> list[Diagnostic]:
    """The failures and warnings an event reports, in the one shape."""
    if isinstance(event, HostErrors):
        return [Diagnostic("error", f"{event.what} {host}", why) for host, why in event.errors]
    if isinstance(event, Note) and event.level != "info":
        severity: Severity = "error" if event.level == "error" else "warning"
        summary = event.message.removeprefix(f"{event.level}: ").removeprefix("warning: ")
        return [Diagnostic(severity, summary)]
    if isinstance(event, Failure):
        detail = "\n".join(event.first_error or event.diagnosis or event.log_lines[-5:])
        return [Diagnostic("error", f"{event.service}: {event.message}", detail)]
    return []


def to_json(event: Event, now: datetime | None = None) -> str:
    t = now or datetime.now(timezone.utc)
    doc: dict[str, Any] = versioned(
        {"event": event.kind, "ts": t.isoformat(timespec="milliseconds")}
    )
    doc.update(dataclasses.asdict(event))
    found = diagnostics_of(event)
    if found:
        doc["diagnostics"] = [d.as_json() for d in found]
    return json.dumps(doc, default=str)


def refused_json(command: str, diagnostics: list[Diagnostic], exit_code: int) -> str:
    """An event stream's one line when the command stops before it starts (a bad inventory, an
    example's address): its `done` event, with the reasons as diagnostics."""
    n = len(diagnostics)
    summary = f"{n} problem{'s' if n != 1 else ''}; nothing was done"
    done = to_json(Done(command, exit_code, 0.0, summary))
    doc = json.loads(done)
    doc["diagnostics"] = [d.as_json() for d in diagnostics]
    return json.dumps(doc)


class JsonLinesView:
    def __init__(self, stream: IO[str], monotonic: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.monotonic = monotonic
        self._lock = threading.Lock()  # hosts emit from their own threads
        self._last_progress: dict[tuple[str, str], float] = {}

    def __call__(self, event: Event) -> None:
        with self._lock:
            if isinstance(event, PullProgress) and not self._due(event):
                return
            self.stream.write(to_json(event) + "\n")
            self.stream.flush()

    def _due(self, e: PullProgress) -> bool:
        now = self.monotonic()
        key = (e.host, e.image)
        if now - self._last_progress.get(key, -1e9) < PROGRESS_EVERY_SECONDS:
            return False
        self._last_progress[key] = now
        return True

    def close(self) -> None:
        with self._lock:
            self.stream.flush()
