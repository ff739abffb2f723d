"""The per-deployment lock: one `up` or `down` of a deployment at a time, across operators.

It lives on a host, not on the operator's machine, so two operators (two laptops) see the
same lock: the directory ``<remote_dir>/<name>.lock`` on the router's host (every
deployment has exactly one router, so the place is known without looking). A run writes
its ``owner`` file (operator user@machine, pid, a random run id, the operation, when it
started) into a fresh temporary directory and renames that onto the lock's name: rename(2)
refuses a non-empty target, so exactly one run wins, and a lock directory never exists
without its owner. While the lock is held a heartbeat thread touches that file every
``HEARTBEAT_S`` seconds; its modification time, compared with the host's own clock (so the
operators' clocks do not matter), tells a waiting run whether the holder is alive.

A lock whose heartbeat is older than ``STALE_AFTER_S`` (three periods) was left by a killed
run and is taken over by renaming the directory to a tombstone named after the stale run
id. The tombstone holds the stale owner file, so when two runs judge the same lock stale,
one rename wins and the other fails on the tombstone it finds in place, even if the winner
has created a fresh lock meanwhile. An ownerless lock (left by an older pdboot that died
between mkdir and writing ``owner``) would make an empty tombstone, which rename replaces:
it is removed with rmdir instead, which fails on any fresh (never empty) lock. A failed
takeover obeys the wait rules of a held lock (``--no-wait``, the wait limit, the poll
interval). Tombstones and temporary directories are swept after 10 minutes.

The holder's side (the heartbeat, knowing when the lock is lost) is transport/lock_holder.py.

Every script prints its answer after a marker line with a fresh random token, so a login
shell that prints to stdout (a noisy ``.bashrc``) cannot be mistaken for the answer.

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
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

from pdboot.inventory.schema import Inventory
from pdboot.transport.connection import Connection, RemoteError
from pdboot.transport.lock_holder import POLL_S, STALE_AFTER_S, HeldLock
from pdboot.transport.ssh import connect

log = logging.getLogger(__name__)

MARKER = "### pdboot-lock "
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


def new_token() -> str:
    return secrets.token_hex(8)


def answer(stdout: str, token: str) -> str:
    """What a script printed after its marker line (a login shell's chatter comes before
    it). Without a token (tests of the bare scripts) the whole output. ValueError when the
    marker is missing."""
    if not token:
        return stdout
    mark = f"{MARKER}{token}"
    lines = stdout.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.rstrip("\n").endswith(mark):
            return "".join(lines[i + 1 :])
    raise ValueError(f"no lock answer in the output: {stdout[:200]!r}")


def parse_probe(stdout: str, token: str = "") -> Probe:
    """Output of ``acquire_script`` -> Probe. Raises ValueError on anything else."""
    lines = answer(stdout, token).splitlines()
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
    """The stale lock's identity in its tombstone's name (letters and digits only);
    ``noowner`` for a lock without a readable owner (taken over by rmdir)."""
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


def _marker(token: str) -> str:
    return f"printf '%s\\n' {shlex.quote(MARKER + token)}\n" if token else ""


def acquire_script(path: str, token: str = "") -> str:
    """The owner text (stdin) into a fresh temporary directory, renamed onto the lock's
    name (fails when a lock is there). Prints ``acquired`` or ``held`` + the host's clock +
    the heartbeat time + the owner file, after the marker line."""
    d, parent = shlex.quote(path), shlex.quote(os.path.dirname(path) or "/")
    return (
        f"set -u; d={d}; mkdir -p -- {parent} || exit 3\n"
        f'{_marker(token)}t=$(mktemp -d -- "$d.new-XXXXXX") || exit 3\n'
        'chmod 0755 -- "$t"; cat > "$t/owner" || { rm -rf -- "$t"; exit 3; }\n'
        # an existing lock (never empty) makes the rename fail: someone else holds it
        'if [ ! -e "$d" ] && mv -T -- "$t" "$d" 2>/dev/null; then echo acquired; exit 0; fi\n'
        'rm -rf -- "$t"\n'
        'echo held; echo "now=$(date +%s)"\n'
        'if [ -f "$d/owner" ]; then echo "beat=$(stat -c %Y -- "$d/owner")"; cat -- "$d/owner"\n'
        'else echo "beat=$(stat -c %Y -- "$d" 2>/dev/null || date +%s)"; fi\n'
    )


NO_OWNER = "noowner"


def takeover_script(path: str, tag: str, token: str = "") -> str:
    """Take the stale lock away: rename it to its tombstone (``tag``: the stale run id),
    or for an ownerless lock (``NO_OWNER``) rmdir it, which only an empty directory
    allows. Prints ``taken`` or ``lost: <why>`` after the marker line."""
    if not re.fullmatch(r"[0-9A-Za-z]+", tag):
        raise ValueError("a tombstone tag is letters and digits only")
    d = shlex.quote(path)
    t = shlex.quote(f"{path}.stale-{tag}")
    parent = shlex.quote(os.path.dirname(path) or "/")
    base = os.path.basename(path)
    if tag == NO_OWNER:
        take = f"rm -f -- {shlex.quote(f'{path}/owner.tmp')} 2>/dev/null; why=$(rmdir -- {d} 2>&1)"
    else:
        take = f"why=$(mv -T -- {d} {t} 2>&1) && touch -- {t}"
    sweep = " ".join(f"{shlex.quote(f'{base}.{kind}-*')}" for kind in ("stale", "new"))
    return (
        f"set -u\n{_marker(token)}"
        f"if {take}; then echo taken; else printf 'lost: %s\\n' \"$why\" | head -c 300; fi\n"
        f'for p in {sweep}; do find {parent} -maxdepth 1 -name "$p" -mmin '
        f"+{_TOMBSTONE_MINUTES} -exec rm -rf -- {{}} + 2>/dev/null; done; true\n"
    )


def parse_takeover(stdout: str, token: str = "") -> tuple[bool, str]:
    """(taken, why not) from ``takeover_script``'s output; ValueError when unreadable."""
    text = answer(stdout, token).strip()
    if text == "taken":
        return True, ""
    if text.startswith("lost"):
        return False, text.partition(":")[2].strip().splitlines()[0] if ":" in text else ""
    raise ValueError(f"unexpected takeover answer: {text[:200]!r}")


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
    reconnect: Callable[[], Connection] | None = None,
) -> HeldLock:
    """Take the lock at ``path`` on ``conn``'s host, waiting up to ``wait_s`` seconds for
    a live holder (saying once who it is), taking over a stale one. Raises LockBusy (with
    who holds it) when not waiting or when the wait is over, a failed takeover included;
    RemoteError if the host fails or answers nonsense."""
    owner = new_owner(operation)
    end = clock() + wait_s
    announced = ""
    takeovers = 0
    while True:
        token = new_token()
        res = conn.run(acquire_script(path, token), stdin=owner.text(), timeout=30)
        if res.rc != 0:
            raise RemoteError(conn.name, "error", f"cannot take the lock {path}: {res.stderr}")
        probe = _probe_or_fail(conn, path, owner, res.stdout, token)
        if probe.acquired:
            return HeldLock(
                conn,
                path,
                owner,
                conn.name,
                beat_script=heartbeat_script(path, owner.run_id),
                release_script=release_script(path, owner.run_id),
                reconnect=reconnect,
            )
        who = describe(probe, conn.name)
        if is_stale(probe):
            if takeovers == 0:
                say(f"{who}: stale (its run is gone), taking it over")
            takeovers += 1
            taken, why = _take_over(conn, path, probe)
            if taken and takeovers <= 3:
                continue  # try for the lock at once (more than 3 in a row: wait as below)
            who = (
                f"{who}: stale, but taking it over failed"
                + (f" ({why})" if why else " (another run took it over first)")
                + f"; check that {os.path.dirname(path) or '/'} is writable by this user"
            )
        if not wait:
            raise LockBusy(f"{who} (--no-wait: not waiting)")
        if clock() >= end:
            raise LockBusy(f"{who}; gave up after waiting {wait_s:g}s")
        if probe.raw_owner != announced or takeovers == 1:
            announced = probe.raw_owner
            say(f"{who}; waiting up to {wait_s:g}s for it (Ctrl-C to stop, --no-wait to fail)")
        sleep(POLL_S)


def _probe_or_fail(conn: Connection, path: str, owner: Owner, stdout: str, token: str) -> Probe:
    """The probe, or RemoteError (never a bare ValueError) after removing a lock this run
    may have created before its answer became unreadable."""
    try:
        return parse_probe(stdout, token)
    except ValueError as e:
        try:
            conn.run(release_script(path, owner.run_id), timeout=10)
        except RemoteError:
            log.warning("cannot remove a possibly half-taken lock %s", path)
        raise RemoteError(
            conn.name,
            "error",
            f"the deployment lock script on {conn.name} gave no readable answer ({e})",
            "something on the host rewrites command output; run `ssh HOST true` and check "
            "that it prints nothing",
        ) from None


def _take_over(conn: Connection, path: str, probe: Probe) -> tuple[bool, str]:
    token = new_token()
    try:
        res = conn.run(takeover_script(path, tombstone_tag(probe), token), timeout=30)
        return parse_takeover(res.stdout, token)
    except ValueError as e:
        return False, str(e)


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

    def open_conn() -> Connection:
        return connect(host, inv.hosts[host], inv.ssh, accept_new_host_keys=accept_new_host_keys)

    conn = open_conn()
    try:
        held = acquire(
            conn,
            lock_dir(inv.remote_dir, inv.name),
            operation,
            wait=wait,
            say=say,
            reconnect=open_conn,
        )
    except BaseException:
        conn.close()
        raise
    held.close_conn = True
    return held
