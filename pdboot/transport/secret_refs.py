"""Secret references resolved where pdboot runs (``env:NAME``, ``file:/path``): the values
`up` ships as secrets.env, and the one error they raise (exit 2). Its own module so that what
only reads secrets (preflight's secret and TLS checks) does not import the Docker SDK with
transport/hosts.py."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pdboot.inventory.localfiles import NotRegularFile, read_regular_file
from pdboot.plan.proxy import MAX_API_KEY_CHARS


class SecretError(Exception):
    """A secret reference in the inventory cannot be resolved (exit 2)."""


Environ = Mapping[str, str]


def read_secret(ref: str, what: str, environ: Environ | None = None) -> str:
    """Resolve ``env:NAME`` / ``file:/path`` / a bare path to the value (at `up` time)."""
    env = os.environ if environ is None else environ
    if ref.startswith("env:"):
        name = ref[4:]
        value = env.get(name)
        if not value:
            raise SecretError(
                f"{what} is {ref} but the environment variable {name} is not set "
                "(or empty) where pdboot runs"
            )
    else:
        path = os.path.expanduser(ref[5:] if ref.startswith("file:") else ref)
        try:
            # a secret, not a data file; stat first: a FIFO would block the open
            value = read_regular_file(Path(path), 64 * 1024).decode("utf-8")
        except NotRegularFile as e:
            raise SecretError(f"{what} is {ref} but that is {e.kind}, not a regular file") from None
        except (OSError, UnicodeDecodeError) as e:
            why = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
            raise SecretError(f"{what} is {ref} but that file cannot be read: {why}") from None
    value = value.strip()
    if not value:
        raise SecretError(f"{what} {ref} is empty")
    # secrets.env is a compose env file: no quoting, and $ would be interpolated.
    if any(c.isspace() for c in value) or any(c in value for c in "\"'\\$`"):
        raise SecretError(f"{what} {ref} does not look like a token (spaces, quotes or $)")
    return value


def read_api_key(ref: str, environ: Environ | None = None) -> str:
    """secrets.api_key's value, refused when longer than the proxy serves (a client's header
    carrying it must fit one of nginx's header buffers: plan/proxy.MAX_API_KEY_CHARS)."""
    key = read_secret(ref, "secrets.api_key", environ)
    if len(key) > MAX_API_KEY_CHARS:
        raise SecretError(
            f"secrets.api_key {ref} is {len(key)} characters; the proxy serves keys of at "
            f"most {MAX_API_KEY_CHARS}"
        )
    return key


def read_hf_token(ref: str | None, environ: Environ | None = None) -> str | None:
    return None if ref is None else read_secret(ref, "secrets.hf_token", environ)
