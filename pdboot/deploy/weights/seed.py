"""`weights.seed: first_host`: the first engine host stages from the hub, then serves the
commit's part of its HF cache on `weights.seed_port` (a one-shot container, the cache
mounted read-only, plan/weights/programs.SERVE_SCRIPT) while every other engine host fetches it
from there over the hosts' own network, never through the operator's machine.

The server binds the first host's advertised address only, speaks TLS only, with a
certificate pdboot makes for the run (weights/seed_tls.py: its key goes to this server
alone, the certificate to the fetchers, which trust nothing else), and answers only a
fetcher that presents this run's random seed token (handed to both sides as a secret file,
never in a container's configuration), so neither the token nor the files cross the hosts'
network in cleartext. It is checked listening (its own line, printed once bound)
before any fetcher is started: a server that cannot bind exits, and staging fails, rather
than another process on the port serving. Each fetching host checks every file against the
hub's hash (plan/weights/programs.py), and its digest of config.json + the index must equal the
first host's. The server is removed once every other host is done, on Ctrl-C (the caller's
`remove_oneshots`) and by `down`.
"""

from __future__ import annotations

import json
import secrets
import threading
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from pdboot.deploy.weights.seed_tls import make_seed_cert
from pdboot.inventory.rules import advertised_address
from pdboot.plan.model import HF_CACHE_IN_CONTAINER
from pdboot.plan.weights.programs import SECRET_FILE, SERVE_SCRIPT
from pdboot.transport import docker_cli
from pdboot.transport.hosts import Link
from pdboot.transport.masking import register_secret

if TYPE_CHECKING:
    from pdboot.deploy.weights.staging import Stager

WAIT_FOR_FIRST_S = 24 * 3600.0  # bounded by the pull step's own deadline in practice
LISTEN_TIMEOUT_S = 120.0
LISTENING = "PDBOOT-SEED listening"


class SeedError(Exception):
    """Seeding failed on a host (the message names the host that differs or failed)."""


class Seeder:
    def __init__(self, stager: Stager, hosts: list[str]) -> None:
        self.stager, self.first, self.others = stager, hosts[0], hosts[1:]
        inv = stager.inv
        self.address = advertised_address(inv.hosts[self.first])
        self.port = inv.weights.seed_port
        self.name = f"pdboot-seed-{inv.name}"
        self.token = secrets.token_urlsafe(32)  # this run's: fetchers present it
        register_secret(self.token)
        self.tls = make_seed_cert(self.address, datetime.now(timezone.utc))
        register_secret(self.tls.key)
        self.served = threading.Event()  # set when the first host serves, or failed to
        self.finished = threading.Event()  # set when every other host is done
        self.lock = threading.Lock()
        self.left = len(self.others)
        self.first_digest = ""
        self.first_error = ""

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"https://{host}:{self.port}/{self.stager.res.commit}.tar"

    def on_host(self, host: str, link: Link) -> None:
        if host == self.first:
            self._serve(link)
        else:
            self._fetch(host, link)

    def _serve(self, link: Link) -> None:
        server: threading.Thread | None = None
        try:
            self.first_digest = self.stager.stage_host(self.first, link)
            server = self._start_server(link)
        except Exception as e:
            self.first_error = str(e)
            raise
        finally:
            self.served.set()
        try:
            self.finished.wait(WAIT_FOR_FIRST_S)
        finally:
            link.engine.run_once(docker_cli.remove(self.name), 60)
            if server is not None:
                server.join(60)

    def _start_server(self, link: Link) -> threading.Thread:
        """The server in a thread (its output streamed); returns once it listens."""
        inv = self.stager.inv
        seen = threading.Event()
        gone: list[str] = []
        tail: list[str] = []

        def on_line(line: str) -> None:
            if line.startswith(LISTENING):
                seen.set()
            elif line.strip():
                tail[:] = [*tail[-9:], line]

        def run() -> None:
            try:
                rc = link.engine.run_streamed(
                    self.name,
                    self.stager.image,
                    ["python3", "-c", SERVE_SCRIPT, self.address, str(self.port), inv.model,
                     self.stager.res.commit],
                    {"HF_HOME": HF_CACHE_IN_CONTAINER, "PYTHONUNBUFFERED": "1"},
                    [self.stager.bind("ro")],
                    on_line,
                    {SECRET_FILE: json.dumps({"seed_token": self.token,
                                              "tls_cert": self.tls.cert,
                                              "tls_key": self.tls.key})},
                )  # fmt: skip
                gone.append(f"exit code {rc}")
            except Exception as e:
                gone.append(str(e))
            finally:
                seen.set()  # wake the waiter: the server is gone

        t = threading.Thread(target=run, daemon=True, name="pdboot-seed")
        t.start()
        seen.wait(LISTEN_TIMEOUT_S)
        if gone or not seen.is_set():
            why = tail[-1] if tail else (gone[0] if gone else "no answer")
            raise SeedError(
                f"the seed server on {self.first} is not listening on "
                f"{self.address}:{self.port}: {why}"
            )
        return t

    def _fetch(self, host: str, link: Link) -> None:
        try:
            self.served.wait(WAIT_FOR_FIRST_S)
            if self.first_error:
                raise SeedError(f"the seed host {self.first} failed: {self.first_error}")
            digest = self.stager.seed_host(host, link, self.url, self.token, self.tls.cert)
            if digest != self.first_digest:
                raise SeedError(
                    f"{host}'s copy differs from {self.first}'s (config.json + index sha256 "
                    f"{digest[:12]} vs {self.first_digest[:12]})"
                )
        finally:
            with self.lock:
                self.left -= 1
                if self.left == 0:
                    self.finished.set()
