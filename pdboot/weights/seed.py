"""`weights.seed: first_host`: the first engine host stages from the hub, then serves the
commit's part of its HF cache on `weights.seed_port` (a one-shot container from the engine
image, bound to its advertised address, weights/script.SERVE_SCRIPT) while every other engine
host fetches it from there over the hosts' own network, never through the operator's
machine. Each fetching host then runs the same completeness check as staging (every file
at the hub's size) and its digest of config.json + the index must equal the first host's
(the host that differs is named). The server is removed once every other host is done.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from pdboot.inventory.rules import advertised_address
from pdboot.plan.model import HF_CACHE_IN_CONTAINER
from pdboot.transport.hosts import Link
from pdboot.weights.script import SERVE_SCRIPT

if TYPE_CHECKING:
    from pdboot.weights.stage import Stager

WAIT_FOR_FIRST_S = 24 * 3600.0  # bounded by the pull step's own deadline in practice


class SeedError(Exception):
    """Seeding failed on a host (the message names the host that differs or failed)."""


class Seeder:
    def __init__(self, stager: Stager, hosts: list[str]) -> None:
        self.stager, self.first, self.others = stager, hosts[0], hosts[1:]
        inv = stager.inv
        self.address = advertised_address(inv.hosts[self.first])
        self.port = inv.weights.seed_port
        self.name = f"pdboot-seed-{inv.name}"
        self.served = threading.Event()  # set when the first host serves, or failed to
        self.finished = threading.Event()  # set when every other host is done
        self.lock = threading.Lock()
        self.left = len(self.others)
        self.first_digest = ""
        self.first_error = ""

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/{self.stager.res.commit}.tar"

    def on_host(self, host: str, link: Link) -> None:
        if host == self.first:
            self._serve(link)
        else:
            self._fetch(host, link)

    def _serve(self, link: Link) -> None:
        inv, res = self.stager.inv, self.stager.res
        try:
            self.first_digest = self.stager.stage_host(self.first, link.engine)
            link.engine.run_once(["docker", "rm", "-f", self.name], 60)  # an earlier run's
            argv = [
                "docker", "run", "-d", "--rm", "--name", self.name, "--network", "host",
                "-v", self.stager.bind(), "-e", f"HF_HOME={HF_CACHE_IN_CONTAINER}",
                "--label", f"pdboot.oneshot={self.name}", "--entrypoint", "python3",
                inv.image, "-c", SERVE_SCRIPT, self.address, str(self.port), inv.model,
                res.commit,
            ]  # fmt: skip
            rc, out = link.engine.run_once(argv, 120)
            if rc != 0:
                raise SeedError(f"cannot start the seed server on {self.first}: {out[-300:]}")
        except Exception as e:
            self.first_error = str(e)
            raise
        finally:
            self.served.set()
        try:
            self.finished.wait(WAIT_FOR_FIRST_S)
        finally:
            link.engine.run_once(["docker", "rm", "-f", self.name], 60)

    def _fetch(self, host: str, link: Link) -> None:
        try:
            self.served.wait(WAIT_FOR_FIRST_S)
            if self.first_error:
                raise SeedError(f"the seed host {self.first} failed: {self.first_error}")
            digest = self.stager.seed_host(host, link.engine, self.url)
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
