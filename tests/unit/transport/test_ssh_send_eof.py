"""send_eof keeps the channel's lock until the EOF is on the wire (see its docstring: a
late EOF after sshd freed the channel made sshd drop the whole connection)."""

from __future__ import annotations

import threading

from pdboot.transport.ssh import send_eof


class _Transport:
    def __init__(self, chan: _Chan) -> None:
        self.chan = chan
        self.sent: list[tuple[str, bool]] = []

    def _send_user_message(self, msg: str) -> None:
        # what paramiko's transport thread would need to answer sshd's CLOSE
        self.sent.append((msg, self.chan.lock.locked()))


class _Chan:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.eof_sent = False
        self.transport = _Transport(self)

    def _send_eof(self) -> str | None:
        if self.eof_sent:
            return None
        self.eof_sent = True
        return "EOF"


def test_eof_is_sent_while_the_channel_lock_is_held_and_only_once() -> None:
    chan = _Chan()
    send_eof(chan)
    send_eof(chan)
    assert chan.transport.sent == [("EOF", True)]
    assert not chan.lock.locked()
