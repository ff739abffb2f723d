"""Opening every host of a deployment at once: SSH (or local) connection + Docker engine.

Shared by up, down, status and logs. Hosts are opened in parallel with a deadline; a host
that cannot be reached is reported with its cause and does not stop the others.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from pdboot.engine import Engine, EngineError
from pdboot.inventory import Inventory
from pdboot.remote import Connection, RemoteError, connect, fan_out

T = TypeVar("T")


class SecretError(Exception):
    """The HF token reference in the inventory cannot be resolved (exit 2)."""


def read_hf_token(
    ref: str | None,
    environ: dict[str, str] | os._Environ[str] | None = None,
) -> str | None:
    """Resolve ``env:NAME`` / ``file:/path`` / a bare path to the token value (at `up` time)."""
    if ref is None:
        return None
    env = os.environ if environ is None else environ
    if ref.startswith("env:"):
        name = ref[4:]
        value = env.get(name)
        if not value:
            raise SecretError(
                f"secrets.hf_token is {ref} but the environment variable {name} is not set "
                "(or empty) where pdboot runs"
            )
    else:
        path = os.path.expanduser(ref[5:] if ref.startswith("file:") else ref)
        try:
            with open(path, encoding="utf-8") as f:
                value = f.read()
        except OSError as e:
            raise SecretError(
                f"secrets.hf_token is {ref} but that file cannot be read: {e.strerror}"
            ) from None
    value = value.strip()
    if not value:
        raise SecretError(f"secrets.hf_token {ref} is empty")
    if any(c.isspace() for c in value) or any(c in value for c in "\"'\\$"):
        raise SecretError(f"secrets.hf_token {ref} does not look like a token (spaces or quotes)")
    return value


def secrets_env(token: str) -> str:
    """The env file compose passes to engines (both names the HF libraries read)."""
    return f"HF_TOKEN={token}\nHUGGING_FACE_HUB_TOKEN={token}\n"


def project_dir(inv: Inventory) -> str:
    return f"{inv.remote_dir.rstrip('/')}/{inv.name}"


@dataclass
class Link:
    conn: Connection
    engine: Engine


@dataclass
class Hosts:
    links: dict[str, Link] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # host -> cause (with fix)

    def close(self) -> None:
        for link in self.links.values():
            link.engine.close()
            link.conn.close()

    def each(
        self, fn: Callable[[str, Link], T], deadline: float, only: Iterable[str] | None = None
    ) -> tuple[dict[str, T], dict[str, str]]:
        """Run ``fn`` on the reachable hosts in parallel: (values, host -> error message)."""
        names = list(only) if only is not None else list(self.links)
        items = [(n, self.links[n]) for n in names if n in self.links]

        def call(name: str, link: Link) -> T:
            try:
                return fn(name, link)
            except EngineError as e:  # already names the host; keep the message as is
                raise RemoteError(name, "error", e.message) from e

        res = fan_out(items, call, deadline)
        values: dict[str, T] = {}
        errors: dict[str, str] = {}
        for name, o in res.items():
            if o.error is not None:
                errors[name] = o.error.message
            else:
                values[name] = o.value  # type: ignore[assignment]
        return values, errors


def open_hosts(
    inv: Inventory,
    names: Iterable[str],
    *,
    accept_new_host_keys: bool = False,
    engine_timeout: int | None = 120,
) -> Hosts:
    def _open(name: str, _: object) -> Link:
        conn = connect(
            name, inv.hosts[name], inv.ssh, accept_new_host_keys=accept_new_host_keys
        )
        try:
            return Link(conn, Engine.open(conn, engine_timeout))
        except EngineError as e:
            conn.close()
            raise RemoteError(name, "error", e.message) from e

    wanted = list(dict.fromkeys(names))
    deadline = inv.ssh.connect_timeout * 2 + 30
    res = fan_out([(n, None) for n in wanted], _open, deadline)
    hosts = Hosts()
    for name, o in res.items():
        if o.value is not None:
            hosts.links[name] = o.value
        else:
            err = o.error
            msg = err.message if err else "unknown error"
            if err is not None and err.fix:
                msg += f" (fix: {err.fix})"
            hosts.errors[name] = msg
    return hosts
