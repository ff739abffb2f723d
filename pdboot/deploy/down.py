"""`down`: router, then prefill, then decode, each tier on all its hosts in parallel, only
containers carrying this deployment's labels. Also the teardown `up --rollback` uses.

The prefills stop only once no decode pulls KV from them (deploy/drain.py's rule, as a roll
drains a prefill): with the proxy and router already gone nothing new starts, and a decode
whose prefill vanished in the middle of a pull can crash (NIXL below 1.5,
preflight/image_args.py's warning) or fail that request; at most timeouts.drain_seconds."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from pdboot.deploy.all_hosts import OP_DEADLINE, report_errors
from pdboot.deploy.drain import drain
from pdboot.deploy.frame import (
    NEVER_CANCELLED,
    CancelToken,
    Frame,
    HostsFactory,
    LockFactory,
    LockSpec,
    default_hosts,
    default_lock,
    run_framed,
)
from pdboot.deploy.waits import Clock, MonotonicClock
from pdboot.deploy.weights.staging import remove_oneshots
from pdboot.events import Emit, Note, StageStarted, Stopped
from pdboot.exitcodes import EXIT_FAILED, EXIT_OK
from pdboot.inventory.rules import deployment_hosts
from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.plan.converge import Observed, plan_down
from pdboot.plan.model import PRIVATE_FILES, SECRETS_FILE, STOP_GRACE_S, Plan, Role
from pdboot.transport.hosts import Hosts, Link, project_dir
from pdboot.transport.http import HttpFn, http
from pdboot.transport.pulled_record import to_purge


@dataclass(frozen=True)
class DownOptions:
    purge: bool = False
    accept_new_host_keys: bool = False
    no_wait: bool = False  # a held deployment lock: exit 1 at once instead of waiting


# the compose file that ran before an `up` shipped its own, kept beside compose.yaml for the
# roll's pair guard and blue/green to bring an old engine back (deploy/pair_guard.py)
PREVIOUS_COMPOSE = "compose.previous.yaml"


def down(
    inv: Inventory,
    opts: DownOptions,
    emit: Emit,
    *,
    hosts_factory: HostsFactory = default_hosts,
    lock_factory: LockFactory = default_lock,
    fetch: HttpFn = http,
    clock: Clock | None = None,
) -> int:
    """Run `down` under the deployment lock; without it when the lock's host (the
    router's) is unreachable: what can be reached is removed all the same. ``fetch`` and
    ``clock``: the engines' /metrics reads before the prefills stop (KvPullsDone)."""
    return run_framed(
        "down",
        inv,
        emit,
        lambda frame: _down(frame, opts, fetch, clock),
        lock_spec=LockSpec(lock_factory, opts.no_wait),
        accept_new=opts.accept_new_host_keys,
        hosts_factory=hosts_factory,
    )


def _down(frame: Frame, opts: DownOptions, fetch: HttpFn, clock: Clock | None) -> int:
    inv, emit, token = frame.inv, frame.emit, frame.token
    hosts = frame.open(deployment_hosts(inv))
    token.check()
    plan = build_plan(inv)
    failed_any = bool(hosts.errors)
    report_errors(emit, "cannot reach", hosts.errors)
    if hosts.errors:
        left = ", ".join(sorted(hosts.errors))
        emit(Note(f"the containers on {left} are left as they are", "warn"))
    # The token file is not needed by running containers (compose read it at
    # creation): remove it while the tiers stop. --purge waits for the containers,
    # since images in use cannot be removed.
    cleaned: list[bool] = []
    cleaner = threading.Thread(
        target=lambda: cleaned.append(clean_files(hosts, inv, plan, False, emit)),
        daemon=True,
    )
    if not opts.purge:
        cleaner.start()
    pulls_done = KvPullsDone(inv, plan, emit, fetch, clock)
    removed, errors = teardown(
        hosts, plan.deployment, emit, token, before=pulls_done, grace=plan.stop_grace_s
    )
    failed_any |= errors
    token.check()
    # an interrupted run's staging or seed server (labelled by pdboot as its own)
    oneshot_errors = remove_oneshots(inv, hosts)
    report_errors(emit, "cannot remove the staging containers on", oneshot_errors)
    failed_any |= bool(oneshot_errors)
    if opts.purge:
        token.check()  # a lost lock: no purge
        cleaned.append(clean_files(hosts, inv, plan, True, emit))
    else:
        cleaner.join(OP_DEADLINE)
    failed_any |= not (cleaned and cleaned[0])
    if removed == 0 and not failed_any:
        frame.summary = "nothing of this deployment is running"
    elif not failed_any:
        frame.summary = f"removed {removed} container(s)"
    return EXIT_FAILED if failed_any else EXIT_OK


def teardown(
    hosts: Hosts,
    deployment: str,
    emit: Emit,
    token: CancelToken = NEVER_CANCELLED,
    before: Callable[[Role], None] | None = None,
    grace: int = STOP_GRACE_S,
) -> tuple[int, bool]:
    """Remove this deployment's containers: router, prefill, decode. (count, any error)
    ``token``: checked before each tier (a lost lock stops it there); ``before``: called
    with each tier's role before it stops (down's KvPullsDone); ``grace``: Docker's
    SIGTERM-to-SIGKILL seconds (the plan's stop_grace_s: beyond the engines' shutdown timeout)."""
    token.check()
    emit(StageStarted("teardown"))
    values, errors = hosts.each(lambda _h, link: link.engine.containers(deployment), OP_DEADLINE)
    report_errors(emit, "cannot list containers on", errors)
    observed = [o for obs in values.values() for o in obs]
    removed = 0
    any_error = bool(errors)
    for role, batch in plan_down(deployment, observed):
        token.check()
        if before is not None:
            before(role)
        any_error |= not stop_remove(hosts, batch, emit, grace)
        removed += len(batch)
        emit(Stopped(role, tuple(o.key for o in batch)))
    return removed, any_error


@dataclass
class KvPullsDone:
    """Before the prefills stop: each one drained (deploy/drain.py: idle, and no decode of
    the plan with a KV pull waiting or in progress, on two reads in a row), all of them within
    one timeouts.drain_seconds; an engine that does not answer has nothing in flight. A
    prefill still busy at the deadline is stopped anyway, with a note."""

    inv: Inventory
    plan: Plan
    emit: Emit
    fetch: HttpFn = http
    clock: Clock | None = None

    def __call__(self, role: Role) -> None:
        if role != "prefill":
            return
        engines = [s for s in self.plan.services() if s.is_engine and not s.headless]
        decodes = [s.url for s in engines if s.role == "decode"]
        clock = self.clock or MonotonicClock()
        t = self.inv.timeouts
        end = clock.now() + t.drain_seconds
        for p in (s for s in engines if s.role == "prefill"):
            left = max(end - clock.now(), 0.0)
            got = drain(
                p.url,
                self.fetch,
                clock,
                timeout=left,
                interval=t.poll_interval_seconds,
                pullers=decodes,
            )
            if not got.drained:
                self.emit(Note(f"{p.key}: {got.describe()}", "warn"))


def stop_remove(hosts: Hosts, batch: list[Observed], emit: Emit, grace: int = STOP_GRACE_S) -> bool:
    """Stop (SIGTERM, SIGKILL after ``grace`` s) and remove; one host's containers one after
    another, so its deadline grows with their count."""
    by_host: dict[str, list[str]] = {}
    for o in batch:
        by_host.setdefault(o.host, []).append(o.id)
    most = max((len(ids) for ids in by_host.values()), default=0)
    _, errors = hosts.each(
        lambda h, link: link.engine.stop_remove(by_host[h], grace),
        max(OP_DEADLINE, OP_DEADLINE + grace * most),
        only=by_host,
    )
    report_errors(emit, "cannot remove containers on", errors)
    return not errors


def clean_files(hosts: Hosts, inv: Inventory, plan: Plan, purge: bool, emit: Emit) -> bool:
    """The token file always goes with the containers; --purge also takes the project
    directory and the images pdboot recorded pulling there (pulled_record.py): an image
    that was on the host before, side-loaded or pulled by hand, stays."""
    pdir = project_dir(inv)

    def clean(host: str, link: Link) -> list[str]:
        notes: list[str] = []
        if purge:
            # images first: the record is in the directory, and a failed removal keeps
            # both for the next purge
            record = link.engine.pulled(pdir)
            local = {img: link.engine.local_digests(img) for img, _ in record}
            ours = to_purge(record, local)
            for img in ours:
                if link.engine.remove_image(img):
                    notes.append(f"{host}: removed image {img}")
            kept = sorted({s.image for s in plan.hosts[host].services} - set(ours))
            if kept:
                notes.append(f"{host}: kept {', '.join(kept)} (not pulled by pdboot)")
            link.engine.remove_project_dir(pdir)
        else:
            secret = [SECRETS_FILE, *sorted(PRIVATE_FILES)]  # the proxy's key check, watch's key
            gone = [*secret, PREVIOUS_COMPOSE]  # what a roll's failed pair restores from
            link.conn.run(["rm", "-f", *(f"{pdir}/{name}" for name in gone)])
        return notes

    values, errors = hosts.each(clean, OP_DEADLINE)
    for notes in values.values():
        for n in notes:
            emit(Note(n))
    if purge and not errors:
        emit(Note(f"purged {pdir} and pulled images on {len(values)} host(s)"))
    report_errors(emit, "cannot clean up files on", errors)
    return not errors
