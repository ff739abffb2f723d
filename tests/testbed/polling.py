"""Polling a testbed deployment until something has happened, for the e2e tests."""

from __future__ import annotations

import time
import urllib.request
from typing import Any


def wait_for(what: str, cond: Any, diag: Any, seconds: float = 90.0) -> Any:
    """``cond()``'s first true answer (an OSError counts as none yet), polled every 0.2 s;
    after ``seconds`` the test fails with ``what`` and ``diag()``. The bound is for "it
    happened": nothing asserts on durations."""
    end = time.monotonic() + seconds
    while True:
        try:
            got = cond()
        except OSError:
            got = None
        if got:
            return got
        assert time.monotonic() < end, f"{what}: {diag()}"
        time.sleep(0.2)


def wait_http_ok(url: str, seconds: float, *, every: float = 1.0, timeout: float = 5.0) -> None:
    """Until ``url`` answers 200 (a refusal or another status: not yet), polled every
    ``every`` seconds; after ``seconds`` the test fails naming the URL."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} not 200 after {seconds:.0f}s")
        time.sleep(every)
