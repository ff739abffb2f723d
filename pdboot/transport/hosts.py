"""Opening every host of a deployment at once: SSH (or local) connection + Docker engine.

Shared by up, down, status and logs. Hosts are opened in parallel with a deadline; a host
that cannot be reached is reported with its cause and does not stop the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from pdboot.inventory.schema import Inventory
from pdboot.plan.converge import Observed
from pdboot.plan.model import API_KEY_VARS, HF_TOKEN_VARS
from pdboot.transport.connection import Connection, RemoteError
from pdboot.transport.docker_host import Engine, PullResult
from pdboot.transport.docker_parse import EngineError, PullProgress
from pdboot.transport.fanout import fan_out
from pdboot.transport.masking import register_secret
from pdboot.transport.secret_refs import Environ as Environ  # re-exported
from pdboot.transport.secret_refs import SecretError as SecretError
from pdboot.transport.secret_refs import read_api_key
from pdboot.transport.secret_refs import read_hf_token as read_hf_token
from pdboot.transport.secret_refs import read_secret as read_secret
from pdboot.transport.ssh import connect

T = TypeVar("T")


def read_secrets(inv: Inventory, environ: Environ | None = None) -> dict[str, str]:
    """Every secret of the inventory as secrets.env's variables -> values (empty: none).
    Raises SecretError naming the first reference that cannot be resolved."""
    s = inv.secrets
    out: dict[str, str] = {}
    if s.hf_token is not None:
        token = read_secret(s.hf_token, "secrets.hf_token", environ)
        out.update(dict.fromkeys(HF_TOKEN_VARS, token))
    if s.api_key is not None:
        key = read_api_key(s.api_key, environ)
        out.update(dict.fromkeys(API_KEY_VARS, key))
    for name, ref in s.env.items():
        out[name] = read_secret(ref, f"secrets.env.{name}", environ)
    return out


def register_secrets(values: Mapping[str, str]) -> None:
    """Masked from now on in everything pdboot prints or logs (remote.register_secret)."""
    for v in values.values():
        register_secret(v)


def register_inventory_secrets(inv: Inventory, environ: Environ | None = None) -> None:
    """For commands that only read (logs, status): mask every secret that resolves on
    this machine; one that does not is skipped, as these commands do not need it."""
    for ref in (inv.secrets.hf_token, inv.secrets.api_key, *inv.secrets.env.values()):
        if ref is None:
            continue
        try:
            register_secret(read_secret(ref, "secret", environ))
        except SecretError:
            continue


def api_key_headers(values: Mapping[str, str]) -> dict[str, str]:
    """The header pdboot's own requests to the deployment carry when it has an API key."""
    key = values.get("VLLM_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def router_secrets_env(values: Mapping[str, str]) -> str | None:
    """The router's own env file (mode 0600): OPENAI_API_KEY alone, which vllm-router sends
    to the engines; never the HF token or secrets.env's other values (None: no key)."""
    key = values.get("OPENAI_API_KEY")
    return f"OPENAI_API_KEY={key}\n" if key else None


def secrets_env(values: str | Mapping[str, str]) -> str:
    """The env file compose passes to the services (mode 0600 on the host). A plain
    string is an HF token alone (both names the HF libraries read)."""
    if isinstance(values, str):
        values = dict.fromkeys(HF_TOKEN_VARS, values)
    return "".join(f"{k}={v}\n" for k, v in values.items())


def project_dir(inv: Inventory) -> str:
    return f"{inv.remote_dir.rstrip('/')}/{inv.name}"


class EngineOps(Protocol):
    """What callers use of a host's Docker engine (``docker_host.Engine``; the unit tests' fake
    engine implements it too)."""

    def pull(self, image: str, on_progress: Callable[[PullProgress], None]) -> PullResult: ...

    def ship(
        self,
        project_dir: str,
        compose_text: str,
        secrets_text: str | None,
        extra: Mapping[str, str] | None = None,
    ) -> None: ...

    def containers(self, deployment: str) -> list[Observed]: ...

    def inspect(self, container_id: str) -> Observed: ...

    def logs(
        self,
        container_id: str,
        tail: int | None = 50,
        since: int | None = None,
        timestamps: bool = False,
    ) -> list[str]: ...

    def follow_logs(
        self,
        container_id: str,
        tail: int | None = 50,
        since: int | None = None,
        timestamps: bool = False,
    ) -> Iterator[str]: ...

    def compose_up(
        self,
        project_dir: str,
        project: str,
        service: str | Sequence[str],
        *,
        recreate: bool,
        timeout: float,
        file: str = "compose.yaml",
    ) -> None: ...

    def stop_remove(self, container_ids: list[str], grace: int = 30) -> None: ...

    def read_file(self, path: str) -> str | None: ...

    def local_digests(self, image: str) -> list[str]: ...

    def record_pulled(self, project_dir: str, entries: list[tuple[str, str]]) -> None: ...

    def pulled(self, project_dir: str) -> list[tuple[str, str]]: ...

    def run_once(self, argv: list[str], timeout: float) -> tuple[int, str]: ...

    def run_streamed(
        self,
        name: str,
        image: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        binds: Sequence[str],
        on_line: Callable[[str], None],
        secret_files: Mapping[str, str] | None = None,
    ) -> int: ...

    def remove_project_dir(self, project_dir: str) -> None: ...

    def remove_image(self, image: str) -> bool: ...

    def close(self) -> None: ...


@dataclass
class Link:
    """One open host: its connection and its Docker engine, as the protocols callers use."""

    conn: Connection
    engine: EngineOps


# Reconnections of one host in one run: a host that keeps going silent is treated as lost.
RELINKS_PER_HOST = 3


@dataclass
class Hosts:
    links: dict[str, Link] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # host -> cause (with fix)
    relinks: dict[str, int] = field(default_factory=dict)  # host -> reconnections so far
    # told of every reconnection (host, the watchdog's reason): the command's view shows it,
    # whichever step it happened in
    on_relink: Callable[[str, str], None] | None = None

    def close(self) -> None:
        for link in self.links.values():
            link.engine.close()
            link.conn.close()

    def relink(self, name: str) -> bool:
        """Reconnect a host whose SSH transport the keepalive watchdog closed (ssh.py), when
        it answers again: the watchdog also fires on a live host when this process is
        starved of CPU. True: reconnected, the Docker client reopened in place, so a step
        may be retried. Bounded (RELINKS_PER_HOST); False for a host that stays silent,
        which keeps its fast failure."""
        link = self.links.get(name)
        reconnect = getattr(link.conn, "reconnect", None) if link is not None else None
        reopen = getattr(link.engine, "reopen", None) if link is not None else None
        if link is None or link.conn.lost is None or reconnect is None or reopen is None:
            return False
        if self.relinks.get(name, 0) >= RELINKS_PER_HOST:
            return False
        self.relinks[name] = self.relinks.get(name, 0) + 1
        why = link.conn.lost
        if not reconnect():
            return False
        try:
            reopen()
        except EngineError:
            return False
        if self.on_relink is not None:
            self.on_relink(name, why)
        return True

    def each(
        self, fn: Callable[[str, Link], T], deadline: float, only: Iterable[str] | None = None
    ) -> tuple[dict[str, T], dict[str, str]]:
        """Run ``fn`` on the reachable hosts in parallel: (values, host -> error message).
        A host the watchdog cut off that answers again is reconnected and ``fn`` run there
        once more; a failure on a host the watchdog gave up on carries the watchdog's
        reason (the Docker SDK's own error only says the socket closed)."""
        names = list(only) if only is not None else list(self.links)
        values, errors = self._each(fn, deadline, names)
        again = [n for n in errors if self.relink(n)]
        if again:
            more, errors_again = self._each(fn, deadline, again)
            values.update(more)
            errors = {n: m for n, m in errors.items() if n not in again} | errors_again
        for n, msg in errors.items():
            lost = self.links[n].conn.lost if n in self.links else None
            if lost and lost not in msg:
                errors[n] = f"{msg} (the SSH connection was closed: {lost})"
        return values, errors

    def _each(
        self, fn: Callable[[str, Link], T], deadline: float, names: list[str]
    ) -> tuple[dict[str, T], dict[str, str]]:
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
        conn = connect(name, inv.hosts[name], inv.ssh, accept_new_host_keys=accept_new_host_keys)
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
