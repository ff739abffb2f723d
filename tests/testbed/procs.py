"""Processes the testbed starts, identified by pid AND start time, so a reused pid is never hit.

Everything is stopped by pid (never by name). Namespaces are swept by membership: a pid whose
/proc/PID/ns/net or ns/mnt is one of ours belongs to a test host (containers with
network_mode host, ssh sessions, shims), so it is ours to kill.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Proc:
    pid: int
    start: int  # field 22 of /proc/PID/stat (clock ticks since boot)
    label: str

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, object]) -> Proc:
        return Proc(int(str(d["pid"])), int(str(d["start"])), str(d["label"]))


def start_time(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: split after the last ')'
    fields = raw[raw.rindex(")") + 2 :].split()
    return int(fields[19])


def alive(p: Proc) -> bool:
    st = start_time(p.pid)
    if st != p.start:
        return False
    try:
        state = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


_children: dict[int, subprocess.Popen[bytes]] = {}


def spawn(argv: list[str], label: str, log: Path, env: dict[str, str] | None = None) -> Proc:
    """Start a daemon in its own session (a ^C in the terminal reaches only the harness)."""
    out = open(log, "ab")  # noqa: SIM115 - handed to the child
    try:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    finally:
        out.close()
    _children[popen.pid] = popen
    st = start_time(popen.pid)
    return Proc(popen.pid, st if st is not None else -1, label)


def _reap(pid: int) -> None:
    popen = _children.get(pid)
    if popen is not None and popen.poll() is not None:
        _children.pop(pid, None)


def signal_proc(p: Proc, sig: int) -> bool:
    if not alive(p):
        return False
    try:
        os.kill(p.pid, sig)
    except ProcessLookupError:
        return False
    return True


def stop(p: Proc, timeout: float = 5.0) -> None:
    """SIGTERM, wait, then SIGKILL: the pid only, verified by its start time."""
    if not signal_proc(p, signal.SIGTERM):
        _reap(p.pid)
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(p.pid)
        if not alive(p):
            return
        time.sleep(0.05)
    signal_proc(p, signal.SIGKILL)
    for _ in range(100):
        _reap(p.pid)
        if not alive(p):
            return
        time.sleep(0.02)


def ns_inode(pid: int | str, kind: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    except OSError:
        return None


def pin_ns(p: Proc, kind: str, inode: int) -> int | None:
    """An open descriptor of `p`'s `kind` namespace when `p` is alive and in the namespace
    numbered `inode`, else None. While it is open the namespace lives on and its number is
    not given to a new one; the caller closes it."""
    try:
        fd = os.open(f"/proc/{p.pid}/ns/{kind}", os.O_RDONLY)
    except OSError:
        return None
    if os.fstat(fd).st_ino == inode and alive(p):  # opened, then checked: not a reused pid
        return fd
    os.close(fd)
    return None


def pids_in_namespaces(net: set[int], mnt: set[int]) -> list[Proc]:
    """Every live process whose network or mount namespace is one of the given inodes."""
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        if ns_inode(entry, "net") in net or ns_inode(entry, "mnt") in mnt:
            st = start_time(int(entry))
            if st is not None:
                found.append(Proc(int(entry), st, "swept"))
    return found


def kill_all(procs: list[Proc]) -> None:
    for p in procs:
        signal_proc(p, signal.SIGKILL)
    deadline = time.monotonic() + 5
    for p in procs:
        while alive(p) and time.monotonic() < deadline:
            _reap(p.pid)
            time.sleep(0.02)
        _reap(p.pid)
