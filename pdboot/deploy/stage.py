"""`pdboot stage INVENTORY`: the weights step of `up` on its own (pin, pull the engine
image, stage on every engine host), under the deployment lock; nothing is started. The
pin is recorded only by `up` (beside the compose project it ships): a later `up` of a
moved branch asks the hub again unless an earlier `up` pinned it."""

from __future__ import annotations

from collections.abc import Mapping

from pdboot.deploy.all_hosts import pull_all, report_errors
from pdboot.deploy.frame import (
    CancelToken,
    Frame,
    HostsFactory,
    LockFactory,
    LockSpec,
    default_hosts,
    default_lock,
    run_framed,
)
from pdboot.deploy.weights.staging import (
    engine_hosts,
    pin_weights,
    remove_oneshots,
    with_stage_image,
)
from pdboot.events import Emit, Note, StageStarted
from pdboot.exitcodes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from pdboot.inventory.schema import Inventory
from pdboot.transport.hosts import Hosts, SecretError, read_secrets, register_secrets
from pdboot.transport.http import HttpFn, http


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
    """As `up`: under the deployment lock, a lost lock stops it with an error, Ctrl-C is
    exit 130 (deploy/frame.py)."""
    return run_framed(
        "stage",
        inv,
        emit,
        lambda frame: _stage(frame, refresh, fetch),
        lock_spec=LockSpec(lock_factory, no_wait),
        accept_new=accept_new_host_keys,
        hosts_factory=hosts_factory,
        summary=lambda code, took: f"staged in {took:.1f}s" if code == EXIT_OK else "",
    )


def _stage(frame: Frame, refresh: bool, fetch: HttpFn) -> int:
    inv, emit = frame.inv, frame.emit
    try:
        secrets = read_secrets(inv) or None
    except SecretError as e:
        emit(Note(f"error: {e}", "error"))
        return EXIT_USAGE
    if secrets:
        register_secrets(secrets)
    # Ctrl-C, or a host given up on: no staging or seed container is left
    frame.at_close(lambda hosts: remove_oneshots(inv, hosts))
    hosts = frame.open(engine_hosts(inv))
    return _on_hosts(inv, emit, frame.token, refresh, hosts, fetch, secrets)


def _on_hosts(
    inv: Inventory,
    emit: Emit,
    token: CancelToken,
    refresh: bool,
    hosts: Hosts,
    fetch: HttpFn,
    secrets: Mapping[str, str] | None,
) -> int:
    if hosts.errors:
        report_errors(emit, "cannot reach", hosts.errors)
        return EXIT_FAILED
    token.check()
    pinned = pin_weights(inv, hosts, fetch, secrets, emit, refresh)
    if pinned is None:
        return EXIT_FAILED
    if pinned.resolution is None:
        emit(Note("nothing to stage: a local model path, or weights.stage is false"))
        return EXIT_OK
    token.check()
    # staging, or seeding from the first host: its thread stops at its next report once the
    # lock is lost
    then = pinned.after_pull(secrets, token.checking(emit))
    wanted = {h: [inv.image] for h in engine_hosts(inv)}
    if then is not None:  # the staging image first: staging overlaps the engine image's pull
        wanted = with_stage_image(wanted, then[0], inv)
    emit(StageStarted("pull", tuple(f"{h}: {inv.image}" for h in wanted)))
    errors = pull_all(hosts, wanted, emit, inv.timeouts.pull_seconds, then, token=token)
    token.check()  # a host's pull stopped by a lost lock is not a failed staging
    if errors:
        report_errors(emit, "staging failed on", errors)
        return EXIT_FAILED
    return EXIT_OK
