"""Reading an operator's file (the inventory) without blocking or filling memory.

``open()`` on a FIFO with no writer blocks forever, and /dev/zero never ends. The path is
stat()ed first and only a regular file is opened, with O_NONBLOCK so that a FIFO swapped
in between the stat and the open still cannot block; the opened file is checked again
(fstat) and read up to a limit.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class NotRegularFile(OSError):
    """The path is a FIFO, a device, a socket or a directory (``kind`` says which)."""

    def __init__(self, message: str, kind: str = "not a regular file") -> None:
        super().__init__(message)
        self.kind = kind


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def read_regular_file(path: Path, limit: int) -> bytes:
    """At most ``limit`` bytes of a regular file; NotRegularFile for anything else,
    OSError (with strerror) when it cannot be read."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise NotRegularFile(f"{_kind(mode)}, not a regular file", _kind(mode))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(f"{_kind(mode)}, not a regular file", _kind(mode))
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = -1
            return f.read(limit)
    finally:
        if fd >= 0:
            os.close(fd)


__all__ = ["NotRegularFile", "read_regular_file"]
