"""Stop a run whose deployment lock is lost, before its next step.

The lock's heartbeat (transport/lock_holder.py) only records that the lock is lost; the run must
notice. Every step of `up` and `down` emits events (a stage starting, each tick of an
engine wait, each host's result), so the orchestrators' ``emit`` is wrapped: while the
lock is lost, an event from the main thread or from a fan-out worker (threads named
``pdboot-*``, whose exceptions are reported per host) raises LockLost instead of being
shown. The run then ends with an error naming the lock, and does nothing further: no
router start, no rollback, no purge, since another run may now own the deployment.
Events from other threads pass (their exceptions would only print a traceback).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from pdboot.deploy.seams import HeldLock
from pdboot.events import Emit, Event, Note
from pdboot.exitcodes import EXIT_FAILED
from pdboot.transport.lock_holder import LockLost


def _may_raise() -> bool:
    t = threading.current_thread()
    return t is threading.main_thread() or t.name.startswith("pdboot-")


def guarded(emit: Emit, held: HeldLock) -> Emit:
    """``emit`` that raises LockLost once ``held`` is lost."""

    def emit_checked(event: Event) -> None:
        why = held.lost_reason
        if why is not None and _may_raise():
            raise LockLost(why)
        emit(event)

    return emit_checked


def stopped_message(host: str, why: str, operation: str) -> str:
    return (
        f"error: the deployment lock on {host} was lost ({why}); `{operation}` stopped "
        "before its next step and changed nothing further: another run may hold the lock "
        "now. Check with `pdboot status`, then run it again."
    )


def under_lock(
    emit: Emit, held: HeldLock, host: str, operation: str, run: Callable[[Emit], int]
) -> int:
    """``run(guarded emit)``; a lost lock ends it with an error and exit 1; the lock is
    released (if still ours) in every case."""
    try:
        return run(guarded(emit, held))
    except LockLost as e:
        emit(Note(stopped_message(host, str(e), operation), "error"))
        return EXIT_FAILED
    finally:
        held.release()


__all__ = ["LockLost", "guarded", "stopped_message", "under_lock"]
