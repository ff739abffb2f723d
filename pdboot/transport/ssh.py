"""SSH connections: the only module that imports fabric.

One connection per host, opened once and reused for every command. SSH hosts go through
fabric (so ``~/.ssh/config`` is honoured) with strict host-key checking
(``pdboot.transport.known_hosts``); keepalives that sshd must answer notice a silent peer.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from typing import Any

import paramiko
from fabric import Config as FabricConfig
from fabric import Connection as FabricConnection

from pdboot.inventory.schema import LOCAL, Host, SSHSettings
from pdboot.transport import sshdeadline
from pdboot.transport.connection import (
    BaseConnection,
    CommandResult,
    Connection,
    HostLost,
    LocalConnection,
    RemoteError,
    effective_ssh,
)
from pdboot.transport.known_hosts import _strict, classify, known_hosts_name
from pdboot.transport.masking import SECRETS, Masker

log = logging.getLogger(__name__)

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"  # where ssh.known_hosts is unset


# A silent peer (link down: no reset, packets just stop) is noticed by unanswered
# keepalives. paramiko's own Transport.set_keepalive sends requests without wanting a
# reply, so it can never notice silence; TCP alone notices only after its retransmissions
# give up (minutes). These are requests that sshd must answer (with a failure: it does not
# know the name), so an answer proves the peer and the path are alive.
# One every 3 s, the host lost after 4 unanswered (12 s).
KEEPALIVE_INTERVAL = 3.0
LOST_AFTER = 4 * KEEPALIVE_INTERVAL
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
        self._verdict = threading.Lock()
        for target, what in ((self._ping, "ping"), (self._watch, "watch")):
            threading.Thread(target=target, daemon=True, name=f"pdboot-{what}-{name}").start()

    def _ping(self) -> None:
        # Both threads judge the silence before they count an answer: after a pause of the
        # whole process (SIGSTOP, a starved machine) the first to run sees the gap, so the
        # verdict does not depend on which thread the scheduler wakes first.
        while not self.stopped.is_set() and self.transport.is_active():
            if self._silent_too_long():
                return
            try:
                self.transport.global_request("keepalive@openssh.com", wait=True)
            except Exception:  # the transport died: _watch or the caller sees it
                return
            if self._silent_too_long():  # an answer that took past the limit is none
                return
            self.last_answer = time.monotonic()
            self.stopped.wait(self.interval)

    def _watch(self) -> None:
        while not self.stopped.wait(1.0):
            if not self.transport.is_active() or self._silent_too_long():
                return

    def _silent_too_long(self) -> bool:
        """True (and the transport closed, the reason in ``lost``) when the last answer is
        older than ``lost_after``."""
        silent = time.monotonic() - self.last_answer
        if silent <= self.lost_after:
            return False
        with self._verdict:
            if self.lost is None:
                self.lost = (
                    f"no answer for {silent:.0f}s (SSH keepalives unanswered: "
                    "network link down, or the host hung or off)"
                )
                log.info("%s: %s", self.name, self.lost)
        self.transport.close()
        return True

    def stop(self) -> None:
        self.stopped.set()


class SSHConnection(BaseConnection):
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
        self.known_hosts = os.path.expanduser(known or DEFAULT_KNOWN_HOSTS)
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
            kh_name = known_hosts_name(hop.host, hop.port)
            _strict(hop.client, self.known_hosts, accept_new_host_keys, kh_name)
            hop = hop.gateway
        self.connect_timeout = settings.connect_timeout
        self.keepalive_interval = KEEPALIVE_INTERVAL
        self.lost_after = LOST_AFTER
        self._watchdog: _Watchdog | None = None

    @property
    def lost(self) -> str | None:
        """Why the host counts as lost mid-run (None while it answers)."""
        return self._watchdog.lost if self._watchdog else None

    def ssh_client(self) -> paramiko.SSHClient | None:
        """The verified paramiko client, for tunnels that open their own channels on it
        (the docker SDK's, docker_sdk.py); None while it has no live transport."""
        client = self._conn.client
        return client if client.get_transport() is not None else None

    def live_transport(self) -> paramiko.Transport:
        """The transport for channels of pdboot's own (the docker SDK's, a port forward),
        opened again when the peer closed it and the host does not count as lost: a
        transport kept from the first connect stays dead after a reconnect (seen in CI as
        "Socket is closed" on the next docker call). Raises RemoteError (HostLost for a
        lost host) when there is none."""
        transport = self._conn.client.get_transport()
        if transport is None or not transport.is_active():
            self.open()
            transport = self._conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise RemoteError(self.name, "unreachable", "the SSH connection was closed")
        return transport

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
        try:
            chan.exec_command(line)
            if not stdin or _send_input(chan, stdin.encode()):
                send_eof(chan)  # so `cat` and friends finish
            out, err = collect_output(chan, deadline, self.name, timeout)
            rc = chan.recv_exit_status()
        except RemoteError:
            raise
        except Exception as e:
            raise classify(e, self.name) from e
        finally:
            chan.close()
        return CommandResult(
            rc, out.decode(errors="replace"), err.decode(errors="replace"), time.monotonic() - t0
        )

    def reconnect(self) -> bool:
        """After the watchdog closed the transport (issue 32, item 10: on a starved machine
        it fires on hosts that are alive): one fresh connect, under the usual deadline.
        True when the host answers again (a new transport and watchdog), False when it does
        not: then it stays lost, with the watchdog's reason, and the caller fails fast."""
        was = self._watchdog
        if was is None or was.lost is None:
            return False
        self._watchdog = None
        try:
            self._conn.close()
        except Exception:  # a dead transport's close may fail; the connect below decides
            log.debug("close of %s before reconnecting failed", self.name, exc_info=True)
        try:
            self.open()
        except RemoteError:
            self._watchdog = was  # still lost, for the same reason
            return False
        log.info("%s: reconnected after %s", self.name, was.lost)
        return True

    def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
        try:
            self._conn.close()
        except Exception:  # closing a half-open connection must not mask the real error
            log.debug("close of %s failed", self.name, exc_info=True)


def _send_input(chan: paramiko.Channel, data: bytes) -> bool:
    """The command's stdin. A command may exit without reading it (ship's script refusing a
    project path pdboot did not create, before its `cat`): sshd then closes the channel and
    paramiko's send raises "Socket is closed", which hid the command's own message (seen in
    the 128 KiB ship test under load). Its exit status and output still arrive: the read
    loop takes them; a channel closed with no status is still an error there. False: the
    channel is closed, so no EOF may follow (send_eof: a late EOF costs the connection)."""
    try:
        chan.sendall(data)
    except OSError:
        if not chan.closed:
            raise
        return False
    return True


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


# How long to wait for sshd's EOF once the exit status is in and no more data comes:
# only a command that leaves a background process holding its stdout ever needs it.
EOF_GRACE_S = 10.0


def collect_output(
    chan: paramiko.Channel, deadline: float, name: str, timeout: float
) -> tuple[bytes, bytes]:
    """A command's stdout and stderr, read until sshd's EOF.

    The exit status is no end-of-data mark: sshd sends it when it reaps the command, while
    the command's last output may still sit in the pipe between them; the EOF comes once
    that pipe is read to its end. Stopping at the status lost the tail of large outputs on
    a loaded machine (preflight's report, whose last sections came back empty)."""
    out: list[bytes] = []
    err: list[bytes] = []
    quiet_since: float | None = None  # the status is in; no data came since then
    while True:
        got = False
        while chan.recv_ready():
            out.append(chan.recv(65536))
            got = True
        while chan.recv_stderr_ready():
            err.append(chan.recv_stderr(65536))
            got = True
        now = time.monotonic()
        if _transport_died(chan):
            raise RemoteError(name, "unreachable", "the SSH connection closed during the command")
        if chan.exit_status_ready():
            if chan.eof_received or chan.closed:
                if not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                continue
            if got or quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= EOF_GRACE_S:
                break
        if deadline - now <= 0:
            raise RemoteError(name, "timeout", f"command did not finish within {timeout:g}s")
        select.select([chan], [], [], min(deadline - now, 0.2))
    return b"".join(out), b"".join(err)


def _transport_died(chan: paramiko.Channel) -> bool:
    """The channel closed with no exit status because its transport died (the watchdog
    closed it, or the peer). paramiko counts a closed channel's status as ready, with -1:
    taken as the command's, a heartbeat cut off this way read as "another run took the lock
    over" (CI). A channel sshd closed without a status on a live transport (a command killed
    by a signal) is not this: its -1 is the caller's to read."""
    return bool(chan.closed and chan.exit_status == -1 and not chan.get_transport().is_active())


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
