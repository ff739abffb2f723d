"""collect_output reads a command's output until sshd's EOF, not until its exit status
(which sshd sends when it reaps the command, possibly before the pipe is read to its end).

The channel here is a script of what paramiko's Channel shows at each poll: the loop's
decisions are what is tested; the wire is tested against a real sshd in
tests/e2e/test_ssh_channels.py."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest

from pdboot.transport import ssh
from pdboot.transport.connection import RemoteError


@dataclass
class Poll:
    """What arrived by one poll of the loop."""

    out: bytes = b""
    err: bytes = b""
    status: bool = False
    eof: bool = False
    closed: bool = False
    transport_died: bool = False  # with closed: the connection ended, not the command


@dataclass
class ScriptedChannel:
    polls: list[Poll]
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    status: bool = False
    eof_received: bool = False
    closed: bool = False
    exit_status: int = -1  # paramiko's value until a status arrives
    active: bool = True  # the transport's

    def __post_init__(self) -> None:
        # select() on it returns at once: a pipe with a byte that is never read
        self._r, w = os.pipe()
        os.write(w, b"x")
        os.close(w)
        self._advance()

    def _advance(self) -> None:
        if not self.polls:
            return
        p = self.polls.pop(0)
        self.out += p.out
        self.err += p.err
        self.status |= p.status
        if p.status:
            self.exit_status = 0
        self.eof_received |= p.eof
        self.closed |= p.closed
        self.active &= not p.transport_died

    def fileno(self) -> int:
        self._advance()  # each wait of the loop lets the next poll's events arrive
        return self._r

    def recv_ready(self) -> bool:
        return bool(self.out)

    def recv_stderr_ready(self) -> bool:
        return bool(self.err)

    def recv(self, n: int) -> bytes:
        got, self.out[:] = bytes(self.out[:n]), self.out[n:]
        return got

    def recv_stderr(self, n: int) -> bytes:
        got, self.err[:] = bytes(self.err[:n]), self.err[n:]
        return got

    def exit_status_ready(self) -> bool:
        return self.status or self.closed  # as paramiko: closed counts as ready

    def get_transport(self) -> ScriptedChannel:
        return self

    def is_active(self) -> bool:
        return self.active


def collect(polls: list[Poll], timeout: float = 30.0) -> tuple[bytes, bytes]:
    chan = ScriptedChannel(polls)
    try:
        return ssh.collect_output(chan, ssh.time.monotonic() + timeout, "h1", timeout)  # type: ignore[arg-type]
    finally:
        os.close(chan._r)


def test_output_after_the_exit_status_is_read_up_to_the_eof() -> None:
    got = collect(
        [
            Poll(out=b"### head\n", status=True),
            Poll(),
            Poll(out=b"the report's tail\n"),
            Poll(err=b"a warning\n", eof=True),
        ]
    )
    assert got == (b"### head\nthe report's tail\n", b"a warning\n")


def test_data_buffered_with_the_eof_is_drained_before_returning() -> None:
    assert collect([Poll(status=True), Poll(out=b"all at once\n", eof=True)]) == (
        b"all at once\n",
        b"",
    )


def test_a_closed_channel_with_its_status_ends_the_read() -> None:
    assert collect([Poll(out=b"x", status=True, closed=True)]) == (b"x", b"")


def test_a_background_process_holding_stdout_costs_the_grace_not_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ssh, "EOF_GRACE_S", 0.05)
    quiet = [Poll() for _ in range(10_000)]  # no EOF ever comes
    t0 = ssh.time.monotonic()
    got = collect([Poll(out=b"started\n", status=True), *quiet], timeout=30.0)
    assert got == (b"started\n", b"")
    assert ssh.time.monotonic() - t0 < 10


def test_a_channel_closed_without_a_status_is_a_lost_connection() -> None:
    """The watchdog closed the transport mid-command: no status came (rc -1 before)."""
    with pytest.raises(RemoteError) as e:
        collect([Poll(out=b"half"), Poll(closed=True, transport_died=True)])
    assert e.value.kind == "unreachable"


def test_a_status_that_came_before_the_connection_died_stands() -> None:
    assert collect(
        [Poll(out=b"done", status=True, eof=True, closed=True, transport_died=True)]
    ) == (
        b"done",
        b"",
    )


def test_a_command_killed_by_a_signal_on_a_live_connection_is_no_lost_host() -> None:
    """sshd sends exit-signal, which paramiko does not read: closed, no status, the
    connection fine. Its output comes back; the caller reads rc -1."""
    assert collect([Poll(out=b"partial"), Poll(eof=True, closed=True)]) == (b"partial", b"")


def test_no_status_by_the_deadline_is_a_timeout() -> None:
    with pytest.raises(RemoteError) as e:
        collect([Poll() for _ in range(10_000)], timeout=0.05)
    assert e.value.kind == "timeout"
