"""Staging, the I/O: pin the deployment to one commit, then fetch it into every engine host's
HF cache once (never once per engine) with a one-shot container from the engine image
running the image's own huggingface_hub (plan/weights/programs.py), reporting byte progress.

`up` calls `pin_weights` once its hosts are open (before the pulls) and `Stager.stage_host`
on each engine host as soon as that host has the engine image; `pdboot stage` runs both on
their own. Decisions are pure (hub.py, pin.py, progress.py); this module acts and emits.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pdboot.deploy.weights.seed import Seeder
from pdboot.deploy.weights.workdir import check_cache_dir
from pdboot.events import Emit, Note, WeightsDone, WeightsPinned, WeightsProgress
from pdboot.inventory.rules import engine_hosts as engine_hosts  # its home moved
from pdboot.inventory.schema import Inventory
from pdboot.plan.model import HF_CACHE_IN_CONTAINER
from pdboot.plan.weights.hub import (
    HubProblem,
    Resolution,
    hub_endpoint,
    is_hub_model,
)
from pdboot.plan.weights.pin import PIN_FILE, Pin, choose
from pdboot.plan.weights.programs import SECRET_FILE, STAGE_SCRIPT
from pdboot.plan.weights.progress import StageState, parse_line
from pdboot.transport import docker_cli
from pdboot.transport.hosts import Hosts, Link, project_dir
from pdboot.transport.http import HttpFn
from pdboot.transport.hub import resolve

PROGRESS_EVERY_S = 0.5


class StageError(Exception):
    """Staging failed on a host (the message says why, without secrets)."""


class Staging:
    """What `up` asks of the weights during the pull and the ship: here, nothing."""

    def after_pull(
        self, secrets: Mapping[str, str] | None, emit: Emit
    ) -> tuple[str, Callable[[str, Link], None]] | None:
        """(image, fn): fn(host, link) runs once that host has the image (deploy/all_hosts.py)."""
        return None

    def pin_files(self) -> dict[str, dict[str, str]]:
        """Engine host -> files to ship beside compose.yaml."""
        return {}


NOTHING_STAGED = Staging()


@dataclass(frozen=True)
class Pinned(Staging):
    """The deployment's weights for this run: the inventory with model_revision set to the
    commit (what the plan renders), and what staging fetches."""

    inventory: Inventory
    resolution: Resolution | None  # None: nothing to stage (a local path, or stage: false)
    # the commit changes this run: never rolled engine by engine, or prefill and decode
    # would run two commits meanwhile (up recreates the changed engines at once)
    moved: bool = False

    def after_pull(
        self, secrets: Mapping[str, str] | None, emit: Emit
    ) -> tuple[str, Callable[[str, Link], None]] | None:
        if self.resolution is None:
            return None
        stager = Stager(self.inventory, self.resolution, hf_token(secrets), emit)
        hosts = engine_hosts(self.inventory)
        if self.inventory.weights.seed == "first_host" and len(hosts) > 1:
            return stager.image, Seeder(stager, hosts).on_host
        return stager.image, stager.on_host

    def pin_files(self) -> dict[str, dict[str, str]]:
        text = self.pin_text
        if text is None:
            return {}
        return {h: {PIN_FILE: text} for h in engine_hosts(self.inventory)}

    @property
    def pin_text(self) -> str | None:
        r = self.resolution
        if r is None:
            return None
        return Pin(self.inventory.model, r.revision, r.commit).text()


def with_stage_image(
    wanted: Mapping[str, Sequence[str]], image: str, inv: Inventory
) -> dict[str, list[str]]:
    """Host -> images to pull, the staging image added on every engine host: pull_all pulls
    it first and starts staging right after it, while the host's other images pull."""
    engines = set(engine_hosts(inv))
    return {
        h: ([image] if h in engines and image not in imgs else []) + list(imgs)
        for h, imgs in wanted.items()
    }


def hf_token(secrets: Mapping[str, str] | None) -> str | None:
    return (secrets or {}).get("HF_TOKEN")


def pin_weights(
    inv: Inventory,
    hosts: Hosts,
    fetch: HttpFn,
    secrets: Mapping[str, str] | None,
    emit: Emit,
    refresh: bool = False,
) -> Pinned | None:
    """Resolve the inventory's revision once (from here, with the secrets' HF token), keep a
    recorded pin unless asked (pin.py), and return the inventory pinned to that commit;
    None after an error event."""
    token = hf_token(secrets)
    if not is_hub_model(inv.model) or not inv.weights.stage:
        return Pinned(inv, None)
    endpoint = hub_endpoint(inv.weights.endpoint)
    recorded = recorded_pins(inv, hosts)
    plain = inv.weights.allow_plain_http
    now = resolve(fetch, endpoint, inv.model, inv.model_revision, token, plain)
    choice = choose(
        recorded,
        inv.model,
        inv.model_revision,
        now.commit if isinstance(now, Resolution) else None,
        refresh,
    )
    if choice.commit is None:
        why = f"{now.message} ({now.fix})" if isinstance(now, HubProblem) else choice.error
        emit(Note(f"error: weights: {why}", "error"))
        return None
    for line in choice.notes:
        emit(Note(line, "warn"))
    if isinstance(now, Resolution) and now.commit == choice.commit:
        res = now
    else:  # the recorded commit: its own file list (a commit is immutable)
        again = resolve(fetch, endpoint, inv.model, choice.commit, token, plain)
        if isinstance(again, HubProblem):
            emit(Note(f"error: weights: {again.message} ({again.fix})", "error"))
            return None
        res = dataclasses.replace(again, revision=inv.model_revision)
    emit(WeightsPinned(inv.model, inv.model_revision, res.commit, res.size))
    return Pinned(pinned_inventory(inv, res.commit), res, choice.moved)


def pinned_inventory(inv: Inventory, commit: str) -> Inventory:
    """The inventory as `up` plans it once pinned: model_revision the commit, the hub
    endpoint spelled out (the engines get it as HF_ENDPOINT)."""
    weights = inv.weights.model_copy(update={"endpoint": hub_endpoint(inv.weights.endpoint)})
    return inv.model_copy(update={"model_revision": commit, "weights": weights})


def recorded_pins(inv: Inventory, hosts: Hosts) -> dict[str, str | None]:
    """Engine host -> its weights.pin text (None: none, or the host is not open)."""

    def read(_h: str, link: Link) -> str | None:
        return link.engine.read_file(f"{project_dir(inv)}/{PIN_FILE}")

    wanted = [h for h in engine_hosts(inv) if h in hosts.links]
    values, _ = hosts.each(read, 60.0, only=wanted)
    return {h: values.get(h) for h in engine_hosts(inv)}


def as_recorded(inv: Inventory, hosts: Hosts) -> tuple[Inventory, str]:
    """For `status`: the inventory pinned to the commit the hosts record (no hub request),
    and that commit ("" when nothing is recorded)."""
    if not is_hub_model(inv.model) or not inv.weights.stage:
        return inv, ""
    choice = choose(recorded_pins(inv, hosts), inv.model, inv.model_revision, None)
    if choice.commit is None:
        return inv, ""
    return pinned_inventory(inv, choice.commit), choice.commit


ONESHOTS = ("pdboot-stage", "pdboot-seed")


class Stager:
    """Stages one commit on engine hosts; `stage_host` runs in that host's thread."""

    def __init__(self, inv: Inventory, res: Resolution, token: str | None, emit: Emit) -> None:
        self.inv, self.res, self.token, self.emit = inv, res, token, emit
        self.image = inv.weights.image or inv.image

    def container_name(self) -> str:
        return f"pdboot-stage-{self.inv.name}"

    def env(self) -> dict[str, str]:
        """The container's configuration: no secret in it (see `_run`)."""
        hashes = dict(self.res.hashes)
        files = [[f, n, hashes.get(f, "")] for f, n in self.res.files]
        return {
            "HF_HOME": HF_CACHE_IN_CONTAINER,
            "HF_ENDPOINT": hub_endpoint(self.inv.weights.endpoint),
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "PYTHONUNBUFFERED": "1",
            "PDBOOT_STAGE_FILES": json.dumps(files),
        }

    def on_host(self, host: str, link: Link) -> None:
        self.stage_host(host, link)

    def stage_host(self, host: str, link: Link) -> str:
        """From the hub; returns the digest of config.json + the index as staged."""
        return self._run(host, link, {}, {"hf_token": self.token} if self.token else {})

    def seed_host(self, host: str, link: Link, url: str, seed_token: str, ca: str) -> str:
        """From another host's seed server (weights/seed.py) instead of the hub: that host's
        seed token and certificate (the only one trusted), and no HF token (nothing is asked
        of the hub)."""
        secret = {"seed_token": seed_token, "seed_ca": ca}
        return self._run(host, link, {"PDBOOT_SEED_URL": url}, secret)

    def _run(
        self, host: str, link: Link, extra_env: Mapping[str, str], secret: Mapping[str, str]
    ) -> str:
        t0 = time.monotonic()
        state = StageState(total=self.res.size)
        tail: list[str] = []
        last = [0.0]

        def on_line(line: str) -> None:
            s = parse_line(line)
            if s is None:
                if line.strip():
                    tail[:] = [*tail[-19:], line]
                return
            state.update(s)
            now = time.monotonic()
            if s.kind in ("plan", "bytes") and (now - last[0] >= PROGRESS_EVERY_S):
                last[0] = now
                self.emit(WeightsProgress(host, state.done, state.total))

        check_cache_dir(link.conn, self.inv.container.hf_cache)
        rc = link.engine.run_streamed(
            self.container_name(),
            self.image,
            ["python3", "-c", STAGE_SCRIPT, self.inv.model, self.res.commit],
            {**self.env(), **extra_env},
            [self.bind()],
            on_line,
            {SECRET_FILE: json.dumps(dict(secret))},
        )
        if rc != 0 or not state.finished:
            why = state.error or (tail[-1] if tail else f"exit code {rc}")
            raise StageError(f"staging {self.inv.model}@{self.res.commit[:12]} failed: {why}")
        self.emit(
            WeightsDone(
                host,
                self.res.commit,
                state.cached,
                state.total,
                time.monotonic() - t0,
                state.client,
            )
        )
        return state.digest

    def bind(self, mode: str = "rw") -> str:
        return f"{self.inv.container.hf_cache}:{HF_CACHE_IN_CONTAINER}:{mode}"


def remove_oneshots(inv: Inventory, hosts: Hosts) -> dict[str, str]:
    """Remove this deployment's staging and seed containers (an interrupted run's, or an
    earlier one's) from its engine hosts: only containers pdboot labelled as its own one-shot
    ones. Host -> error."""
    names = [f"{n}-{inv.name}" for n in ONESHOTS]

    def remove(_h: str, link: Link) -> None:
        ids: list[str] = []
        for n in names:  # one label each: docker ANDs repeated labels
            res = link.conn.run(docker_cli.ids_with_label(f"pdboot.oneshot={n}"), timeout=60)
            ids += res.stdout.split() if res.rc == 0 else []
        if ids:
            link.conn.run(docker_cli.remove(*ids), timeout=60)

    wanted = [h for h in engine_hosts(inv) if h in hosts.links]
    return hosts.each(remove, 120.0, only=wanted)[1]
