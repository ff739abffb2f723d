"""`up`: preflight -> the hosts opened -> the weights pinned -> the plan -> UpRun (up_run.py:
pull, ship, converge once and apply it, prove, the endpoint), in the frame every command that
changes hosts runs in (frame.py: the lock, the cancellation token, Ctrl-C, the `done` event).
`up --plan` runs in the same frame without the lock and prints the same change plan
(changes.py). Both engine tiers start at once: NIXL needs nothing from the other tier at
start-up (decode handshakes lazily, at the first request carrying a prefill's KV
parameters). This module acts and emits events, never prints.
"""

from __future__ import annotations

import os
from dataclasses import replace

from pdboot.deploy.changes import ROUTER_RECREATE_ENV, plan_only
from pdboot.deploy.frame import Frame, LockSpec, run_framed
from pdboot.deploy.seams import (
    HostsFactory,
    LockFactory,
    PreflightFn,
    default_hosts,
    default_lock,
    recorded_findings,
    report_errors,
)
from pdboot.deploy.up_options import Confirm, UpEnv, UpOptions, UpStopped
from pdboot.deploy.up_run import UpRun
from pdboot.deploy.waits import Clock, MonotonicClock
from pdboot.deploy.weights.staging import pin_weights, remove_oneshots
from pdboot.events import (
    Emit,
    Interrupted,
    Note,
    PreflightDone,
    StageStarted,
)
from pdboot.exitcodes import EXIT_CHANGES, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from pdboot.inventory.rules import deployment_hosts, live_workers
from pdboot.inventory.schema import Inventory
from pdboot.plan.change_plan import ChangeOptions
from pdboot.plan.weights.hub import is_hub_model
from pdboot.preflight.findings import (
    Findings,
    describe,
    describe_nics,
    plan_from,
)
from pdboot.transport.hosts import (
    Hosts,
    SecretError,
    read_secrets,
    register_secrets,
)
from pdboot.transport.http import HttpFn, http
from pdboot.transport.tls_files import read_tls


def up(
    inv: Inventory,
    opts: UpOptions,
    emit: Emit,
    *,
    preflight: PreflightFn | None = None,
    clock: Clock | None = None,
    hosts_factory: HostsFactory = default_hosts,
    fetch: HttpFn = http,
    lock_factory: LockFactory = default_lock,
    confirm: Confirm | None = None,
) -> int:
    """Run `up`, emitting events; returns the exit code (also in the final Done event).
    The deployment lock is held from before preflight to the end (Ctrl-C included);
    `--plan` changes nothing and takes no lock. ``confirm``: asked (with the outages, in
    words) before a tier that cannot roll is replaced without --yes; None: refuse."""
    clk = clock or MonotonicClock()
    # PDBOOT_BENCH_ROUTER_RECREATE (changes.py): the bench's baseline recreates the router
    swap = os.environ.get(ROUTER_RECREATE_ENV, "") != "1"
    changes = ChangeOptions(live_workers(inv), opts.rolling, opts.rollback, swap)
    if opts.plan_only:

        def plan_body(frame: Frame) -> int:
            code = plan_only(frame, changes)
            frame.summary = {EXIT_OK: "no changes", EXIT_CHANGES: "changes"}.get(code, "")
            if code == EXIT_CHANGES and not opts.detailed_exitcode:
                code = EXIT_OK  # as terraform plan: changes are a success unless asked
            return code

        return run_framed(
            "up", inv, emit, plan_body, lock_spec=None, accept_new=opts.accept_new_host_keys,
            hosts_factory=hosts_factory, clock=clk,
        )  # fmt: skip
    return run_framed(
        "up",
        inv,
        emit,
        lambda frame: _up(frame, opts, changes, preflight, clk, fetch, confirm),
        lock_spec=LockSpec(lock_factory, opts.no_wait),
        accept_new=opts.accept_new_host_keys,
        hosts_factory=hosts_factory,
        clock=clk,
        summary=lambda code, took: f"deployed in {took:.1f}s" if code == EXIT_OK else "",
    )


def _up(
    frame: Frame,
    opts: UpOptions,
    changes: ChangeOptions,
    preflight: PreflightFn | None,
    clock: Clock,
    fetch: HttpFn,
    confirm: Confirm | None = None,
) -> int:
    inv, emit = frame.inv, frame.emit
    try:
        token = read_secrets(inv) or None  # secrets.env's variables -> values
        pair = read_tls(inv)  # router.tls: shipped to the proxy (0600)
        tls = (pair.cert, pair.key) if pair is not None else None
    except SecretError as e:
        emit(Note(f"error: {e}", "error"))
        return EXIT_USAGE
    if token is not None:
        register_secrets(token)  # masked in anything pdboot logs or prints
    if is_hub_model(inv.model) and inv.weights.stage:
        # Ctrl-C mid-pull: no staging or seed container (nor its secret) is left
        frame.at_close(lambda hosts: remove_oneshots(inv, hosts))
    try:
        findings = _preflight(inv, opts, emit, preflight)
        frame.token.check()
        hosts = frame.open(deployment_hosts(inv), former=True)
    except UpStopped:
        return EXIT_FAILED
    except KeyboardInterrupt:
        emit(Interrupted(started=False))
        return EXIT_INTERRUPTED
    env = UpEnv(clock, fetch, token, confirm, tls=tls)
    return _on_hosts(inv, opts, changes, frame, hosts, findings, env)


def _preflight(
    inv: Inventory, opts: UpOptions, emit: Emit, preflight: PreflightFn | None
) -> Findings | None:
    if opts.skip_preflight or preflight is None:
        emit(PreflightDone(ok=True, skipped=True))
        return None
    emit(StageStarted("preflight"))
    outcome = preflight(inv, opts.accept_new_host_keys)
    emit(PreflightDone(ok=outcome.ok))
    if not outcome.ok:
        raise UpStopped
    return outcome.rdma


def _on_hosts(
    inv: Inventory,
    opts: UpOptions,
    changes: ChangeOptions,
    frame: Frame,
    hosts: Hosts,
    findings: Findings | None,
    env: UpEnv,
) -> int:
    emit = frame.emit
    if hosts.errors:
        report_errors(emit, "cannot reach", hosts.errors)
        return EXIT_FAILED
    try:
        if findings is None:
            # no preflight this run: what the last one recorded on each host
            findings = recorded_findings(inv, hosts)
    except KeyboardInterrupt:
        emit(Interrupted(started=False))
        return EXIT_INTERRUPTED
    frame.token.check()
    pinned = pin_weights(inv, hosts, env.fetch, env.token, emit, opts.refresh_weights)
    if pinned is None:
        return EXIT_FAILED
    inv, env = pinned.inventory, replace(env, weights=pinned)  # model_revision: the commit
    if pinned.moved and opts.rolling:  # one commit on both tiers, at every moment
        emit(Note("a new weights commit is not rolled: the changed engines restart at once"))
        opts, changes = replace(opts, rolling=False), replace(changes, rolling=False)
    plan = plan_from(inv, findings)
    if plan.unresolved:
        for line in plan.unresolved:
            emit(Note(f"error: {line}; run `up` with preflight (no count recorded)", "error"))
        return EXIT_FAILED
    for line in describe(inv, plan, findings, skipped=opts.skip_preflight) + describe_nics(plan):
        emit(Note(line))
    run = UpRun(inv, plan, hosts, opts, emit, env, frame.token, changes, findings)
    try:
        run.run()
    except UpStopped:
        return EXIT_FAILED
    except KeyboardInterrupt:
        run.interrupted()
        return EXIT_INTERRUPTED
    finally:
        run.admin.close()
    return EXIT_OK
