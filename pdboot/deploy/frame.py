"""One frame for every command that changes hosts (`up`, `down`, `stage`) and for the
read-only `up --plan`: it takes the deployment lock (a typed outcome), hands the command an
explicit cancellation token, opens the hosts the command asks for (former hosts included)
and closes them, turns Ctrl-C into exit 130, and ends every run with one `done` event.

The lock's heartbeat (transport/lock_holder.py) only records that the lock is lost; the token
reads that record. The command checks the token at its step boundaries (and in the progress
callbacks of the threads it starts): a lost lock ends the run there with an error naming the
lock and exit 1, and the run does nothing further (no router start, no rollback, no purge),
since another run may own the deployment now.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from pdboot.deploy.waits import Clock, MonotonicClock
from pdboot.events import Done, Emit, Event, Interrupted, Note
from pdboot.exitcodes import EXIT_FAILED, EXIT_INTERRUPTED, ended_in_words
from pdboot.inventory.schema import Inventory
from pdboot.transport import lock
from pdboot.transport.connection import RemoteError
from pdboot.transport.hosts import Hosts, open_hosts

# ---- what the frame opens and takes, injectable so a unit test drives `up` and `down` with
# fake hosts and a fake lock (tests/unit/deploy/test_orchestrator.py)

# (inventory, host names, accept_new_host_keys) -> opened hosts (Hosts.links[h].engine
# is a transport.hosts.EngineOps, .conn a transport.connection.Connection)
HostsFactory = Callable[[Inventory, Iterable[str], bool], Hosts]


def default_hosts(inv: Inventory, names: Iterable[str], accept_new_host_keys: bool) -> Hosts:
    return open_hosts(inv, names, accept_new_host_keys=accept_new_host_keys)


class HeldLock(Protocol):
    """The part of pdboot.transport.lock.HeldLock the orchestrator uses."""

    def release(self) -> None: ...

    @property
    def lost_reason(self) -> str | None: ...


# (inventory, operation, wait, accept_new_host_keys, say) -> the held deployment lock;
# raises lock.LockBusy (another live run holds it) or RemoteError (its host is unreachable)
LockFactory = Callable[[Inventory, str, bool, bool, Callable[[str], None]], HeldLock]


def default_lock(
    inv: Inventory, operation: str, wait: bool, accept_new: bool, say: Callable[[str], None]
) -> HeldLock:
    return lock.take(inv, operation, wait=wait, say=say, accept_new_host_keys=accept_new)


class Cancelled(Exception):
    """The run's token was cancelled (its deployment lock was lost): stop before the next
    step. Only the frame catches it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CancelToken:
    """Cancelled once the run's deployment lock is lost (or by ``cancel``). Checked by the
    command between its steps and by the threads pdboot starts for it."""

    def __init__(self, held: HeldLock | None = None) -> None:
        self._held = held
        self._reason: str | None = None

    @property
    def reason(self) -> str | None:
        if self._reason is None and self._held is not None:
            self._reason = self._held.lost_reason
        return self._reason

    def cancel(self, reason: str) -> None:
        if self._reason is None:
            self._reason = reason

    def check(self) -> None:
        """Raise Cancelled when cancelled: call it where the next step would begin."""
        why = self.reason
        if why is not None:
            raise Cancelled(why)

    def checking(self, emit: Emit) -> Emit:
        """``emit`` that checks the token first: for the progress callback of a thread that
        takes an emit and no token (the weights staging), so that it stops at its next
        report."""

        def emit_checked(event: Event) -> None:
            self.check()
            emit(event)

        return emit_checked


NEVER_CANCELLED = CancelToken()  # a caller that holds no lock (tests of a single step)


# ---- the lock, as a typed outcome


@dataclass(frozen=True)
class Held:
    lock: HeldLock


@dataclass(frozen=True)
class Unlocked:
    """`down` only: the lock's host does not answer; what can be reached is removed."""


@dataclass(frozen=True)
class Refused:
    code: int  # busy or unreachable: EXIT_FAILED; Ctrl-C while waiting: EXIT_INTERRUPTED


LockOutcome = Held | Unlocked | Refused

# SSH errors that mean "the host does not answer" (``connection.ErrorKind``): the only
# ones `down` goes on without the lock for.
UNANSWERED = ("unreachable", "timeout")


def take_lock(
    emit: Emit,
    factory: LockFactory,
    inv: Inventory,
    operation: str,
    *,
    no_wait: bool,
    accept_new: bool,
) -> LockOutcome:
    """The deployment lock (see lock.py). Unlocked only for `down` when the lock's host does
    not answer (down removes what it can reach). Any other SSH error of that host (a changed
    or unknown host key, refused credentials) stops `down` as it stops `up`: a key that
    changed is a reason to stop, not to go on unlocked."""
    try:
        return Held(
            factory(inv, operation, not no_wait, accept_new, lambda m: emit(Note(m, "warn")))
        )
    except lock.LockBusy as e:
        emit(Note(f"error: {e}", "error"))
    except RemoteError as e:
        why = f"{e.message} (fix: {e.fix})" if e.fix else e.message
        if operation == "down" and e.kind in UNANSWERED:
            emit(
                Note(
                    f"the deployment lock's host {e.host} is unreachable ({why}); going on "
                    "without the lock: what can be reached is removed",
                    "warn",
                )
            )
            return Unlocked()
        emit(Note(f"error: cannot take the deployment lock on {e.host}: {why}", "error"))
    except KeyboardInterrupt:
        emit(Interrupted(started=False))
        return Refused(EXIT_INTERRUPTED)
    return Refused(EXIT_FAILED)


def stopped_message(host: str, why: str, operation: str) -> str:
    return (
        f"error: the deployment lock on {host} was lost ({why}); `{operation}` stopped "
        "before its next step and changed nothing further: another run may hold the lock "
        "now. Check with `pdboot status`, then run it again."
    )


# ---- the frame


@dataclass(frozen=True)
class LockSpec:
    """How the frame takes the lock; None in place of it: a read-only run (`up --plan`)."""

    factory: LockFactory
    no_wait: bool = False


@dataclass
class Frame:
    """What a command runs in: its emit, its token, and the hosts it opened through
    ``open`` (closed by the frame, after the ``at_close`` clean-ups)."""

    operation: str
    inv: Inventory
    emit: Emit
    token: CancelToken
    accept_new: bool
    hosts_factory: HostsFactory = default_hosts
    summary: str = ""  # the `done` event's summary on success (the command sets it)
    _opened: list[Hosts] = field(default_factory=list)
    _cleanups: list[Callable[[Hosts], object]] = field(default_factory=list)

    def open(self, names: Iterable[str], *, former: bool = False) -> Hosts:
        """Open ``names``; ``former``: also the inventory's hosts that no tier uses any more,
        visited only to find this deployment's engines left there (which `up` drains and
        stops). One of those that cannot be reached is a warning: nothing runs there that
        the inventory wants."""
        hosts = self.hosts_factory(self.inv, list(names), self.accept_new)
        hosts.on_relink = self._relinked
        self._opened.append(hosts)
        if former:
            self._add_former(hosts)
        return hosts

    def _relinked(self, host: str, why: str) -> None:
        self.emit(Note(f"reconnected to {host} after: {why}", "warn"))

    def at_close(self, cleanup: Callable[[Hosts], object]) -> None:
        """Run ``cleanup(hosts)`` on each opened Hosts before it closes, whatever happened
        (Ctrl-C included): no staging or seed container is left behind."""
        self._cleanups.append(cleanup)

    def _add_former(self, hosts: Hosts) -> None:
        former = [h for h in self.inv.hosts if h not in hosts.links and h not in hosts.errors]
        if not former:
            return
        extra = self.hosts_factory(self.inv, former, self.accept_new)
        hosts.links.update(extra.links)
        for host, why in sorted(extra.errors.items()):
            self.emit(
                Note(
                    f"{host} is in no tier and cannot be reached ({why}): engines pdboot "
                    "started there earlier are left as they are",
                    "warn",
                )
            )

    def close(self) -> None:
        for hosts in reversed(self._opened):
            try:
                for cleanup in self._cleanups:
                    cleanup(hosts)
            finally:
                hosts.close()
        self._opened.clear()


Body = Callable[[Frame], int]
Summary = Callable[[int, float], str]  # (exit code, seconds) -> the done event's summary


def run_framed(
    operation: str,
    inv: Inventory,
    emit: Emit,
    body: Body,
    *,
    lock_spec: LockSpec | None,
    accept_new: bool,
    hosts_factory: HostsFactory = default_hosts,
    clock: Clock | None = None,
    summary: Summary | None = None,
) -> int:
    """Run ``body`` in a frame; returns its exit code, also in the final Done event.
    ``lock_spec`` None: no lock is taken (a run that changes nothing)."""
    clk = clock or MonotonicClock()
    t0 = clk.now()
    frame: Frame | None = None
    outcome: LockOutcome = Unlocked()
    if lock_spec is not None:
        outcome = take_lock(
            emit,
            lock_spec.factory,
            inv,
            operation,
            no_wait=lock_spec.no_wait,
            accept_new=accept_new,
        )
    if isinstance(outcome, Refused):
        code = outcome.code
    else:
        held = outcome.lock if isinstance(outcome, Held) else None
        frame = Frame(operation, inv, emit, CancelToken(held), accept_new, hosts_factory)
        try:
            code = _run(frame, body, inv.router.host)
        finally:
            if held is not None:
                held.release()  # if still ours
    took = clk.now() - t0
    detail = ""
    if frame is not None and frame.summary:
        detail = frame.summary
    elif summary is not None:
        detail = summary(code, took)
    detail = detail or f"{operation} {ended_in_words(code)} after {took:.1f}s"
    emit(Done(operation, code, took, detail))
    return code


def _run(frame: Frame, body: Body, lock_host: str) -> int:
    try:
        try:
            return body(frame)
        finally:
            frame.close()
    except Cancelled as e:
        frame.emit(Note(stopped_message(lock_host, e.reason, frame.operation), "error"))
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


__all__ = [
    "NEVER_CANCELLED",
    "CancelToken",
    "Cancelled",
    "Frame",
    "Held",
    "LockOutcome",
    "LockSpec",
    "Refused",
    "Unlocked",
    "run_framed",
    "stopped_message",
    "take_lock",
]
