"""Deadlines for opening an SSH connection, every ProxyJump hop included.

fabric builds ProxyJump hops from ~/.ssh/config as Connections of their own, from the
config alone: the connect timeout given to the target never reaches them, and the
``direct-tcpip`` channel through a hop waits for paramiko's 3,600 s channel default. A
bastion that accepts TCP and then goes silent could hold `up` for an hour. Here every hop
gets the same connect, banner, auth and channel timeouts, and the whole open runs under
one overall deadline on a helper thread: past it, every hop's client is closed (which
fails the blocked call at once) and the caller gets TimeoutError naming the chain.
Also the known_hosts sanity check that must run before any key is accepted.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from typing import Any


def hop_chain(conn: Any) -> list[Any]:
    """The target first, then each ProxyJump hop (fabric Connections), outwards."""
    out = []
    hop = conn
    while hop is not None and not isinstance(hop, str) and hasattr(hop, "client"):
        out.append(hop)
        hop = getattr(hop, "gateway", None)
    return out


def apply_timeouts(conn: Any, seconds: float) -> None:
    """Connect, banner, auth and channel-open timeouts on the target and every hop."""
    for hop in hop_chain(conn):
        hop.connect_timeout = int(max(1, seconds))
        kwargs = dict(hop.connect_kwargs or {})
        for key in ("banner_timeout", "auth_timeout", "channel_timeout"):
            kwargs.setdefault(key, seconds)
        hop.connect_kwargs = kwargs


def overall_deadline(connect_timeout: float, hops: int) -> float:
    """TCP connect, banner and auth per hop, each bounded by connect_timeout, plus slack."""
    return connect_timeout * 3 * max(1, hops) + 5.0


def open_with_deadline(conn: Any, deadline_s: float, what: str) -> None:
    """``conn.open()``, or TimeoutError once ``deadline_s`` has passed (the hops' clients
    are closed so the helper thread does not linger on a silent socket)."""
    failure: list[BaseException] = []

    def work() -> None:
        try:
            conn.open()
        except BaseException as e:  # re-raised on the caller's thread
            failure.append(e)

    t = threading.Thread(target=work, daemon=True, name=f"pdboot-connect-{what}")
    t.start()
    t.join(deadline_s)
    if t.is_alive():
        for hop in hop_chain(conn):
            # closing a half-open client only speeds up the thread's end; never fatal
            with contextlib.suppress(Exception):
                hop.client.close()
        t.join(2.0)
        chain = " -> ".join(str(getattr(h, "host", "?")) for h in reversed(hop_chain(conn)))
        raise TimeoutError(
            f"no SSH session within {deadline_s:g}s ({chain}): a host or ProxyJump hop "
            "accepted the connection and went silent"
        )
    if failure:
        raise failure[0]


def discarding_known_hosts(path: str) -> bool:
    """``/dev/null`` (or another non-regular file): keys written there are forgotten."""
    real = os.path.realpath(os.path.expanduser(path))
    if real == os.devnull:
        return True
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        return False  # created on first accept
    except OSError:
        return True
    return not stat.S_ISREG(mode)


__all__ = [
    "apply_timeouts",
    "discarding_known_hosts",
    "hop_chain",
    "open_with_deadline",
    "overall_deadline",
]
