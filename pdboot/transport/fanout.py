"""``fan_out`` runs one function per host on daemon threads and waits with a deadline, so a
hung host is reported as a timeout instead of hanging the whole run (fabric's ThreadingGroup
joins without a timeout).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from pdboot.transport.connection import RemoteError

K = TypeVar("K")
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Outcome(Generic[R]):
    value: R | None = None
    error: RemoteError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def fan_out(
    items: Mapping[str, T] | Iterable[tuple[str, T]],
    fn: Callable[[str, T], R],
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Outcome[R]]:
    """Run ``fn(name, item)`` for every item in parallel; wait at most ``deadline`` seconds.

    Each result is an Outcome: the value, or the RemoteError (any other exception is
    classified). Items still running at the deadline are reported as timeouts; their
    daemon threads are abandoned, never joined, so they cannot hang the caller.
    """
    pairs = list(items.items()) if isinstance(items, Mapping) else list(items)
    results: dict[str, Outcome[R]] = {}
    done = threading.Condition()

    def work(name: str, item: T) -> None:
        try:
            outcome: Outcome[R] = Outcome(value=fn(name, item))
        except BaseException as e:  # reported per host, never fatal to the others
            outcome = Outcome(error=_classified(e, name))
        with done:
            results[name] = outcome
            done.notify_all()

    for name, item in pairs:
        threading.Thread(target=work, args=(name, item), daemon=True, name=f"pdboot-{name}").start()
    end = clock() + deadline
    with done:
        while len(results) < len(pairs):
            left = end - clock()
            if left <= 0:
                break
            done.wait(min(left, 0.5))
        final = dict(results)
    for name, _ in pairs:
        if name not in final:
            final[name] = Outcome(
                error=RemoteError(name, "timeout", f"no answer within {deadline:g}s")
            )
    return {name: final[name] for name, _ in pairs}


def _classified(e: BaseException, name: str) -> RemoteError:
    if isinstance(e, RemoteError):
        return e
    # paramiko's exceptions: imported here, only for a host that failed
    from pdboot.transport.known_hosts import classify

    return classify(e, name)


def in_thread(fn: Callable[[], None]) -> Callable[[], None]:
    """Start fn in a thread; the returned join re-raises what it raised (so a failed
    staging fails the host's pull step, with the host named by Hosts.each)."""
    box: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # handed to the joining thread
            box.append(e)

    t = threading.Thread(target=run, daemon=True, name="pdboot-stage")
    t.start()

    def join() -> None:
        t.join()
        if box:
            raise box[0]

    return join
