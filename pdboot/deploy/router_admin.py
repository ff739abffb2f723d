"""How pdboot reaches the router's worker API: only through the router host.

The router listens on its host's loopback (plan/proxy.py); the public port is the proxy's,
which answers 404 to the worker API. pdboot's own calls to the router (its /health,
/workers, registering and removing engines) go through a ``direct-tcpip`` channel of the
SSH connection to the router host (transport/tunnel.py). A router host that is this machine
is reached on loopback directly; the watch service runs on the router host and does too.

``AdminFetch`` wraps pdboot's one HTTP function: a URL under the router's own URL
(``http://127.0.0.1:<internal_port>``, as the router host sees it) is sent to the local end
of the channel; every other URL goes out unchanged. A run opens one per router it talks to
and closes it at its end (``with AdminFetch(...) as admin:``, or ``close()``): the channel's
listener is a thread and a socket of this process.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

from pdboot.plan.model import Plan, Service
from pdboot.transport.connection import RemoteError
from pdboot.transport.hosts import Hosts
from pdboot.transport.http import HttpAnswer, HttpFn
from pdboot.transport.ssh import SSHConnection
from pdboot.transport.tunnel import Forward


class AdminFetch:
    """An HttpFn; ``close()`` ends the channel's listener."""

    def __init__(
        self, plan: Plan, hosts: Hosts, fetch: HttpFn, router: Service | None = None
    ) -> None:
        """``router``: another router on the plan's router host (a router swap's spare,
        deploy/router_swap.py); the plan's by default."""
        r = router or plan.router
        self.base = r.url.rstrip("/")
        self.host = r.host
        self.port = r.port
        self.address = r.address
        hp = plan.hosts.get(self.host)
        self.local = hp is not None and hp.is_local
        self.hosts = hosts
        self.fetch = fetch
        self._forward: Forward | None = None
        self._lock = threading.Lock()

    def _local_base(self) -> str | None:
        link = self.hosts.links.get(self.host)
        conn = link.conn if link is not None else None
        if not isinstance(conn, SSHConnection):
            return None  # this machine (or a test's stand-in connection): no channel needed
        with self._lock:
            transport = self._transport(conn)
            if transport is None:
                return None
            if self._forward is None or self._forward.transport is not transport:
                if self._forward is not None:
                    self._forward.close()
                self._forward = Forward(transport, self.address, self.port)
            return f"http://127.0.0.1:{self._forward.port}"

    @staticmethod
    def _transport(conn: SSHConnection) -> Any:
        try:
            return conn.live_transport()
        except RemoteError:  # reported by the request below (no answer)
            return None

    def __call__(self, url: str, **kwargs: Any) -> HttpAnswer:
        if self.local or not url.startswith(self.base + "/"):
            return self.fetch(url, **kwargs)
        local = self._local_base()
        if local is None:
            link = self.hosts.links.get(self.host)
            if link is not None and not isinstance(link.conn, SSHConnection):
                return self.fetch(url, **kwargs)
            return HttpAnswer(0, "", f"no SSH connection to {self.host} to reach the router")
        return self.fetch(local + url[len(self.base) :], **kwargs)

    def close(self) -> None:
        with self._lock:
            if self._forward is not None:
                self._forward.close()
                self._forward = None

    def __enter__(self) -> AdminFetch:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
