"""What `up` does on all the hosts of the plan at once: pull the images, ship the compose
project, start services, stop the watch service for its changes. Each runs the hosts in
parallel with a deadline, emits what happened per host and returns the hosts that failed
(host -> message); `up` decides what follows. ``report_errors`` shows such a failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from pdboot.deploy.frame import NEVER_CANCELLED, CancelToken
from pdboot.events import Emit, HostErrors, PullDone, PullProgress, ServiceStarted
from pdboot.inventory.schema import Inventory
from pdboot.plan.converge import Step
from pdboot.plan.model import Plan
from pdboot.plan.render import render_host
from pdboot.plan.watch.sidecar import WATCH_INVENTORY, watch_inventory_text
from pdboot.preflight.findings import RECORD_FILE
from pdboot.transport.docker_parse import PullProgress as EnginePull
from pdboot.transport.fanout import in_thread
from pdboot.transport.hosts import Hosts, Link

OP_DEADLINE = 300.0  # compose up / stop of one host's services

Errors = dict[str, str]


def report_errors(emit: Emit, what: str, errors: Mapping[str, str]) -> None:
    if errors:
        emit(HostErrors(what, tuple(sorted(errors.items()))))


def pull_all(
    hosts: Hosts,
    wanted: Mapping[str, Sequence[str]],
    emit: Emit,
    deadline: float,
    then: tuple[str, Callable[[str, Link], None]] | None = None,
    record_dir: str | None = None,
    *,
    token: CancelToken = NEVER_CANCELLED,
) -> Errors:
    """Every host pulls its images (``wanted``: host -> images), streaming progress. Hosts
    not in ``wanted`` (in no tier any more; `up` visits them for what is left there) pull
    nothing. ``then`` (image, fn): that image first, then fn(host, link) in a thread while
    the host's other images pull (the weights staging, which runs in the engine image); its
    failure is the host's. ``record_dir``: the project dir whose record of pulled images
    (pdboot/transport/pulled_record.py) gets what was pulled, for `down --purge`.
    ``token``: checked by each host's thread at every progress report and before each image
    (a lost lock stops the pulls; the caller checks it again before reporting errors)."""

    def pull_host(host: str, link: Link) -> None:
        after = None
        pulled: list[tuple[str, str]] = []
        first = then[0] if then is not None else None
        for img in sorted(wanted[host], key=lambda i: i != first):
            token.check()
            done = [0]
            t0 = time.monotonic()

            def on_progress(p: EnginePull, img: str = img, done: list[int] = done) -> None:
                done[0] = p.done
                token.check()
                emit(PullProgress(host, img, p.done, p.total, p.status))

            r = link.engine.pull(img, on_progress)
            took = time.monotonic() - t0
            emit(PullDone(host, img, r.pulled, r.digest, done[0], took))
            if r.pulled and r.digest:
                pulled.append((img, r.digest))
                if record_dir is not None:  # at once: a later pull's failure keeps it
                    link.engine.record_pulled(record_dir, pulled[-1:])
            if then is not None and img == first:
                after = in_thread(lambda: then[1](host, link))
        if after is not None:
            after()

    return hosts.each(pull_host, deadline, only=list(wanted))[1]


def ship_all(
    hosts: Hosts,
    plan: Plan,
    project_dir: str,
    secrets: str | None,
    records: Mapping[str, str],
    inv: Inventory | None = None,
    extra_files: Mapping[str, Mapping[str, str]] | None = None,
) -> Errors:
    """compose.yaml (the plan rendered, a pure function of it) to every host; the secrets file
    only where a service uses secrets; the preflight record where there is one; the inventory
    the watch service loads beside its compose.yaml (``inv``: the one the plan came from)."""
    texts = {h: render_host(plan, h) for h in plan.hosts}
    watch_inventory = watch_inventory_text(inv) if inv is not None and plan.watch else None

    def ship_host(host: str, link: Link) -> None:
        needs = any(s.uses_secrets for s in plan.hosts[host].services)
        extra = {RECORD_FILE: records[host]} if host in records else {}
        if watch_inventory is not None and plan.watch is not None and plan.watch.host == host:
            extra[WATCH_INVENTORY] = watch_inventory
        extra.update((extra_files or {}).get(host, {}))  # e.g. the weights pin
        link.engine.ship(project_dir, texts[host], secrets if needs else None, extra or None)

    return hosts.each(ship_host, OP_DEADLINE, only=list(plan.hosts))[1]


def start_all(
    hosts: Hosts, plan: Plan, project_dir: str, steps: Sequence[Step], emit: Emit
) -> Errors:
    """Every service of these steps at once: hosts in parallel, and a host's services in one
    `compose up` each for recreated, then new ones (compose starts them in parallel; it
    returns once the containers run, loading happens afterwards)."""
    todo: dict[str, list[Step]] = {}
    for s in steps:
        if s.kind != "unchanged":
            todo.setdefault(s.service.host, []).append(s)
    if not todo:
        return {}

    def start_host(host: str, link: Link) -> None:
        # Recreations first: each frees its old container's ports and GPU memory, which a
        # service created in this run may take (a port or GPUs moved to another engine;
        # preflight passed them as "up replaces it").
        for recreate in (True, False):
            batch = [s for s in todo[host] if (s.kind == "recreate") == recreate]
            if not batch:
                continue
            names = [s.service.name for s in batch]
            link.engine.compose_up(
                project_dir,
                plan.hosts[host].project,
                names[0] if len(names) == 1 else names,
                recreate=recreate,
                timeout=OP_DEADLINE,
            )
            for s in batch:
                emit(ServiceStarted(s.service.key, recreate))

    return hosts.each(start_host, OP_DEADLINE, only=todo)[1]


def watch_held_back(hosts: Hosts, steps: Sequence[Step], emit: Emit) -> list[Step]:
    """The watch service's steps for the end of `up`, its running container removed now. Up's
    changes and watch both act on the router's worker list (watch would evict an engine up is
    replacing, and re-add it), and watch's canaries, their decode-alone prompts computed on
    the decode, would count in the KV proof's window as KV that never arrived."""
    running = [s.current for s in steps if s.current is not None]
    by_host: dict[str, list[str]] = {}
    for o in running:
        by_host.setdefault(o.host, []).append(o.id)
    if by_host:
        _, errors = hosts.each(
            lambda h, link: link.engine.stop_remove(by_host[h]), OP_DEADLINE, only=by_host
        )
        if errors:  # it keeps running: the proof may misread its canaries
            report_errors(emit, "cannot stop watch for up's changes and checks on", errors)
            return [s for s in steps if s.kind == "create"]
    why = "started after up's changes and checks"
    return [replace(s, kind="create", reason=why, current=None) for s in steps]
