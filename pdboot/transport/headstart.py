"""OpenSSH batches started before pdboot's own imports, for `pdboot preflight INVENTORY`.

entry.py calls ``begin`` with the inventory's path before typer, pydantic or paramiko load,
for `pdboot preflight INVENTORY` with --json or -v at most (cli_preflight.plain_line). It
reads the inventory file (yamlsafe's caps), takes the Targets openssh.raw_targets finds for the
deployment's hosts, and starts `ssh ... -- bash -s` on each: every process does its handshake
and waits for its script on stdin while pdboot imports, validates and builds the batches.
run_preflight takes a host's process only when the validated inventory gives the same
Target; ``close`` ends the others (their ssh killed: the remote bash, still waiting for its
script, has run nothing).
Nothing is started for a documentation address, a `local` host, anything the raw read cannot
judge, any other command line (--only, --skip, --accept-new-host-keys), or where a fabric
config file exists (``client_configs``): those go the usual way.
"""

from __future__ import annotations

import atexit
import logging
import os
import select
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pdboot.transport.connection import BaseConnection, CommandResult, RemoteError
from pdboot.transport.masking import SECRETS, Masker
from pdboot.transport.openssh import (
    FABRIC_CONFIG_FILES,
    SSH_CONFIG_FILES,
    SSH_FAILED,
    Target,
    argv,
    config_is_quiet,
    raw_targets,
)

log = logging.getLogger(__name__)

BATCH = "bash -s"  # what preflight runs (run.py): the script comes on stdin
# The process started ahead says when its session is open, so that the caller's clock starts
# where paramiko's would (after the connect): the clock check compares hosts by it.
READY = "pdboot-session-open"
_MAX_BEFORE_READY = 1 << 16  # bytes a login shell may print first
WAITING = f"printf '%s\\n' {READY}; exec {BATCH}"
SWITCH = "PDBOOT_PREFLIGHT_SSH"  # "paramiko": no head start (to compare, or to rule it out)
_MAX_BYTES = 1 << 20  # inventory/load.py's cap (MAX_INVENTORY_BYTES); larger: no head start


class HeadStart:
    """One waiting `ssh ... bash -s` per host (``take`` hands each out once).
    ``ssh_config_quiet``: what ``client_configs`` found, for the validated side's Targets."""

    def __init__(
        self,
        ssh: str,
        started: Mapping[str, tuple[Target, subprocess.Popen[str]]],
        ssh_config_quiet: bool = False,
    ):
        self.ssh = ssh
        self.ssh_config_quiet = ssh_config_quiet
        self._started = dict(started)
        self._lock = threading.Lock()

    @property
    def hosts(self) -> set[str]:
        return set(self._started)

    def add(self, name: str, t: Target, proc: subprocess.Popen[str]) -> None:
        with self._lock:
            self._started[name] = (t, proc)

    def take(
        self, name: str, t: Target | None, command_timeout: float, masker: Masker = SECRETS
    ) -> OpenSSHConnection | None:
        """The host's waiting process as a connection, when it was started for exactly this
        Target; else None (and a process started for another is ended)."""
        with self._lock:
            got = self._started.pop(name, None)
        if got is None:
            return None
        started_for, proc = got
        if t is None or t != started_for:
            _end(proc)
            return None
        return OpenSSHConnection(name, t, self.ssh, proc, command_timeout, masker)

    def close(self) -> None:
        with self._lock:
            left, self._started = list(self._started.values()), {}
        for _, proc in left:
            _end(proc)


class OpenSSHConnection(BaseConnection):
    """A host reached through the system ssh: the first `bash -s` goes to the process started
    ahead, every other command to an ssh process of its own (a new handshake each: preflight
    sends one more command at most, the image parser's, and only on a cache miss)."""

    def __init__(
        self,
        name: str,
        t: Target,
        ssh: str,
        waiting: subprocess.Popen[str] | None,
        command_timeout: float = 120.0,
        masker: Masker = SECRETS,
    ) -> None:
        self.name, self.target, self.ssh = name, t, ssh
        self.command_timeout = command_timeout
        self.masker = masker
        self._waiting = waiting

    def ready(self, timeout: float) -> bool:
        """Wait until the process started ahead has its session open (its READY line; what a
        login shell's rc files print before it is dropped, as the batch parser would drop
        it); False when ssh failed or did not get there in time (the process is then ended)."""
        proc = self._waiting
        if proc is None or proc.stdout is None:
            return False
        # os.read on the pipe, not the text wrapper: nothing past the line may be buffered
        # where communicate() would not see it (nothing follows it before the script anyway)
        fd, line, end = proc.stdout.fileno(), b"", time.monotonic() + timeout
        for _ in range(_MAX_BEFORE_READY):
            left = end - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                break
            byte = os.read(fd, 1)
            if not byte:
                break
            if byte != b"\n":
                line += byte
            elif line.rstrip(b"\r") == READY.encode():
                return True
            else:
                line = b""
        self.close()
        return False

    def _exec(self, line: str, timeout: float, stdin: str | None) -> CommandResult:
        proc = None
        if line == BATCH and self._waiting is not None:
            proc, self._waiting = self._waiting, None
        t0 = time.monotonic()
        if proc is None:
            proc = _spawn(argv(self.target, line, self.ssh))
        try:
            out, err = proc.communicate(stdin or "", timeout=timeout)
        except subprocess.TimeoutExpired:
            _end(proc)
            raise RemoteError(
                self.name, "timeout", f"command did not finish within {timeout:g}s"
            ) from None
        return CommandResult(proc.returncode, out, err, time.monotonic() - t0)

    def close(self) -> None:
        if self._waiting is not None:
            _end(self._waiting)
            self._waiting = None


def failed(res: CommandResult) -> bool:
    """ssh itself failed (not the command): preflight then goes through paramiko."""
    return res.rc == SSH_FAILED


def _spawn(cmd: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",  # as over paramiko: byte counts in scripts are UTF-8
        errors="replace",
    )


def _end(proc: subprocess.Popen[str]) -> None:
    try:
        proc.kill()
        proc.communicate(timeout=5)
    except Exception:  # already gone; nothing of ours is left to stop
        log.debug("ending an ssh process", exc_info=True)


_current: HeadStart | None = None


def current() -> HeadStart | None:
    return _current


def begin(inventory: Path) -> None:
    """Start the batches' ssh processes for `pdboot preflight INVENTORY` (with --json or -v
    at most: entry.py asks only then), when its hosts allow it."""
    global _current
    ssh = shutil.which("ssh")
    if ssh is None or os.environ.get(SWITCH) == "paramiko":
        return
    quiet = client_configs()
    if quiet is None:
        return
    try:
        wanted = _targets(inventory, quiet)
    except Exception:  # no head start; the usual path reports whatever is wrong
        log.debug("no OpenSSH head start", exc_info=True)
        return
    _current = HeadStart(ssh, {}, quiet)
    atexit.register(_current.close)  # also when the inventory then fails validation
    for name, t in wanted.items():
        try:
            _current.add(name, t, _spawn(argv(t, WAITING, ssh)))
        except OSError:  # that host goes through paramiko
            log.debug("cannot start ssh for %s", name, exc_info=True)


def client_configs(
    ssh_configs: Sequence[str] = SSH_CONFIG_FILES,
    fabric_configs: Sequence[str] = FABRIC_CONFIG_FILES,
) -> bool | None:
    """None where a fabric config file exists (it could set any connection's user, port or
    keys: no OpenSSH batch at all); else whether the ssh_config files fabric reads are quiet
    (openssh.config_is_quiet; one that cannot be read is not)."""
    if any(os.path.lexists(os.path.expanduser(p)) for p in fabric_configs):
        return None
    for p in ssh_configs:
        path = Path(os.path.expanduser(p))
        if not path.exists():
            continue
        try:
            if not config_is_quiet(path.read_text(encoding="utf-8", errors="replace")):
                return False
        except OSError:
            return False
    return True


def _targets(path: Path, ssh_config_quiet: bool = False) -> dict[str, Target]:
    from pdboot.inventory import yamlsafe
    from pdboot.inventory.localfiles import read_regular_file
    from pdboot.inventory.safety import is_documentation_address

    raw = read_regular_file(path, _MAX_BYTES + 1)
    if len(raw) > _MAX_BYTES:
        return {}
    _, doc = yamlsafe.load(raw.decode("utf-8"))
    found = raw_targets(doc, ssh_config_quiet)
    hosts = _deployment_hosts(doc)
    if hosts is None or any(is_documentation_address(t.address) for t in found.values()):
        return {}
    return {n: found[n] for n in hosts if n in found}


def _deployment_hosts(doc: Any) -> list[str] | None:
    """inventory/rules.py's deployment_hosts on the raw document; None when not plain."""
    try:
        names = [*doc["decode"]["hosts"], *doc["prefill"]["hosts"], doc["router"]["host"]]
    except (KeyError, TypeError):
        return None
    if not all(isinstance(n, str) for n in names):
        return None
    return list(dict.fromkeys(names))
