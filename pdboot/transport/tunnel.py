"""A local TCP port that forwards each connection through a ``direct-tcpip`` channel of a
verified SSH connection to an address as the remote host sees it (``ssh -L``, in-process).

pdboot reaches the router's worker API this way: the router listens on its host's loopback
only (plan/proxy.py), so the one way in from the operator's machine is a channel of the SSH
connection pdboot already holds, with its host key checked. The listener binds 127.0.0.1 on
an ephemeral port and lives as long as the command that opened it.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
from typing import Any

CHANNEL_OPEN_TIMEOUT = 10.0
CHUNK = 65536


class _QuietRefusals(logging.Filter):
    """paramiko logs every refused channel open ("Secsh channel N open FAILED") at ERROR;
    a router that does not listen yet is what `up`'s wait polls for, not news."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "open FAILED" not in record.getMessage()


logging.getLogger("paramiko.transport").addFilter(_QuietRefusals())


class Forward:
    """``Forward(transport, "127.0.0.1", 8081)``: ``.port`` on this machine's loopback
    reaches 127.0.0.1:8081 on the SSH server's side."""

    def __init__(self, transport: Any, remote_host: str, remote_port: int) -> None:
        self.transport = transport
        self.remote = (remote_host, remote_port)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port: int = self.sock.getsockname()[1]
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True, name="ssh-forward").start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(
                target=self._pump, args=(client,), daemon=True, name="ssh-forward-conn"
            ).start()

    def _pump(self, client: socket.socket) -> None:
        try:
            chan = self.transport.open_channel(
                "direct-tcpip", self.remote, ("127.0.0.1", 0), timeout=CHANNEL_OPEN_TIMEOUT
            )
        except Exception:  # the remote refused or the link is gone: the HTTP client sees EOF
            client.close()
            return
        try:
            while not self.closed.is_set():
                ready, _, _ = select.select([client, chan], [], [], 1.0)
                if client in ready:
                    data = client.recv(CHUNK)
                    if not data:
                        break
                    chan.sendall(data)
                if chan in ready:
                    data = chan.recv(CHUNK)
                    if not data:
                        break
                    client.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(Exception):
                chan.close()
            client.close()

    def close(self) -> None:
        self.closed.set()
        with contextlib.suppress(OSError):
            self.sock.close()
