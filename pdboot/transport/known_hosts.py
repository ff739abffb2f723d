"""Host keys: known_hosts parsing (hashed names, ``@revoked``, ``@cert-authority``), the strict
host-key policy that replaces fabric's auto-accept, and the classification of connect errors
into what an operator reads.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko

from pdboot.inventory.localfiles import NotRegularFile, read_regular_file
from pdboot.transport.connection import ErrorKind, RemoteError, connect_timed_out

log = logging.getLogger(__name__)


def fingerprint(key: paramiko.PKey) -> str:
    return str(key.fingerprint)  # "SHA256:..." like ssh-keygen -l


def known_hosts_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


# paramiko's transport thread logs a failed handshake (a port that answers HTTP, say) at
# ERROR with a traceback on its logger. With no handler anywhere, Python's last-resort
# handler printed that on stderr before pdboot's own report; pdboot reports every SSH
# error itself (classify, below), so paramiko's records go nowhere unless a program
# configures logging on purpose.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


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
    cert_authority_lines: list[int] = field(default_factory=list)  # also in skipped

    @property
    def has_cert_authority(self) -> bool:
        return bool(self.cert_authority_lines)


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
                kh.cert_authority_lines.append(lineno)
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


# path -> (the file's identity and size when parsed, what it held): every connect of a run
# reads the same file, and each line is a key object to build (a fleet's known_hosts of a
# few hundred lines cost ~20 ms per host, per connect).
_PARSED: dict[str, tuple[tuple[int, int, int, int], KnownHosts]] = {}
_PARSED_LOCK = threading.Lock()


def load_known_hosts(path: str) -> KnownHosts:
    """The file's keys, parsed once while it stays the same file with the same size and
    modification time (accept-new's appended line changes both: it is read again)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return KnownHosts()
    except OSError:
        st = None
    sig = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) if st else None
    if sig is not None and st is not None and stat.S_ISREG(st.st_mode):
        with _PARSED_LOCK:
            hit = _PARSED.get(path)
        if hit is not None and hit[0] == sig:
            return hit[1]
    kh = _read_known_hosts(path)
    if sig is not None:
        with _PARSED_LOCK:
            _PARSED[path] = (sig, kh)
    return kh


def _read_known_hosts(path: str) -> KnownHosts:
    try:
        # stat first: a FIFO would block the open (and /dev/null holds no key anyway)
        raw = read_regular_file(Path(path), 16 << 20)
    except FileNotFoundError:
        return KnownHosts()
    except NotRegularFile:
        log.warning("%s is not a regular file: no host key is known from it", path)
        return KnownHosts()
    text = raw.decode("utf-8", errors="replace")
    kh = parse_known_hosts(text)
    for lineno, why in kh.skipped:
        log.warning("%s:%d: line skipped: %s", path, lineno, why)
    return kh


def _strict(
    client: paramiko.SSHClient, known_hosts: str, accept_new: bool, name: str | None = None
) -> None:
    """The client checks host keys against ``known_hosts`` alone. ``name``: the host as
    paramiko looks it up (known_hosts_name): only its own lines and the hashed ones go into
    the client (paramiko matches no patterns, and its add is linear in the keys already
    there: every key of a large file into every client was quadratic per connect)."""
    kh = load_known_hosts(known_hosts)
    # Into the client's host keys (not load_host_keys: nothing is remembered to save
    # back, so accept-new appends a line instead of rewriting the operator's file).
    # A revoked key is left out even if a plain line lists it too, so the policy sees it.
    keys = client.get_host_keys()
    for entry, key in kh.keys:
        if name is not None and entry != name and not entry.startswith("|1|"):
            continue
        if not is_revoked(kh, key):
            keys.add(entry, key.get_name(), key)
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
        return connect_timed_out(host, str(exc))
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
        if "protocol banner" in str(exc) and isinstance(exc.__context__, EOFError):
            return _not_ssh(host, kh_name)
        return _ssh_exception(str(exc), host)
    return RemoteError(host, "error", f"{type(exc).__name__}: {exc}")


def _not_ssh(host: str, kh_name: str) -> RemoteError:
    """The peer took the connection, sent no SSH banner and closed it (paramiko's banner
    read ended in EOF): another service (an HTTP server, a proxy) listens on that port.
    Not "unreachable": the address answers, the port is wrong."""
    addr, port = split_known_hosts_name(kh_name) if kh_name else ("", None)
    where = f"{addr} port {port or 22}" if addr else "the SSH port"
    return RemoteError(
        host,
        "error",
        f"{where} answers, but not with SSH: the peer closed the connection without an SSH "
        "banner (another service listens there)",
        "check ssh.port (or this host's ssh.port) and that sshd listens on that port",
    )


def _ssh_exception(text: str, host: str) -> RemoteError:
    """paramiko's SSHException, by its text (it has no finer classes for these)."""
    if "authentication" in text.lower():
        return RemoteError(
            host,
            "auth",
            f"authentication impossible: {text}",
            "set ssh.identity_file (or IdentityFile in ~/.ssh/config) for this host",
        )
    if text == "No existing session":
        # paramiko's transport died in the handshake (a silent peer past the banner
        # timeout) but the race left its cause unsaved: say what it means
        return RemoteError(
            host,
            "timeout",
            "the SSH handshake did not complete (no SSH banner in time, or the peer "
            "closed the connection)",
            "check that sshd answers on this port, or raise ssh.connect_timeout",
        )
    kind: ErrorKind = "timeout" if "banner" in text.lower() else "error"
    return RemoteError(host, kind, f"SSH error: {text}", "check that sshd answers on this port")
