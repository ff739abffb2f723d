"""The holder's side of the deployment lock (transport/lock.py): the heartbeat, and
knowing when the lock is lost.

A heartbeat thread touches the owner file every ``HEARTBEAT_S`` seconds. The lock counts
as lost, once and for good, when a heartbeat finds another run's owner file, or when no
heartbeat was confirmed for ``LOST_AFTER_S``: a link flap, after which other runs may take
the lock over (``STALE_AFTER_S`` after the last beat, on the host's clock). The heartbeat
reopens its connection after a failure (a watchdog-closed SSH connection never reopens
itself) and beats again at once. ``lost_reason`` is what the orchestrators check before
every further step (through the cancellation token of deploy/frame.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from pdboot.transport.connection import Connection, RemoteError

log = logging.getLogger(__name__)

HEARTBEAT_S = 10.0
STALE_AFTER_S = 3 * HEARTBEAT_S
POLL_S = 2.0

# The holder gives the lock up as lost this long after its last confirmed heartbeat: a
# heartbeat period before anyone else may judge it stale (STALE_AFTER_S).
LOST_AFTER_S = STALE_AFTER_S - HEARTBEAT_S
BEAT_TIMEOUT_S = 5.0  # one heartbeat command; after a failure the next comes POLL_S later


class LockLost(Exception):
    """This run held the lock and no longer does (or can no longer prove it does)."""


class _Owner(Protocol):
    @property
    def run_id(self) -> str: ...


class HeldLock:
    """A lock this run holds: the heartbeat runs until ``release``; ``lost_reason`` says
    (once and for good) when the lock can no longer be counted as this run's."""

    def __init__(
        self,
        conn: Connection,
        path: str,
        owner: _Owner,
        host: str,
        *,
        beat_script: str,
        release_script: str,
        reconnect: Callable[[], Connection] | None = None,
        clock: Callable[[], float] = time.monotonic,
        interval: float = HEARTBEAT_S,
        lost_after: float = LOST_AFTER_S,
    ) -> None:
        self.conn, self.path, self.owner, self.host = conn, path, owner, host
        # the scripts (transport/lock.py): touch the owner file / remove the lock, if ours
        self.beat_script, self.release_script = beat_script, release_script
        self.close_conn = False  # set by take(): the connection is the lock's own
        self.reconnect = reconnect
        self.clock, self.interval, self.lost_after = clock, interval, lost_after
        self._mu = threading.Lock()
        self._lost: str | None = None
        self.last_beat = clock()  # the last time the lock was confirmed ours
        self.reconnects = 0
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True, name="pdboot-lock")
        self._beat.start()

    @property
    def lost(self) -> bool:
        return self.lost_reason is not None

    @property
    def lost_reason(self) -> str | None:
        """Why the lock is no longer this run's; None while it is."""
        with self._mu:
            silent = self.clock() - self.last_beat
            if self._lost is None and silent > self.lost_after:
                self._lost = (
                    f"no heartbeat reached {self.host} for {silent:.0f}s (its link or sshd "
                    f"is down?); after {STALE_AFTER_S:.0f}s another run may take the lock over"
                )
            return self._lost

    def check(self) -> None:
        why = self.lost_reason
        if why is not None:
            raise LockLost(f"the deployment lock on {self.host} ({self.path}) was lost: {why}")

    def _mark_lost(self, why: str) -> None:
        with self._mu:
            if self._lost is None:
                self._lost = why
        log.warning("the deployment lock on %s is lost: %s", self.host, why)

    def beat_once(self, *, retry: bool = True) -> bool:
        """One heartbeat; True when it confirmed the lock (tests call it directly). After
        a failure the connection is reopened and, if that worked, the beat tried again."""
        if self.lost_reason is not None:
            return False
        try:
            res = self.conn.run(self.beat_script, timeout=BEAT_TIMEOUT_S)
        except RemoteError as e:
            log.warning("lock heartbeat on %s failed: %s", self.host, e.message)
            return self._reopen() and retry and self.beat_once(retry=False)
        if res.rc != 0:
            self._mark_lost(
                f"{self.path} no longer names run {self.owner.run_id}: another run took it over"
            )
            return False
        with self._mu:
            if self._lost is None and self.clock() - self.last_beat <= self.lost_after:
                self.last_beat = self.clock()
                return True
        return False

    def _reopen(self) -> bool:
        """A fresh connection for the next beat (the old one may have been closed by its
        watchdog, which never reconnects). True when one is in place."""
        if self.reconnect is None:
            return False
        try:
            fresh = self.reconnect()
        except Exception as e:  # next beat tries again; the deadline decides
            log.warning("cannot reconnect to %s for the lock heartbeat: %s", self.host, e)
            return False
        old, self.conn = self.conn, fresh
        self.reconnects += 1
        try:
            old.close()
        except Exception:  # a dead connection's close may fail; the fresh one is in place
            log.debug("close of the old lock connection failed", exc_info=True)
        return True

    def _heartbeat(self) -> None:
        wait = self.interval
        while not self._stop.wait(wait):
            if self.lost_reason is not None:
                return
            wait = self.interval if self.beat_once() else POLL_S

    def release(self) -> None:
        """Remove the lock if it is still ours. Never raises: a failed release leaves a
        lock that the next run sees go stale."""
        self._stop.set()
        try:
            self.conn.run(self.release_script, timeout=10)
        except Exception as e:  # the run's own outcome matters more than the lock's
            log.warning("cannot release the deployment lock on %s: %s", self.host, e)
        if self.close_conn:
            self.conn.close()
