"""`up`: preflight -> the hosts opened -> the weights pinned -> the plan -> UpRun (up_run.py:
pull, ship, converge once and apply it, prove, the endpoint), in the frame every command that
changes hosts runs in (frame.py: the lock, the cancellation token, Ctrl-C, the `done` event).
`up --plan` is the same path with apply off (Ansible's check mode): no lock, no preflight, no
secrets, the commit an earlier `up` pinned (no hub request), and UpRun stops once the change
plan is decided (planned_change.py), shows it and changes nothing. Both engine tiers start
at once: NIXL needs nothing from the other tier at start-up (decode handshakes lazily, at the
first request carrying a prefill's KV parameters). This module acts and emits events, never
prints.
"""

from __future__ import annotations

from dataclasses import replace

from pdboot.deploy.all_hosts import report_errors
from pdboot.deploy.frame import (
    Frame,
    HostsFactory,
    LockFactory,
    LockSpec,
    default_hosts,
    default_lock,
    run_framed,
)
from pdboot.deploy.preflight_gate import PreflightFn, read_records
from pdboot.deploy.up_options import Confirm, UpEnv, UpOptions, UpStopped
from pdboot.deploy.up_run import UpRun
from pdboot.deploy.waits import Clock, MonotonicClock
from pdboot.deploy.weights.staging import Pinned, as_recorded, pin_weights, remove_oneshots
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
from pdboot.plan.facts import PlanFacts
from pdboot.plan.model import Plan
from pdboot.plan.weights.hub import is_hub_model
from pdboot.preflight.findings import (
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
    changes = ChangeOptions(live_workers(inv), opts.rolling, opts.rollback)

    def body(frame: Frame) -> int:
        code = _up(frame, opts, changes, preflight, clk, fetch, confirm)
        if opts.plan_only:
            frame.summary = {EXIT_OK: "no changes", EXIT_CHANGES: "changes"}.get(code, "")
            if code == EXIT_CHANGES and not opts.detailed_exitcode:
                code = EXIT_OK  # as terraform plan: changes are a success unless asked
        return code

    return run_framed(
        "up",
        inv,
        emit,
        body,
        lock_spec=None if opts.plan_only else LockSpec(lock_factory, opts.no_wait),
        accept_new=opts.accept_new_host_keys,
        hosts_factory=hosts_factory,
        clock=clk,
        summary=None if opts.plan_only else _deployed_in,
    )


def _deployed_in(code: int, took: float) -> str:
    return f"deployed in {took:.1f}s" if code == EXIT_OK else ""


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
    token: dict[str, str] | None = None
    tls: tuple[str, str] | None = None
    if not opts.plan_only:  # a plan ships nothing: no secret is read
        try:
            token = read_secrets(inv) or None  # secrets.env's variables -> values
            pair = read_tls(inv)  # router.tls: shipped to the proxy (0600)
            tls = (pair.cert, pair.key) if pair is not None else None
        except SecretError as e:
            emit(Note(f"error: {e}", "error"))
            return EXIT_USAGE
    if token is not None:
        register_secrets(token)  # masked in anything pdboot logs or prints
    if is_hub_model(inv.model) and inv.weights.stage and not opts.plan_only:
        # Ctrl-C mid-pull: no staging or seed container (nor its secret) is left
        frame.at_close(lambda hosts: remove_oneshots(inv, hosts))
    try:
        # a plan runs no preflight: it reads what the last one recorded on the hosts
        findings = None if opts.plan_only else _preflight(inv, opts, emit, preflight)
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
) -> PlanFacts | None:
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
    findings: PlanFacts | None,
    env: UpEnv,
) -> int:
    emit = frame.emit
    if hosts.errors:
        report_errors(emit, "cannot reach", hosts.errors)
        return EXIT_FAILED
    try:
        if findings is None:
            # no preflight this run: what the last one recorded on each host
            findings, unread = read_records(inv, hosts)
            if unread and opts.plan_only:  # an unread record is not none: no false change
                report_errors(emit, "cannot read the RDMA record on", unread)
                return EXIT_FAILED
    except KeyboardInterrupt:
        emit(Interrupted(started=False))
        return EXIT_INTERRUPTED
    frame.token.check()
    pinned = _weights(inv, opts, hosts, env, emit)
    if pinned is None:
        return EXIT_FAILED
    inv, env = pinned.inventory, replace(env, weights=pinned)  # model_revision: the commit
    if pinned.moved and opts.rolling:  # one commit on both tiers, at every moment
        emit(Note("a new weights commit is not rolled: the changed engines restart at once"))
        opts, changes = replace(opts, rolling=False), replace(changes, rolling=False)
    plan = plan_from(inv, findings)
    # what starts, and on what: said by `up` when it starts (a plan shows its changes only)
    if not opts.plan_only and not _described(inv, opts, plan, findings, emit):
        return EXIT_FAILED
    run = UpRun(inv, plan, hosts, opts, emit, env, frame.token, changes, findings)
    try:
        return run.run()
    except UpStopped:
        return EXIT_FAILED
    except KeyboardInterrupt:
        if opts.plan_only:  # a plan started nothing
            emit(Interrupted(started=False))
        else:
            run.interrupted()
        return EXIT_INTERRUPTED
    finally:
        run.admin.close()


def _described(
    inv: Inventory, opts: UpOptions, plan: Plan, findings: PlanFacts, emit: Emit
) -> bool:
    """The plan in words (RDMA, NICs); False after an error: a count no preflight recorded."""
    if plan.unresolved:
        for line in plan.unresolved:
            emit(Note(f"error: {line}; run `up` with preflight (no count recorded)", "error"))
        return False
    for line in describe(inv, plan, findings, skipped=opts.skip_preflight) + describe_nics(plan):
        emit(Note(line))
    return True


def _weights(
    inv: Inventory, opts: UpOptions, hosts: Hosts, env: UpEnv, emit: Emit
) -> Pinned | None:
    """The commit this run deploys; with apply off, the one an earlier `up` pinned (no hub
    request: a plan asks nothing of the outside world)."""
    if opts.plan_only:
        inv, commit = as_recorded(inv, hosts)
        if commit:
            emit(Note(f"weights: {inv.model} at commit {commit} (pinned by an earlier up)"))
        return Pinned(inv, None)
    return pin_weights(inv, hosts, env.fetch, env.token, emit, opts.refresh_weights)
