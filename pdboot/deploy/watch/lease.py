"""watch acts on the deployment only while it holds the deployment lock that `up`, `down` and
`stage` take (transport/lock.py): each round that may change something (a restart, an
eviction or re-admission, a worker list repaired, the standby's list brought in step) takes
the lock without waiting, as `pdboot watch`, and gives it back at the round's end.

So `up` never has an engine restarted or a worker removed under it: while it holds the lock,
watch reads /health only and says so (a ``watch_held`` event), and an `up` that starts while
watch acts waits for the round to end, as it waits for any holder. A crashed `up` blocks
watch no longer than the lock's own staleness rule (``STALE_AFTER_S`` after its last
heartbeat): watch then takes the stale lock over, as `up` would. Rounds held back leave
watch's counts as they were: faults seen while `up` replaces engines are not counted
against them.

``LockLease`` is the lock on the router host over SSH: the foreground watch. The watch
service beside the router has no lease yet (the lock's directory sits beside every project's
secrets on that host, which its container is not given): `up` stops it while it runs
(deploy/all_hosts.py, watch_held_back) and `down` removes it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from pdboot.inventory.schema import Inventory
from pdboot.transport import lock
from pdboot.transport.connection import Connection, RemoteError
from pdboot.transport.lock_holder import HeldLock
from pdboot.transport.ssh import connect

log = logging.getLogger(__name__)
OPERATION = "watch"  # the lock's owner file names it: a waiting `up` says who holds it


class Lease(Protocol):
    """What watch needs of the deployment lock."""

    def take(self) -> str | None:
        """None: watch holds the deployment until ``release``; else who holds it instead
        (or why the lock could not be asked)."""
        ...

    def lost(self) -> str | None:
        """Why the lease taken is no longer watch's (its heartbeat failed); None while it is."""
        ...

    def release(self) -> None: ...

    def close(self) -> None: ...


class LockLease:
    """The deployment lock (transport/lock.py), taken with no wait for one round."""

    def __init__(
        self,
        path: str,
        host: str,
        open_conn: Callable[[], Connection],
        say: Callable[[str], None] = log.warning,
    ) -> None:
        """``open_conn``: a fresh connection to the lock's host (the lease keeps one open
        between rounds and reopens it after a failure)."""
        self.path, self.host, self.open_conn, self.say = path, host, open_conn, say
        self._conn: Connection | None = None
        self._held: HeldLock | None = None

    def take(self) -> str | None:
        if self._held is not None:
            return None
        try:
            if self._conn is None:
                self._conn = self.open_conn()
            self._held = lock.acquire(
                self._conn,
                self.path,
                OPERATION,
                wait=False,
                say=self.say,
                reconnect=self.open_conn,
            )
        except lock.LockBusy as e:
            return held_by(str(e))
        except RemoteError as e:
            self._drop_conn()
            return f"the deployment lock on {self.host} cannot be read ({e.message})"
        return None

    def lost(self) -> str | None:
        return self._held.lost_reason if self._held is not None else None

    def release(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.release()
            self._conn = held.conn  # the heartbeat may have reopened it

    def close(self) -> None:
        self.release()
        self._drop_conn()

    def _drop_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # a dead connection's close may fail; nothing is left to do
                log.debug("close of the lease's connection failed", exc_info=True)


def held_by(busy: str) -> str:
    """LockBusy's text without the advice meant for `up --no-wait`."""
    return busy.removesuffix(" (--no-wait: not waiting)")


def ssh_lease(inv: Inventory, accept_new: bool, say: Callable[[str], None]) -> LockLease:
    """The foreground watch's lease: the lock on the router host, over SSH as `up` takes it."""
    host = inv.router.host

    def open_conn() -> Connection:
        return connect(host, inv.hosts[host], inv.ssh, accept_new_host_keys=accept_new)

    return LockLease(lock.lock_dir(inv.remote_dir, inv.name), host, open_conn, say)
