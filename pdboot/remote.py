"""Running commands on hosts: the only module that imports fabric/paramiko.

One connection per host, opened once and reused for every command. SSH hosts go through
fabric (so ``~/.ssh/config`` is honoured) with strict host-key checking: fabric's default
auto-accepts unknown keys, which we replace with our own policy. Hosts whose address is
``local`` run the same commands through subprocess, behind the same API.

``fan_out`` runs one function per host on daemon threads and waits with a deadline, so a
hung host is reported as a timeout instead of hanging the whole run (fabric's ThreadingGroup
joins without a timeout).
"""

from __future__ import annotations

import logging
import os
import select
import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, Protocol, TypeVar

import paramiko
from fabric import Config as FabricConfig
from fabric import Connection as FabricConnection

from pdboot import sshdeadline
from pdboot.inventory import LOCAL, Host, SSHSettings

log = logging.getLogger("pdboot.remote")

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
    the connection layer (and, as ``engine.EngineLost``, by the engine layer): catch
    this class to handle both."""

    def __init__(self, host: str, why: str) -> None:
        super().__init__(
            host,
            "unreachable",
            f"host {host} lost: {why}",
            "check the host's network link and power; `pdboot status` shows what runs",
        )


# --------------------------------------------------------------------------- secrets


class Masker:
    """Values registered here are replaced by ``***`` in anything we log or report."""

    def __init__(self) -> None:
        self._values: set[str] = set()
        self._lock = threading.Lock()

    def register(self, value: str) -> None:
        if value and len(value) >= 4:  # masking "a" would shred every message
            with self._lock:
                self._values.add(value)

    def mask(self, text: str) -> str:
        with self._lock:
            values = sorted(self._values, key=len, reverse=True)
        for v in values:
            text = text.replace(v, "***")
        return text


# Process-wide: a secret registered once (e.g. the HF token read by `up`) stays masked in
# every log line, whichever connection printed it.
SECRETS = Masker()


def register_secret(value: str) -> None:
    SECRETS.register(value)


def mask(text: str) -> str:
    return SECRETS.mask(text)


# --------------------------------------------------------------------------- commands


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
    name: str

    def run(
        self, cmd: Sequence[str] | str, timeout: float | None = None, stdin: str | None = None
    ) -> CommandResult: ...

    def put_text(self, path: str, text: str, mode: int = 0o644) -> None: ...

    def close(self) -> None: ...


class _Base:
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

    def _exec(self, line: str, timeout: float, stdin: str | None) -> CommandResult:
        raise NotImplementedError


class LocalConnection(_Base):
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


# --------------------------------------------------------------------------- SSH


def fingerprint(key: paramiko.PKey) -> str:
    return str(key.fingerprint)  # "SHA256:..." like ssh-keygen -l


def known_hosts_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def split_known_hosts_name(name: str) -> tuple[str, int | None]:
    """``[10.0.0.2]:2222`` -> (``10.0.0.2``, 2222); ``gpu-a`` -> (``gpu-a``, None)."""
    if name.startswith("[") and "]:" in name:
        addr, _, port = name[1:].rpartition("]:")
        if port.isdigit():
            return addr, int(port)
    return name, None


class UnknownHostKey(paramiko.SSHException):  # type: ignore[misc]
    def __init__(self, hostname: str, key: paramiko.PKey, known_hosts: str, note: str = "") -> None:
        self.hostname = hostname
        self.key = key
        self.known_hosts = known_hosts
        self.note = note
        super().__init__(f"host key for {hostname} is not in {known_hosts}")


class RevokedHostKey(paramiko.SSHException):  # type: ignore[misc]
    def __init__(self, hostname: str, key: paramiko.PKey, known_hosts: str) -> None:
        self.hostname = hostname
        self.key = key
        self.known_hosts = known_hosts
        super().__init__(f"host key for {hostname} is marked @revoked in {known_hosts}")


@dataclass
class KnownHosts:
    """A known_hosts file as pdboot reads it (paramiko's HostKeys alone raises
    InvalidHostKey on OpenSSH's marker lines, failing every host with no hint why).

    ``@revoked`` keys are refused for every host (OpenSSH matches the line's host
    patterns; being stricter cannot let a revoked key in). ``@cert-authority`` lines are
    skipped: pdboot (paramiko) does not verify host certificates, so such hosts need their
    own key in the file. ``skipped`` lists (line number, why) for the operator."""

    keys: list[tuple[str, paramiko.PKey]] = field(default_factory=list)  # (name, key)
    revoked: set[tuple[str, str]] = field(default_factory=set)  # (key type, base64)
    skipped: list[tuple[int, str]] = field(default_factory=list)

    @property
    def has_cert_authority(self) -> bool:
        return any("@cert-authority" in why for _, why in self.skipped)


def parse_known_hosts(text: str) -> KnownHosts:
    """known_hosts text -> KnownHosts; never raises on a bad line (it is skipped)."""
    kh = KnownHosts()
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("@"):
            marker, _, rest = line.partition(" ")
            fields = rest.split()
            if marker == "@revoked" and len(fields) >= 3:
                kh.revoked.add((fields[1], fields[2]))
            elif marker == "@cert-authority":
                kh.skipped.append((lineno, "@cert-authority: host certificates are not supported"))
            else:
                kh.skipped.append((lineno, f"unknown marker {marker[:40]!r}"))
            continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
        except (paramiko.SSHException, paramiko.hostkeys.InvalidHostKey, ValueError) as e:
            kh.skipped.append((lineno, f"unreadable key ({type(e).__name__})"))
            continue
        if entry is None:
            kh.skipped.append((lineno, "unsupported key type or too few fields"))
            continue
        kh.keys += [(name, entry.key) for name in entry.hostnames]
    return kh


def is_revoked(kh: KnownHosts, key: paramiko.PKey) -> bool:
    return (key.get_name(), key.get_base64()) in kh.revoked


class _StrictPolicy(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]
    """Unknown key: refuse (default) or, with accept_new, record it like OpenSSH accept-new.

    Paramiko only consults the policy for hosts that are absent from the loaded
    known_hosts; a changed key raises BadHostKeyException before we get here, so
    accept_new never overrides a changed key.
    """

    def __init__(self, known_hosts: str, accept_new: bool, kh: KnownHosts | None = None) -> None:
        self.known_hosts = known_hosts
        self.accept_new = accept_new
        self.kh = kh or KnownHosts()

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: Any) -> None:
        # Revoked keys were left out of the loaded keys, so they always come here.
        if is_revoked(self.kh, key):
            raise RevokedHostKey(hostname, key, self.known_hosts)
        if not self.accept_new:
            note = ""
            if self.kh.has_cert_authority:
                note = (
                    f"{self.known_hosts} vouches for hosts with @cert-authority lines, which "
                    "pdboot cannot use (no host certificate support): add the host's own key"
                )
            raise UnknownHostKey(hostname, key, self.known_hosts, note)
        client.get_host_keys().add(hostname, key.get_name(), key)
        path = Path(self.known_hosts)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with _KNOWN_HOSTS_LOCK, path.open("a", encoding="utf-8") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        log.warning(
            "added host key %s %s for %s to %s", key.get_name(), fingerprint(key), hostname, path
        )


_KNOWN_HOSTS_LOCK = threading.Lock()


def load_known_hosts(path: str) -> KnownHosts:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return KnownHosts()
    kh = parse_known_hosts(text)
    for lineno, why in kh.skipped:
        log.warning("%s:%d: line skipped: %s", path, lineno, why)
    return kh


def _strict(client: paramiko.SSHClient, known_hosts: str, accept_new: bool) -> None:
    kh = load_known_hosts(known_hosts)
    # Into the client's host keys (not load_host_keys: nothing is remembered to save
    # back, so accept-new appends a line instead of rewriting the operator's file).
    # A revoked key is left out even if a plain line lists it too, so the policy sees it.
    keys = client.get_host_keys()
    for name, key in kh.keys:
        if not is_revoked(kh, key):
            keys.add(name, key.get_name(), key)
    client.set_missing_host_key_policy(_StrictPolicy(known_hosts, accept_new, kh))


def connect_failures(errors: Mapping[tuple[Any, ...], BaseException]) -> str:
    """paramiko's per-address connect errors -> ``10.0.0.2:22 (No route to host)``; its
    own text ("[Errno None] Unable to connect to port 22 on ...") drops every cause."""
    parts = []
    for addr, err in errors.items():
        where = f"[{addr[0]}]:{addr[1]}" if ":" in str(addr[0]) else f"{addr[0]}:{addr[1]}"
        why = getattr(err, "strerror", None) or str(err) or type(err).__name__
        parts.append(f"{where} ({why})")
    return ", ".join(parts) or "any address"


def _revoked(exc: RevokedHostKey, host: str) -> RemoteError:
    return RemoteError(
        host,
        "host_key_changed",
        f"host key of {exc.hostname} ({exc.key.get_name()} {fingerprint(exc.key)}) is "
        f"marked @revoked in {exc.known_hosts}",
        "the host offers a key its operators revoked: do not connect; get the host's "
        "current key from its administrators",
    )


def classify(
    exc: BaseException, host: str, *, known_hosts: str = "", kh_name: str = ""
) -> RemoteError:
    """Turn whatever paramiko/socket raised into a RemoteError with a cause and a fix."""
    if isinstance(exc, RemoteError):
        return exc
    if isinstance(exc, RevokedHostKey):
        return _revoked(exc, host)
    if isinstance(exc, UnknownHostKey):
        addr, port = split_known_hosts_name(exc.hostname)
        kt = exc.key.get_name()
        scan = f"ssh-keyscan -t {kt}{f' -p {port}' if port else ''} {addr}"
        return RemoteError(
            host,
            "host_key",
            f"unknown host key for {exc.hostname} ({kt} {fingerprint(exc.key)}); "
            f"not in {exc.known_hosts}" + (f" ({exc.note})" if exc.note else ""),
            f"check the fingerprint on the host (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), "
            f"then: {scan} >> {exc.known_hosts}   (or rerun with --accept-new-host-keys)",
        )
    if isinstance(exc, paramiko.BadHostKeyException):
        name = kh_name or exc.hostname
        return RemoteError(
            host,
            "host_key_changed",
            f"HOST KEY CHANGED for {name}: offered {exc.key.get_name()} "
            f"{fingerprint(exc.key)}, known_hosts has {fingerprint(exc.expected_key)}",
            "if the host was really reinstalled, remove the old line "
            f"(ssh-keygen -R '{name}'{' -f ' + known_hosts if known_hosts else ''}) "
            "and trust the new key; otherwise treat this as an attack",
        )
    if isinstance(exc, paramiko.AuthenticationException):
        return RemoteError(
            host,
            "auth",
            f"authentication refused: {exc}",
            "check ssh.user and ssh.identity_file (and that the public key is in the "
            "host's authorized_keys)",
        )
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return RemoteError(
            host,
            "timeout",
            f"connection timed out: {exc or 'no answer'}",
            "check the address, routing and firewalls, or raise ssh.connect_timeout",
        )
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return RemoteError(
            host,
            "unreachable",
            f"cannot connect to {connect_failures(exc.errors)}",
            "is the host up, the address right and sshd running on that port?",
        )
    if isinstance(exc, socket.gaierror):
        return RemoteError(
            host, "unreachable", f"cannot resolve address: {exc}", "check the host's address"
        )
    if isinstance(exc, OSError):
        return RemoteError(
            host,
            "unreachable",
            f"cannot connect: {exc.strerror or exc}",
            "check the address, routing and that sshd runs",
        )
    if isinstance(exc, paramiko.SSHException):
        text = str(exc)
        if "authentication" in text.lower():
            return RemoteError(
                host,
                "auth",
                f"authentication impossible: {text}",
                "set ssh.identity_file (or IdentityFile in ~/.ssh/config) for this host",
            )
        kind: ErrorKind = "timeout" if "banner" in text.lower() else "error"
        return RemoteError(host, kind, f"SSH error: {text}", "check that sshd answers on this port")
    return RemoteError(host, "error", f"{type(exc).__name__}: {exc}")


# A silent peer (link down: no reset, packets just stop) is noticed by unanswered
# keepalives. paramiko's own Transport.set_keepalive sends requests without wanting a
# reply, so it can never notice silence; TCP alone notices only after its retransmissions
# give up (minutes). These are requests that sshd must answer (with a failure: it does not
# know the name), so an answer proves the peer and the path are alive.
KEEPALIVE_INTERVAL = 3.0
LOST_AFTER = 12.0
CHANNEL_OPEN_TIMEOUT = 20.0


class _Watchdog:
    """Keepalives on one transport; closes it when the peer has been silent for
    ``lost_after`` seconds, so every call blocked on it (channel opens, reads, the
    docker SDK's tunnel) fails at once, and records why in ``lost``."""

    def __init__(
        self, name: str, transport: paramiko.Transport, interval: float, lost_after: float
    ) -> None:
        self.name, self.transport = name, transport
        self.interval, self.lost_after = interval, lost_after
        self.lost: str | None = None
        self.last_answer = time.monotonic()
        self.stopped = threading.Event()
        for target, what in ((self._ping, "ping"), (self._watch, "watch")):
            threading.Thread(target=target, daemon=True, name=f"pdboot-{what}-{name}").start()

    def _ping(self) -> None:
        while not self.stopped.is_set() and self.transport.is_active():
            try:
                self.transport.global_request("keepalive@openssh.com", wait=True)
            except Exception:  # the transport died: _watch or the caller sees it
                return
            self.last_answer = time.monotonic()
            self.stopped.wait(self.interval)

    def _watch(self) -> None:
        while not self.stopped.wait(1.0):
            if not self.transport.is_active():
                return
            silent = time.monotonic() - self.last_answer
            if silent > self.lost_after:
                self.lost = (
                    f"no answer for {silent:.0f}s (SSH keepalives unanswered: "
                    "network link down, or the host hung or off)"
                )
                log.info("%s: %s", self.name, self.lost)
                self.transport.close()
                return

    def stop(self) -> None:
        self.stopped.set()


class SSHConnection(_Base):
    def __init__(
        self,
        name: str,
        address: str,
        settings: SSHSettings,
        *,
        accept_new_host_keys: bool = False,
        masker: Masker = SECRETS,
    ) -> None:
        self.name = name
        self.masker = masker
        self.command_timeout = settings.command_timeout
        overrides: dict[str, Any] = {"load_ssh_configs": settings.use_ssh_config}
        cfg = FabricConfig(overrides=overrides)
        connect_kwargs: dict[str, Any] = {}
        if settings.identity_file:
            connect_kwargs["key_filename"] = [os.path.expanduser(settings.identity_file)]
        self._conn = FabricConnection(
            address,
            user=settings.user,
            port=settings.port,
            config=cfg,
            connect_timeout=int(max(1, settings.connect_timeout)),
            connect_kwargs=connect_kwargs,
        )
        ssh_cfg_known = self._conn.ssh_config.get("userknownhostsfile")
        known = settings.known_hosts or (ssh_cfg_known.split()[0] if ssh_cfg_known else None)
        self.known_hosts = os.path.expanduser(known or "~/.ssh/known_hosts")
        if accept_new_host_keys and sshdeadline.discarding_known_hosts(self.known_hosts):
            # every run would see every key as new and trust it: no host key check at all
            where = "ssh.known_hosts" if settings.known_hosts else "UserKnownHostsFile (ssh_config)"
            raise RemoteError(
                name,
                "host_key",
                f"--accept-new-host-keys with {where} {self.known_hosts}: keys written there "
                "are forgotten, so any key would be trusted on every run",
                "point ssh.known_hosts (or UserKnownHostsFile) at a real file, e.g. "
                "~/.ssh/known_hosts, or drop --accept-new-host-keys",
            )
        # every ProxyJump hop gets the target's connect, banner, auth and channel timeouts
        sshdeadline.apply_timeouts(self._conn, settings.connect_timeout)
        # The target and every ProxyJump hop fabric built from ~/.ssh/config: each hop's
        # client would otherwise keep fabric's AutoAddPolicy.
        hop: Any = self._conn
        while isinstance(hop, FabricConnection):
            _strict(hop.client, self.known_hosts, accept_new_host_keys)
            hop = hop.gateway
        self.connect_timeout = settings.connect_timeout
        self.keepalive_interval = KEEPALIVE_INTERVAL
        self.lost_after = LOST_AFTER
        self._watchdog: _Watchdog | None = None

    @property
    def lost(self) -> str | None:
        """Why the host counts as lost mid-run (None while it answers)."""
        return self._watchdog.lost if self._watchdog else None

    def check_lost(self) -> None:
        if self.lost:
            raise HostLost(self.name, self.lost)

    def open(self) -> None:
        # A lost host is not reconnected behind the caller's back: its connect would wait
        # for the connect timeout again on every call.
        self.check_lost()
        hops = len(sshdeadline.hop_chain(self._conn))
        deadline = sshdeadline.overall_deadline(self.connect_timeout, hops)
        try:
            sshdeadline.open_with_deadline(self._conn, deadline, self.name)
        except Exception as e:  # classified: every cause becomes a reported RemoteError
            self.close()
            kh_name = known_hosts_name(self._conn.host, self._conn.port)
            raise classify(e, self.name, known_hosts=self.known_hosts, kh_name=kh_name) from e
        transport = self._conn.client.get_transport()
        if transport is not None and (
            self._watchdog is None or self._watchdog.transport is not transport
        ):
            transport.channel_timeout = CHANNEL_OPEN_TIMEOUT
            self._watchdog = _Watchdog(
                self.name, transport, self.keepalive_interval, self.lost_after
            )

    def _exec(self, line: str, timeout: float, stdin: str | None) -> CommandResult:
        self.open()
        try:
            return self._exec_open(line, timeout, stdin)
        except RemoteError as e:
            if self.lost and not isinstance(e, HostLost):
                raise HostLost(self.name, self.lost) from e
            raise

    def _exec_open(self, line: str, timeout: float, stdin: str | None) -> CommandResult:
        t0 = time.monotonic()
        deadline = t0 + timeout
        transport = self._conn.client.get_transport()
        if transport is None or not transport.is_active():
            self.check_lost()
            raise RemoteError(self.name, "unreachable", "the SSH connection was closed")
        try:
            chan = transport.open_session(timeout=min(self.connect_timeout, timeout) + 5)
        except Exception as e:
            raise classify(e, self.name) from e
        out: list[bytes] = []
        err: list[bytes] = []
        try:
            chan.exec_command(line)
            if stdin:
                chan.sendall(stdin.encode())
            send_eof(chan)  # so `cat` and friends finish
            while True:
                while chan.recv_ready():
                    out.append(chan.recv(65536))
                while chan.recv_stderr_ready():
                    err.append(chan.recv_stderr(65536))
                # Data arrives before the exit status on the same channel, so once the
                # status is in and the buffers are drained, we have everything.
                if (
                    chan.exit_status_ready()
                    and not chan.recv_ready()
                    and not chan.recv_stderr_ready()
                ):
                    break
                if chan.closed and not chan.exit_status_ready():
                    # the transport died (e.g. closed by the watchdog): no status will come
                    raise RemoteError(
                        self.name, "unreachable", "the SSH connection closed during the command"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RemoteError(
                        self.name, "timeout", f"command did not finish within {timeout:g}s"
                    )
                select.select([chan], [], [], min(left, 0.2))
            rc = chan.recv_exit_status()
        except RemoteError:
            raise
        except Exception as e:
            raise classify(e, self.name) from e
        finally:
            chan.close()
        return CommandResult(
            rc,
            b"".join(out).decode(errors="replace"),
            b"".join(err).decode(errors="replace"),
            time.monotonic() - t0,
        )

    def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
        try:
            self._conn.close()
        except Exception:  # closing a half-open connection must not mask the real error
            log.debug("close of %s failed", self.name, exc_info=True)


def send_eof(chan: paramiko.Channel) -> None:
    """``chan.shutdown_write()`` without its race, which costs the whole SSH connection.

    Paramiko marks EOF as sent under the channel's lock but puts it on the wire after
    releasing it. A command that exits meanwhile (``rm -f``, ``true``: it does not wait
    for our EOF) makes sshd send its CLOSE; paramiko's transport thread answers with
    CLOSE alone (EOF counts as sent), sshd frees the channel, and our late EOF then
    names a channel that no longer exists: sshd disconnects ("ieof packet referred to
    nonexistent channel") and every other channel on the connection dies, among them
    the docker SDK's ``dial-stdio`` channels ("Connection aborted",
    RemoteDisconnected). Likely when threads contend for the GIL on a busy machine,
    e.g. `down` removing the token file while it stops containers. Holding the lock
    until the EOF is sent keeps it ahead of our CLOSE. (During a key re-exchange the
    send waits, at most paramiko's clear_to_send_timeout, with the lock held.)"""
    with chan.lock:
        msg = chan._send_eof()
        if msg is not None:
            chan.transport._send_user_message(msg)


def effective_ssh(defaults: SSHSettings, host: Host) -> SSHSettings:
    """The inventory's SSH defaults with the host's overrides applied."""
    over = {k: v for k, v in host.ssh.model_dump().items() if v is not None}
    return defaults.model_copy(update=over)


def connect(
    name: str,
    host: Host,
    defaults: SSHSettings,
    *,
    accept_new_host_keys: bool = False,
    masker: Masker = SECRETS,
) -> Connection:
    """An open connection to one inventory host. Raises RemoteError with the cause."""
    settings = effective_ssh(defaults, host)
    if host.address == LOCAL:
        return LocalConnection(name, settings.command_timeout, masker)
    conn = SSHConnection(
        name, host.address, settings, accept_new_host_keys=accept_new_host_keys, masker=masker
    )
    conn.open()
    return conn


# --------------------------------------------------------------------------- fan-out

K = TypeVar("K")
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Outcome(Generic[R]):
    value: R | None = None
    error: RemoteError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def fan_out(
    items: Mapping[str, T] | Iterable[tuple[str, T]],
    fn: Callable[[str, T], R],
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Outcome[R]]:
    """Run ``fn(name, item)`` for every item in parallel; wait at most ``deadline`` seconds.

    Each result is an Outcome: the value, or the RemoteError (any other exception is
    classified). Items still running at the deadline are reported as timeouts; their
    daemon threads are abandoned, never joined, so they cannot hang the caller.
    """
    pairs = list(items.items()) if isinstance(items, Mapping) else list(items)
    results: dict[str, Outcome[R]] = {}
    done = threading.Condition()

    def work(name: str, item: T) -> None:
        try:
            outcome: Outcome[R] = Outcome(value=fn(name, item))
        except BaseException as e:  # reported per host, never fatal to the others
            outcome = Outcome(error=classify(e, name))
        with done:
            results[name] = outcome
            done.notify_all()

    for name, item in pairs:
        threading.Thread(target=work, args=(name, item), daemon=True, name=f"pdboot-{name}").start()
    end = clock() + deadline
    with done:
        while len(results) < len(pairs):
            left = end - clock()
            if left <= 0:
                break
            done.wait(min(left, 0.5))
        final = dict(results)
    for name, _ in pairs:
        if name not in final:
            final[name] = Outcome(
                error=RemoteError(name, "timeout", f"no answer within {deadline:g}s")
            )
    return {name: final[name] for name, _ in pairs}
