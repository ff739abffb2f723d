"""Racing takers of pdboot's deployment lock, released at once: the unit test (a local
directory) and the e2e test (a testbed host over SSH) both ask that exactly one wins."""

from __future__ import annotations

import threading
from collections.abc import Callable

from pdboot.transport import lock, lock_holder


def race_for_lock(
    take: Callable[[], lock_holder.HeldLock], racers: int = 4, join_seconds: float = 60
) -> tuple[list[lock_holder.HeldLock], list[str]]:
    """``racers`` threads call ``take`` together; the locks they got, and the LockBusy
    messages of those that did not."""
    won: list[lock_holder.HeldLock] = []
    busy: list[str] = []
    go = threading.Event()

    def run() -> None:
        go.wait()
        try:
            won.append(take())
        except lock.LockBusy as e:
            busy.append(str(e))

    threads = [threading.Thread(target=run) for _ in range(racers)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(join_seconds)
    return won, busy
