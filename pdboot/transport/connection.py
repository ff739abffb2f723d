"""A connection to one host, as callers see it: run a command (argv lists, quoted here), write a
file, close; the results and errors it gives. Hosts whose address is ``local`` run the same
commands through subprocess (``LocalConnection``), behind the same API as SSH hosts
(``pdboot.transport.ssh``).
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from pdboot.transport.masking import SECRETS, Masker

if TYPE_CHECKING:
    from pdboot.inventory.schema import Host, SSHSettings

log = logging.getLogger(__name__)

ErrorKind = Literal["unreachable", "auth", "timeout", "host_key", "host_key_changed", "error"]


@dataclass(frozen=True)
class CommandResult:
    rc: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.rc == 0


class RemoteError(Exception):
    """A host could not be reached or a command could not complete.

    ``kind`` is one of unreachable, auth, timeout, host_key (unknown key),
    host_key_changed, error; ``fix`` says what the operator can do about it.
    """

    def __init__(self, host: str, kind: ErrorKind, message: str, fix: str = "") -> None:
        self.host = host
        self.kind = kind
        self.message = message
        self.fix = fix
        super().__init__(f"{host}: {message}")


class HostLost(RemoteError):
    """A host that answered before stopped answering mid-run (its link or the host went
    down): reported as lost, by name, instead of as a slow command or engine. Raised by
    the connection layer (and, as ``docker_parse.EngineLost``, by the Docker layer): catch
    this class to handle both."""

    def __init__(self, host: str, why: str) -> None:
        super().__init__(
            host,
            "unreachable",
            f"host {host} lost: {why}",
            "check the host's network link and power; `pdboot status` shows what runs",
        )


def connect_timed_out(host: str, detail: str) -> RemoteError:
    """No TCP connection within ssh.connect_timeout (paramiko's socket timeout)."""
    return RemoteError(
        host,
        "timeout",
        f"connection timed out: {detail or 'no answer'}",
        "check the address, routing and firewalls, or raise ssh.connect_timeout",
    )


def effective_ssh(defaults: SSHSettings, host: Host) -> SSHSettings:
    """The inventory's SSH defaults with the host's overrides applied."""
    over = {k: v for k, v in host.ssh.model_dump().items() if v is not None}
    return defaults.model_copy(update=over)


def command_line(cmd: Sequence[str] | str) -> str:
    """An argv list becomes a shell-quoted line; a string is a script, passed as is."""
    if isinstance(cmd, str):
        return cmd
    if not cmd:
        raise ValueError("empty command")
    return shlex.join(str(a) for a in cmd)


def put_text_script(path: str, mode: int) -> str:
    """Shell that writes stdin to ``path`` with ``mode``, never readable by others meanwhile.

    umask 077 makes the temporary file private from its creation; chmod then sets the
    wanted mode, and rename makes the new content appear at once.
    """
    q = shlex.quote(path)
    d = shlex.quote(os.path.dirname(path) or ".")
    return (
        "set -e; umask 077; "
        f"mkdir -p {d}; "
        f"tmp=$(mktemp {q}.XXXXXX); trap 'rm -f \"$tmp\"' EXIT; "
        f'cat > "$tmp"; chmod {mode:o} "$tmp"; mv -f "$tmp" {q}; trap - EXIT'
    )


class Connection(Protocol):
    """A host's connection as callers use it (``LocalConnection``, ``ssh.SSHConnection``, and
    the unit tests' fakes)."""

    @property
    def name(self) -> str: ...

    @property
    def lost(self) -> str | None:
        """Why the host counts as lost mid-run (None while it answers, and always for
        hosts that cannot be lost: local ones)."""
        ...

    def run(
        self, cmd: Sequence[str] | str, timeout: float | None = None, stdin: str | None = None
    ) -> CommandResult: ...

    def put_text(self, path: str, text: str, mode: int = 0o644) -> None: ...

    def close(self) -> None: ...


class BaseConnection:
    name: str
    command_timeout: float
    masker: Masker

    def run(
        self, cmd: Sequence[str] | str, timeout: float | None = None, stdin: str | None = None
    ) -> CommandResult:
        line = command_line(cmd)
        limit = self.command_timeout if timeout is None else timeout
        log.debug("%s $ %s", self.name, self.masker.mask(line))
        res = self._exec(line, limit, stdin)
        log.debug("%s exit=%d in %.3fs", self.name, res.rc, res.seconds)
        return res

    def put_text(self, path: str, text: str, mode: int = 0o644) -> None:
        res = self.run(put_text_script(path, mode), stdin=text)
        if res.rc != 0:
            raise RemoteError(
                self.name, "error", f"cannot write {path}: {self.masker.mask(res.stderr.strip())}"
            )

    @property
    def lost(self) -> str | None:
        return None

    def _exec(self, line: str, timeout: float, stdin: str | None) -> CommandResult:
        raise NotImplementedError


class LocalConnection(BaseConnection):
    """``address: local``: the same commands, through bash on this machine."""

    def __init__(self, name: str, command_timeout: float = 120.0, masker: Masker = SECRETS):
        self.name = name
        self.command_timeout = command_timeout
        self.masker = masker

    def _exec(self, line: str, timeout: float, stdin: str | None) -> CommandResult:
        t0 = time.monotonic()
        try:
            p = subprocess.run(
                ["bash", "-c", line],
                input=stdin if stdin is not None else "",
                capture_output=True,
                encoding="utf-8",  # as over SSH: byte counts in scripts are UTF-8
                errors="replace",
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise RemoteError(
                self.name, "timeout", f"command did not finish within {timeout:g}s"
            ) from None
        return CommandResult(p.returncode, p.stdout, p.stderr, time.monotonic() - t0)

    def close(self) -> None:
        pass
