"""The machine view: one JSON object per event and line, with ``event`` (its kind) and
``ts`` (UTC, ISO 8601), for an operator's CI or a dashboard (`pdboot up --events FILE`)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import IO, Any

from pdboot.events import Event, PullProgress

PROGRESS_EVERY_SECONDS = 1.0  # a pull streams many progress events; keep one a second


def to_json(event: Event, now: datetime | None = None) -> str:
    t = now or datetime.now(timezone.utc)
    doc: dict[str, Any] = {"event": event.kind, "ts": t.isoformat(timespec="milliseconds")}
    doc.update(dataclasses.asdict(event))
    return json.dumps(doc, default=str)


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
