"""The per-deployment lock: one `up` or `down` of a deployment at a time, across operators.

It lives on a host, not on the operator's machine, so two operators (two laptops) see the
same lock: the directory ``<remote_dir>/<name>.lock`` on the router's host (every
deployment has exactly one router, so the place is known without looking). ``mkdir`` is
atomic: whoever creates the directory holds the lock and writes an ``owner`` file into it
(operator user@machine, pid, a random run id, the operation, when it started). While the
lock is held a heartbeat thread touches that file every ``HEARTBEAT_S`` seconds; its
modification time, compared with the host's own clock (so the operators' clocks do not
matter), tells a waiting run whether the holder is alive.

A lock whose heartbeat is older than ``STALE_AFTER_S`` (three periods) was left by a killed
run and is taken over by renaming the directory to a tombstone named after the stale run
id. rename(2) is atomic and refuses a non-empty target, so when two runs judge the same
lock stale, one rename wins and the other fails on the tombstone it finds in place, even
if the winner has created a fresh lock meanwhile. Tombstones are swept after 10 minutes.

Pure decisions (parsing the owner and the probe, staleness, the message) are functions of
plain values; the remote part is scripts whose every value is quoted, run through a
``transport.connection.Connection``.
"""

from __future__ import annotations

import getpass
import logging
import os
import re
import secrets
import shlex
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

from pdboot.inventory.schema import Inventory
from pdboot.transport.connection import Connection, RemoteError
from pdboot.transport.ssh import connect

log = logging.getLogger(__name__)

HEARTBEAT_S = 10.0
STALE_AFTER_S = 3 * HEARTBEAT_S
POLL_S = 2.0
WAIT_S = 900.0  # default wait for a held lock: an `up` may wait that long for its engines
_TOMBSTONE_MINUTES = 10


class LockBusy(Exception):
    """The lock is held by another live run (and we do not, or no longer, wait)."""


# --------------------------------------------------------------------------- pure


@dataclass(frozen=True)
class Owner:
    user: str
    machine: str
    pid: int
    run_id: str
    operation: str
    started: str  # ISO 8601, UTC, the operator's clock (shown, never compared)

    def text(self) -> str:
        return "".join(f"{k}={_one_line(str(v))}\n" for k, v in self.__dict__.items())

    @staticmethod
    def parse(text: str) -> Owner | None:
        """The owner file -> Owner; None when it is missing, cut short or garbled."""
        kv = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        try:
            return Owner(
                user=kv["user"],
                machine=kv["machine"],
                pid=int(kv["pid"]),
                run_id=kv["run_id"],
                operation=kv["operation"],
                started=kv["started"],
            )
        except (KeyError, ValueError):
            return None


def new_owner(operation: str, now: datetime | None = None) -> Owner:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return Owner(
        user=user,
        machine=socket.gethostname(),
        pid=os.getpid(),
        run_id=secrets.token_hex(8),
        operation=operation,
        started=(now or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
    )


@dataclass(frozen=True)
class Probe:
    """What an acquire attempt found: ``acquired``, or ``held`` with the holder (None if
    its owner file is not written yet) and the heartbeat's age on the host's clock."""

    acquired: bool
    owner: Owner | None = None
    age_s: float = 0.0
    raw_owner: str = ""


def parse_probe(stdout: str) -> Probe:
    """Output of ``acquire_script`` -> Probe. Raises ValueError on anything else."""
    lines = stdout.splitlines()
    if lines and lines[0] == "acquired":
        return Probe(True)
    if not lines or lines[0] != "held":
        raise ValueError(f"unexpected lock answer: {stdout[:200]!r}")
    head = dict(ln.split("=", 1) for ln in lines[1:3] if "=" in ln)
    try:
        age = float(head["now"]) - float(head["beat"])
    except (KeyError, ValueError):
        raise ValueError(f"unexpected lock answer: {stdout[:200]!r}") from None
    raw = "\n".join(lines[3:])
    return Probe(False, Owner.parse(raw), max(age, 0.0), raw)


def is_stale(probe: Probe, stale_after: float = STALE_AFTER_S) -> bool:
    return not probe.acquired and probe.age_s > stale_after


def tombstone_tag(probe: Probe) -> str:
    """The stale lock's identity in its tombstone's name (letters and digits only)."""
    rid = probe.owner.run_id if probe.owner else ""
    tag = re.sub(r"[^0-9A-Za-z]", "", rid)[:32]
    return tag or "noowner"


def describe(probe: Probe, host: str) -> str:
    """Who holds the lock and since when, for the waiting operator."""
    o = probe.owner
    beat = f"last heartbeat {probe.age_s:.0f}s ago"
    if o is None:
        return f"the deployment lock on {host} is being taken by another run ({beat})"
    return (
        f"the deployment lock on {host} is held by {o.user}@{o.machine} "
        f"(pid {o.pid}, `pdboot {o.operation}`, run {o.run_id}) since {o.started}; {beat}"
    )


# --------------------------------------------------------------------------- scripts


def lock_dir(remote_dir: str, name: str) -> str:
    return f"{remote_dir.rstrip('/') or ''}/{name}.lock"


def acquire_script(path: str) -> str:
    """mkdir the lock; on success the owner text (stdin) goes in. Prints ``acquired`` or
    ``held`` + the host's clock + the heartbeat time + the owner file."""
    d, parent = shlex.quote(path), shlex.quote(os.path.dirname(path) or "/")
    return (
        f"set -u; d={d}; mkdir -p -- {parent} || exit 3\n"
        'if mkdir -m 0755 -- "$d" 2>/dev/null; then\n'
        '  cat > "$d/owner.tmp" && mv -f -- "$d/owner.tmp" "$d/owner" && echo acquired\n'
        "  exit $?\n"
        "fi\n"
        'echo held; echo "now=$(date +%s)"\n'
        'if [ -f "$d/owner" ]; then echo "beat=$(stat -c %Y -- "$d/owner")"; cat -- "$d/owner"\n'
        'else echo "beat=$(stat -c %Y -- "$d" 2>/dev/null || date +%s)"; fi\n'
    )


def takeover_script(path: str, tag: str) -> str:
    """Rename the stale lock to its tombstone; prints ``taken`` or ``lost``."""
    if not re.fullmatch(r"[0-9A-Za-z]+", tag):
        raise ValueError("a tombstone tag is letters and digits only")
    d = shlex.quote(path)
    t = shlex.quote(f"{path}.stale-{tag}")
    parent = shlex.quote(os.path.dirname(path) or "/")
    pattern = shlex.quote(f"{os.path.basename(path)}.stale-*")
    return (
        f"set -u\n"
        f"if mv -T -- {d} {t} 2>/dev/null; then touch -- {t}; echo taken; else echo lost; fi\n"
        f"find {parent} -maxdepth 1 -name {pattern} -mmin +{_TOMBSTONE_MINUTES} "
        "-exec rm -rf -- {} + 2>/dev/null; true\n"
    )


def _is_ours(path: str, run_id: str) -> str:
    return f"grep -qxF -- {shlex.quote(f'run_id={run_id}')} {shlex.quote(f'{path}/owner')}"


def heartbeat_script(path: str, run_id: str) -> str:
    """Touch the owner file if the lock is still ours (exit 1 when it is not)."""
    return f"{_is_ours(path, run_id)} && touch -- {shlex.quote(f'{path}/owner')}"


def release_script(path: str, run_id: str) -> str:
    return (
        f"if {_is_ours(path, run_id)} 2>/dev/null; then rm -rf -- {shlex.quote(path)}; "
        "echo released; else echo not-ours; fi"
    )


def _one_line(v: str) -> str:
    return v.replace("\n", " ").replace("\r", " ")


# --------------------------------------------------------------------------- remote


class HeldLock:
    """A lock this run holds: the heartbeat runs until ``release``."""

    def __init__(self, conn: Connection, path: str, owner: Owner, host: str) -> None:
        self.conn, self.path, self.owner, self.host = conn, path, owner, host
        self.close_conn = False  # set by take(): the connection is the lock's own
        self._stop = threading.Event()
        self.lost = False
        self._beat = threading.Thread(target=self._heartbeat, daemon=True, name="pdboot-lock")
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                res = self.conn.run(heartbeat_script(self.path, self.owner.run_id), timeout=10)
            except RemoteError as e:
                log.warning("lock heartbeat on %s failed: %s", self.host, e.message)
                continue
            if res.rc != 0 and not self.lost:
                self.lost = True
                log.warning("the deployment lock on %s is no longer ours", self.host)

    def release(self) -> None:
        """Remove the lock if it is still ours. Never raises: a failed release leaves a
        lock that the next run sees go stale."""
        self._stop.set()
        try:
            self.conn.run(release_script(self.path, self.owner.run_id), timeout=10)
        except Exception as e:  # the run's own outcome matters more than the lock's
            log.warning("cannot release the deployment lock on %s: %s", self.host, e)
        if self.close_conn:
            self.conn.close()


def acquire(
    conn: Connection,
    path: str,
    operation: str,
    *,
    wait: bool = True,
    wait_s: float = WAIT_S,
    say: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> HeldLock:
    """Take the lock at ``path`` on ``conn``'s host, waiting up to ``wait_s`` seconds for
    a live holder (saying once who it is), taking over a stale one. Raises LockBusy (with
    who holds it) when not waiting or when the wait is over; RemoteError if the host fails."""
    owner = new_owner(operation)
    end = clock() + wait_s
    announced = ""
    while True:
        res = conn.run(acquire_script(path), stdin=owner.text(), timeout=30)
        if res.rc != 0:
            raise RemoteError(conn.name, "error", f"cannot take the lock {path}: {res.stderr}")
        probe = parse_probe(res.stdout)
        if probe.acquired:
            return HeldLock(conn, path, owner, conn.name)
        if is_stale(probe):
            say(f"{describe(probe, conn.name)}: stale (its run is gone), taking it over")
            conn.run(takeover_script(path, tombstone_tag(probe)), timeout=30)
            continue
        who = describe(probe, conn.name)
        if not wait:
            raise LockBusy(f"{who} (--no-wait: not waiting)")
        if clock() >= end:
            raise LockBusy(f"{who}; gave up after waiting {wait_s:g}s")
        if probe.raw_owner != announced:
            announced = probe.raw_owner
            say(f"{who}; waiting up to {wait_s:g}s for it (Ctrl-C to stop, --no-wait to fail)")
        sleep(POLL_S)


def take(
    inv: Inventory,
    operation: str,
    *,
    wait: bool = True,
    say: Callable[[str], None] = print,
    accept_new_host_keys: bool = False,
) -> HeldLock:
    """The deployment's lock on the router's host, over a connection of its own (the
    heartbeat must not queue behind a long command). Raises LockBusy, or RemoteError when
    that host cannot be reached."""
    host = inv.router.host
    conn = connect(host, inv.hosts[host], inv.ssh, accept_new_host_keys=accept_new_host_keys)
    try:
        held = acquire(conn, lock_dir(inv.remote_dir, inv.name), operation, wait=wait, say=say)
    except BaseException:
        conn.close()
        raise
    held.close_conn = True
    return held
