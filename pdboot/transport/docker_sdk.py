"""The docker SDK over pdboot's own SSH connection.

How it reaches a remote engine matters for security: the SDK's own ``ssh://`` transport
builds a second paramiko client that loads only ``~/.ssh/known_hosts`` (and ignores the
inventory's known_hosts, identity and port). Instead the SDK rides pdboot's already-verified
SSH connection: each HTTP connection is a new channel on that transport running ``docker
system dial-stdio``, exactly what ``docker -H ssh://`` does, so strict host-key checking
against the inventory's known_hosts holds and no second SSH login happens. ``local`` hosts
use the local engine from the environment (DOCKER_HOST or the socket).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.tls import TLSConfig
from docker.transport.sshconn import SSHConnection as DockerSSHConnection
from docker.transport.sshconn import SSHConnectionPool, SSHHTTPAdapter
from docker.utils import kwargs_from_env

from pdboot.transport.connection import (
    Connection,
    LocalConnection,
    RemoteError,
)
from pdboot.transport.docker_parse import EngineError
from pdboot.transport.ssh import CHANNEL_OPEN_TIMEOUT, SSHConnection


class _ChannelHTTPConnection(DockerSSHConnection):  # type: ignore[misc]
    """One HTTP connection: a ``docker system dial-stdio`` channel on the host's live
    transport (taken at connect time, so a reconnect is followed). The SDK's own opens its
    channel with no timeout (paramiko's default is an hour): bounded here, so a stuck open
    fails instead of hanging the caller."""

    def __init__(self, conn: SSHConnection, timeout: int | None) -> None:
        super().__init__(None, timeout, "pdboot")
        self.pdboot_conn = conn

    def connect(self) -> None:
        sock = self.pdboot_conn.live_transport().open_session(timeout=CHANNEL_OPEN_TIMEOUT)
        sock.settimeout(self.timeout)
        sock.exec_command("docker system dial-stdio")
        self.sock = sock


class _ChannelPool(SSHConnectionPool):  # type: ignore[misc]
    def __init__(self, conn: SSHConnection, timeout: int | None, maxsize: int) -> None:
        super().__init__(ssh_client=None, timeout=timeout, maxsize=maxsize, host="pdboot")
        self.pdboot_conn = conn

    def _new_conn(self) -> _ChannelHTTPConnection:
        return _ChannelHTTPConnection(self.pdboot_conn, self.timeout)

    def _get_conn(self, timeout: float | None = None) -> Any:
        # The SDK's pool skips urllib3's dropped-connection check (it calls fileno(), which
        # makes a pipe per channel), so a kept channel that ended (dial-stdio gone, the
        # transport closed) failed the next call with "Socket is closed" (CI, a real-engine
        # `up`). Its flags tell without a pipe; a closed connection reconnects on use.
        conn = super()._get_conn(timeout)
        chan = getattr(conn, "sock", None)
        if chan is not None and (chan.closed or chan.eof_received):
            conn.close()
        return conn


class _ChannelAdapter(SSHHTTPAdapter):  # type: ignore[misc]
    """docker SDK adapter whose connections are channels on pdboot's verified SSH
    connection (see the module docstring). It never opens or closes SSH itself."""

    def __init__(self, conn: SSHConnection, timeout: int | None) -> None:
        super().__init__("ssh://pdboot", timeout=timeout, shell_out=True)
        self.pdboot_conn = conn

    def _connect(self) -> None:
        raise RemoteError("docker", "unreachable", "the SSH connection was closed")

    def get_connection(self, url: str, proxies: Any = None) -> Any:
        # One pool for the host: the SDK keys pools by full URL, so every new API path
        # would start another `docker system dial-stdio` (about 0.2 s each over SSH).
        with self.pools.lock:
            pool = self.pools.get("engine")
            if pool is None:
                pool = _ChannelPool(self.pdboot_conn, self.timeout, self.max_pool_size)
                self.pools["engine"] = pool
            return pool

    def close(self) -> None:
        self.pools.clear()  # the SSH connection belongs to transport/ssh.py


def local_engine_kwargs(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Where the local `docker` CLI (and so `docker compose`) sends its requests, for the
    SDK: DOCKER_HOST (+ TLS variables) first, else the context named by DOCKER_CONTEXT or
    the config's currentContext, else the default socket. The SDK alone reads only the
    environment: with a context in use its containers and compose's would be on two
    different engines. (The SDK's own context loader looks for the store beside a
    config.json that `docker context create` does not write, so the store is read here.)"""
    env = os.environ if environ is None else environ
    kwargs: dict[str, Any] = kwargs_from_env(environment=dict(env))
    if env.get("DOCKER_HOST"):
        return kwargs
    cfg_dir = Path(env.get("DOCKER_CONFIG") or Path.home() / ".docker")
    name = env.get("DOCKER_CONTEXT")
    if not name:
        try:
            name = json.loads((cfg_dir / "config.json").read_text()).get("currentContext")
        except (OSError, ValueError, AttributeError):
            name = None
    if not name or name == "default":
        return kwargs
    cid = hashlib.sha256(name.encode()).hexdigest()
    try:
        meta = json.loads((cfg_dir / "contexts" / "meta" / cid / "meta.json").read_text())
        endpoint = meta["Endpoints"]["docker"]
        kwargs["base_url"] = str(endpoint["Host"])
    except (OSError, ValueError, KeyError, TypeError):
        raise RuntimeError(
            f"docker context {name!r} not found in {cfg_dir} (`docker context ls`)"
        ) from None
    tls = cfg_dir / "contexts" / "tls" / cid / "docker"
    if tls.is_dir():
        cert, key, ca = tls / "cert.pem", tls / "key.pem", tls / "ca.pem"
        kwargs["tls"] = TLSConfig(
            client_cert=(str(cert), str(key)) if cert.exists() and key.exists() else None,
            ca_cert=str(ca) if ca.exists() else None,
            verify=not endpoint.get("SkipTLSVerify", False),
        )
    return kwargs


def api_for(conn: Connection, timeout: int | None) -> Any:
    """A docker SDK client for the host of ``conn``: the local engine for a local host, else
    one whose HTTP connections are channels on the connection's verified SSH client."""
    if isinstance(conn, LocalConnection):
        return docker.APIClient(version="auto", timeout=timeout, **local_engine_kwargs())
    if not isinstance(conn, SSHConnection) or conn.ssh_client() is None:
        raise EngineError(conn.name, "no open SSH connection to reach Docker through")
    adapter = _ChannelAdapter(conn, timeout)
    # The engine's own API version (new engines refuse old ones), asked through the tunnel by
    # a client with a placeholder version (it makes no connection when it is built).
    probe = _tunnelled(adapter, "1.41", timeout)
    try:
        version = str(probe.version(api_version=False)["ApiVersion"])
    except Exception as e:  # the words the SDK's own version lookup uses
        raise docker.errors.DockerException(f"Error while fetching server API version: {e}") from e
    return _tunnelled(adapter, version, timeout)


def _tunnelled(adapter: _ChannelAdapter, version: str, timeout: int | None) -> Any:
    api = docker.APIClient(
        base_url="ssh://pdboot", version=version, timeout=timeout, use_ssh_client=True
    )
    api.mount("http+docker://ssh", adapter)  # replaces the SDK's own ssh adapter (requests)
    return api
