"""Reading ``router.tls``'s certificate and key (references, like secrets) on the operator's
machine: `up` ships them to the router host (0600), preflight checks them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pdboot.inventory.localfiles import NotRegularFile, read_regular_file
from pdboot.inventory.schema import Inventory
from pdboot.transport.secret_refs import SecretError

PEM_LIMIT = 256 * 1024  # a chain of a few certificates


@dataclass(frozen=True)
class TlsPair:
    cert: str  # PEM text
    key: str


def read_pem(ref: str, what: str) -> str:
    """``env:NAME`` (the PEM text in the variable) or ``file:/path`` / a bare path."""
    if ref.startswith("env:"):
        value = os.environ.get(ref[4:], "")
        if not value.strip():
            raise SecretError(f"{what} is {ref} but that variable is not set (or empty)")
        return value.strip() + "\n"
    path = os.path.expanduser(ref[5:] if ref.startswith("file:") else ref)
    try:
        text = read_regular_file(Path(path), PEM_LIMIT).decode("ascii")
    except NotRegularFile as e:
        raise SecretError(f"{what} is {ref} but that is {e.kind}, not a regular file") from None
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not PEM text"
        raise SecretError(f"{what} is {ref} but that file cannot be read: {why}") from None
    if "-----BEGIN " not in text:
        raise SecretError(f"{what} {ref} is not PEM (no -----BEGIN line)")
    return text


def read_tls(inv: Inventory) -> TlsPair | None:
    """router.tls's pair (None without TLS); SecretError naming what cannot be read."""
    t = inv.router.tls
    if t is None:
        return None
    return TlsPair(read_pem(t.cert, "router.tls.cert"), read_pem(t.key, "router.tls.key"))
