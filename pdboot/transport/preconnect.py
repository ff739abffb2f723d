"""SSH connections opened on threads while the caller still has work to do.

`pdboot preflight` spends its first fraction of a second importing the check modules and
building each host's batch; the SSH handshakes (TCP, key exchange, host key, auth) need
none of that, so they start as soon as the inventory is loaded and overlap it. The
connect runs the same `transport.ssh.connect` as before: its errors reach the caller
unchanged, raised where the connection is taken.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pdboot.inventory.schema import Inventory
    from pdboot.transport.connection import Connection


class Opening:
    """One connect per host, started at once on daemon threads (never joined without
    a bound: `take` waits as long as the caller's own deadline lets it)."""

    def __init__(self, inv: Inventory, names: Iterable[str], *, accept_new_host_keys: bool):
        self._done: dict[str, threading.Event] = {}
        self._conn: dict[str, Connection] = {}
        self._error: dict[str, BaseException] = {}
        self._taken: set[str] = set()
        self._lock = threading.Lock()
        # paramiko and fabric load here, before the threads start: a connect cannot begin
        # without them, while the caller's own imports can wait on the GIL. Imported on the
        # connect threads, they shared the CPU with those imports and every connect began
        # later, on the critical path (issue 35).
        import pdboot.transport.ssh  # noqa: F401

        for name in names:
            self._done[name] = threading.Event()
            threading.Thread(
                target=self._open,
                args=(inv, name, accept_new_host_keys),
                daemon=True,
                name=f"pdboot-connect-{name}",
            ).start()

    def _open(self, inv: Inventory, name: str, accept_new_host_keys: bool) -> None:
        from pdboot.transport.ssh import connect  # loaded by __init__

        try:
            conn = connect(
                name, inv.hosts[name], inv.ssh, accept_new_host_keys=accept_new_host_keys
            )
        except BaseException as e:  # raised again by take(), on the caller's thread
            self._error[name] = e
        else:
            with self._lock:
                self._conn[name] = conn
        self._done[name].set()

    def __contains__(self, name: object) -> bool:
        return name in self._done

    def take(self, name: str) -> Connection:
        """The open connection (the taker closes it), or the connect's own error."""
        self._done[name].wait()
        if name in self._error:
            raise self._error[name]
        with self._lock:
            self._taken.add(name)
            return self._conn[name]

    def close_untaken(self) -> None:
        """Close what nobody took (a usage error after the connects started). A connect
        still under way is left to its daemon thread: the process is ending."""
        with self._lock:
            left = [c for n, c in self._conn.items() if n not in self._taken]
            self._taken.update(self._conn)
        for conn in left:
            conn.close()
