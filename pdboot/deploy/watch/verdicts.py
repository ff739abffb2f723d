"""`status` asks `pdboot watch` for its last verdicts: one request through the caller's HttpFn;
an unreachable watch is a verdict set with an error, never an exception."""

from __future__ import annotations

from pdboot.plan.watch.verdicts import WatchVerdicts, parse_verdicts
from pdboot.transport.http import HttpFn


def read_verdicts(fetch: HttpFn, base_url: str) -> WatchVerdicts:
    url = f"{base_url.rstrip('/')}/verdicts"
    a = fetch(url, timeout=5.0)
    if not a.ok:
        return WatchVerdicts(url, error=f"watch not answering: {a.describe()}")
    return parse_verdicts(url, a.body)
