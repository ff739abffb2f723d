"""HTTP requests to engines, the router and registries: the one module that talks HTTP, with
ONE way of turning a failed request into the short reason an operator reads ("connection
refused", "timed out", ...).

``request`` is the exchange at the byte level (status, headers, a size cap, a bearer token
kept off redirects) that the registry client needs; ``http`` is the text form every other
caller uses, and the signature of the ``HttpFn`` unit tests hand in.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.client import HTTPException
from typing import Any, Literal


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

# Why no HTTP answer came: "connect" the server could not be reached (refused, DNS, TLS
# handshake: worth another scheme), "io" the exchange broke after that or was malformed.
NoAnswer = Literal["", "connect", "io"]


@dataclass(frozen=True)
class RawAnswer:
    status: int  # 0: no HTTP answer (see no_answer); >= 400: the server's error answer
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)  # names in lower case
    error: str = ""  # the reason, when status is 0
    no_answer: NoAnswer = ""


_tls: ssl.SSLContext | None = None
_tls_lock = threading.Lock()


def tls_context() -> ssl.SSLContext:
    """One verifying context per process, built on first use: urllib builds one per https
    connection otherwise, and each loads the system's CA bundle again (tens of ms of CPU
    per request; preflight's registry lookups make several while the hosts connect)."""
    global _tls
    with _tls_lock:
        if _tls is None:
            _tls = ssl.create_default_context(capath=ca_dir())
        return _tls


_HASHED = re.compile(r"[0-9a-f]{8}\.\d+")


def ca_dir(
    paths: ssl.DefaultVerifyPaths | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The system's hashed CA directory (Debian's /etc/ssl/certs, which update-ca-certificates
    fills with the bundle's CAs): OpenSSL then reads only the CA a server's chain names, at
    the handshake, where the default context parses the whole bundle (~140 certificates,
    ~25 ms of CPU on every run that asks a registry). None, for the default bundle: an
    operator's SSL_CERT_FILE, or a directory without hashed names (RHEL's)."""
    p = paths or ssl.get_default_verify_paths()
    env = os.environ if environ is None else environ
    if env.get(p.openssl_cafile_env) or not p.capath:
        return None
    try:
        names = os.listdir(p.capath)
    except OSError:
        return None
    return p.capath if any(_HASHED.fullmatch(n) for n in names) else None


def request(
    url: str,
    *,
    timeout: float,
    body: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
    bearer: str | None = None,
    max_bytes: int | None = None,
    method: str | None = None,
) -> RawAnswer:
    """One exchange; never raises for a network or HTTP failure. ``bearer`` is sent only to
    ``url`` itself, not to where it redirects (a registry's blob redirects to a CDN URL that
    rejects a second auth). ``max_bytes``: read at most one byte more than that. ``method``:
    GET, or POST with a body, unless given (the router's DELETE /workers/<url>)."""
    data = json.dumps(body).encode() if body is not None else None
    verb = method or ("POST" if data is not None else "GET")
    req = urllib.request.Request(url, data=data, method=verb)  # noqa: S310
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    if bearer:
        req.add_unredirected_header("Authorization", f"Bearer {bearer}")
    limit = -1 if max_bytes is None else max_bytes + 1
    try:
        ctx = tls_context() if url.startswith("https:") else None
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:  # noqa: S310
            return RawAnswer(r.status, r.read(limit), _lower(r.headers.items()))
    except urllib.error.HTTPError as e:
        text = e.read(limit) if e.fp else b""
        return RawAnswer(e.code, text, _lower(e.headers.items() if e.headers else ()))
    except (urllib.error.URLError, ssl.SSLError, ConnectionError) as e:
        return RawAnswer(0, error=reason(e), no_answer="connect")
    except (OSError, ValueError, HTTPException) as e:
        return RawAnswer(0, error=reason(e), no_answer="io")


def _lower(items: Any) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in items}


def http(
    url: str,
    *,
    timeout: float = 2.0,
    body: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
    method: str | None = None,
    bearer: str | None = None,
) -> HttpAnswer:
    """GET, or POST when there is a body; ``method`` says otherwise (the router's DELETE).
    ``bearer``: sent to ``url`` only, never along a redirect (see ``request``)."""
    a = request(url, timeout=timeout, body=body, headers=headers, method=method, bearer=bearer)
    if a.status == 0:
        return HttpAnswer(0, "", a.error)
    return HttpAnswer(a.status, a.body.decode(errors="replace"))


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
