"""The HF cache directory a staging container writes into, checked before each use: every
engine later loads whatever that directory holds, so a directory pdboot did not create must
be a real directory (not a link) owned by root or the SSH user and writable by no one else.
A missing one is created by pdboot (0755) rather than by Docker's bind mount. The decision
is pure (`cache_dir_problem`); `check_cache_dir` runs the one command and raises."""

from __future__ import annotations

import shlex

from pdboot.transport.connection import Connection

MISSING = "missing"


def cache_dir_command(path: str) -> str:
    q = shlex.quote(path)
    return (
        f"if [ -e {q} ] || [ -L {q} ]; then stat -c '%u %a %F' -- {q}; "
        f"else echo {MISSING}; fi; id -u"
    )


def cache_dir_problem(output: str, path: str) -> str | None:
    """The command's output -> why the directory must not be used (None: fine, or missing)."""
    lines = output.strip().splitlines()
    if len(lines) != 2 or not lines[1].strip().isdigit():
        return f"cannot inspect {path}: {output.strip()[:200]!r}"
    first, me = lines[0].strip(), lines[1].strip()
    if first == MISSING:
        return None
    parts = first.split(" ", 2)
    if len(parts) != 3 or not parts[0].isdigit():
        return f"cannot inspect {path}: {first[:200]!r}"
    uid, mode, kind = int(parts[0]), int(parts[1], 8), parts[2]
    if kind != "directory":
        return f"{path} is a {kind}, not a directory of its own"
    if uid not in (0, int(me)):
        return f"{path} is owned by uid {uid}, neither root nor the SSH user (uid {me})"
    if mode & 0o022:
        return f"{path} is writable by others (mode {mode:o}): anyone there could plant weights"
    return None


class CacheDirError(Exception):
    """The HF cache directory is not safe to stage into (the message says why and how)."""


def check_cache_dir(conn: Connection, path: str) -> None:
    res = conn.run(cache_dir_command(path), timeout=60)
    why = cache_dir_problem(res.stdout, path) if res.rc == 0 else res.stderr.strip()[:200]
    if why is not None:
        raise CacheDirError(
            f"container.hf_cache: {why}; fix: chown root and chmod go-w it, or point "
            "container.hf_cache at a directory of its own"
        )
    if res.stdout.startswith(MISSING):
        made = conn.run(["mkdir", "-p", "-m", "0755", "--", path], timeout=60)
        if made.rc != 0:
            raise CacheDirError(f"cannot create {path}: {made.stderr.strip()[:200]}")
