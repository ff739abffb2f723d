"""`pdboot stage INVENTORY`: the weights step of `up` on its own (pin, pull the engine
image, stage on every engine host), under the deployment lock; nothing is started. The
pin is recorded only by `up` (beside the compose project it ships): a later `up` of a
moved branch asks the hub again unless an earlier `up` pinned it."""

from __future__ import annotations

import time
from collections.abc import Mapping

from pdboot.deploy.actions import pull_all
from pdboot.deploy.lockguard import under_lock
from pdboot.deploy.seams import (
    HostsFactory,
    LockFactory,
    default_hosts,
    default_lock,
    report_errors,
    take_lock,
)
from pdboot.events import Done, Emit, Note, StageStarted
from pdboot.exitcodes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from pdboot.inventory.schema import Inventory
from pdboot.transport.hosts import Hosts, SecretError, read_secrets, register_secrets
from pdboot.transport.http import HttpFn, http
from pdboot.weights.stage import engine_hosts, pin_weights, remove_oneshots, with_stage_image


def stage(
    inv: Inventory,
    emit: Emit,
    *,
    refresh: bool = False,
    accept_new_host_keys: bool = False,
    no_wait: bool = False,
    hosts_factory: HostsFactory = default_hosts,
    fetch: HttpFn = http,
    lock_factory: LockFactory = default_lock,
) -> int:
    t0 = time.monotonic()
    held = take_lock(
        emit, lock_factory, inv, "stage", no_wait=no_wait, accept_new=accept_new_host_keys
    )
    if isinstance(held, int) or held is None:
        code = held or EXIT_FAILED
    else:
        try:  # as `up`: a lost lock stops it with an error (deploy/lockguard.py)
            code = under_lock(emit, held, inv.router.host, "stage", lambda checked: _stage(
                inv, checked, refresh, accept_new_host_keys, hosts_factory, fetch))  # fmt: skip
        except KeyboardInterrupt:
            code = EXIT_INTERRUPTED
    took = time.monotonic() - t0
    emit(Done("stage", code, took, f"staged in {took:.1f}s" if code == EXIT_OK else ""))
    return code


def _stage(
    inv: Inventory,
    emit: Emit,
    refresh: bool,
    accept_new: bool,
    hosts_factory: HostsFactory,
    fetch: HttpFn,
) -> int:
    try:
        secrets = read_secrets(inv) or None
    except SecretError as e:
        emit(Note(f"error: {e}", "error"))
        return EXIT_USAGE
    if secrets:
        register_secrets(secrets)
    hosts = hosts_factory(inv, engine_hosts(inv), accept_new)
    try:
        return _on_hosts(inv, emit, refresh, hosts, fetch, secrets)
    finally:  # Ctrl-C, or a host given up on: no staging or seed container is left
        remove_oneshots(inv, hosts)
        hosts.close()


def _on_hosts(
    inv: Inventory,
    emit: Emit,
    refresh: bool,
    hosts: Hosts,
    fetch: HttpFn,
    secrets: Mapping[str, str] | None,
) -> int:
    if hosts.errors:
        report_errors(emit, "cannot reach", hosts.errors)
        return EXIT_FAILED
    pinned = pin_weights(inv, hosts, fetch, secrets, emit, refresh)
    if pinned is None:
        return EXIT_FAILED
    if pinned.resolution is None:
        emit(Note("nothing to stage: a local model path, or weights.stage is false"))
        return EXIT_OK
    then = pinned.after_pull(secrets, emit)  # staging, or seeding from the first host
    wanted = {h: [inv.image] for h in engine_hosts(inv)}
    if then is not None:  # the staging image first: staging overlaps the engine image's pull
        wanted = with_stage_image(wanted, then[0], inv)
    emit(StageStarted("pull", tuple(f"{h}: {inv.image}" for h in wanted)))
    errors = pull_all(hosts, wanted, emit, inv.timeouts.pull_seconds, then)
    if errors:
        report_errors(emit, "staging failed on", errors)
        return EXIT_FAILED
    return EXIT_OK
