"""HTTP requests to engines, the router and registries, with ONE way of turning a failed
request into the short reason an operator reads ("connection refused", "timed out", ...)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HttpAnswer:
    status: int  # 0: no HTTP answer at all (refused, reset, timeout)
    body: str
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200

    def describe(self) -> str:
        return self.error if self.status == 0 else f"HTTP {self.status}"


# what the orchestrator calls; a unit test hands in a fake with this signature
HttpFn = Callable[..., HttpAnswer]


def http(
    url: str,
    *,
    timeout: float = 2.0,
    body: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> HttpAnswer:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")  # noqa: S310
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - http(s) we built
            return HttpAnswer(r.status, r.read().decode(errors="replace"))
    except urllib.error.HTTPError as e:
        return HttpAnswer(e.code, e.read().decode(errors="replace") if e.fp else "")
    except (OSError, ValueError) as e:
        return HttpAnswer(0, "", reason(e))


def reason(e: BaseException) -> str:
    """A failed request's cause in a few words (urllib wraps the socket error in .reason)."""
    if isinstance(e, urllib.error.URLError) and not isinstance(e, urllib.error.HTTPError):
        cause: object = e.reason
    else:
        cause = e
    text = str(cause)
    if "Connection refused" in text:
        return "connection refused"
    if "timed out" in text:
        return "timed out"
    return text or type(cause).__name__
