"""What `up` changes on a running deployment, before it changes it: the roll plan from what
runs (config hash labels) against the inventory, `up --plan` (prints it, changes nothing), and
the hosts that left every tier (visited to find the engines left there)."""

from __future__ import annotations

import os
from dataclasses import replace

from pdboot.deploy import versions
from pdboot.deploy.rollout import emit_plan
from pdboot.deploy.seams import OP_DEADLINE, HostsFactory, read_records, report_errors
from pdboot.events import Emit, Note, ServiceAction, StageStarted
from pdboot.exitcodes import EXIT_CHANGES, EXIT_FAILED, EXIT_OK
from pdboot.inventory.rules import live_workers
from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.plan.converge import Observed, Step, decode_restarts, orphans, plan_up, with_restarts
from pdboot.plan.model import Plan
from pdboot.plan.rolling import RollPlan, plan_roll
from pdboot.preflight.findings import plan_from
from pdboot.transport.hosts import Hosts
from pdboot.weights.stage import as_recorded


def roll_plan(
    plan: Plan, observed: list[Observed], *, live: bool, rolling: bool
) -> tuple[list[list[Step]], RollPlan]:
    """Converge's steps (as `up` shows them) and the roll steps, from what runs (pure but
    for ROUTER_RECREATE_ENV). A rolling change of the router swaps it (router_swap.py)."""
    first = plan_up(plan, observed, live=live)
    restarts = decode_restarts(first)
    stages = with_restarts(first, restarts, live=live)
    swap = live and rolling and os.environ.get(ROUTER_RECREATE_ENV, "") != "1"
    gone = orphans(plan, observed)
    return stages, plan_roll(plan, first, restarts, gone, rolling=rolling, swap=swap)


# Internal, for bench/rolling.py's baseline only: "1" makes a router change recreate the
# router (the outage of before issue 28) instead of swapping it.
ROUTER_RECREATE_ENV = "PDBOOT_BENCH_ROUTER_RECREATE"
ROUTER_OUTAGE = "a short outage: the endpoint refuses connections until the new router answers"
ROUTER_SWAP = "swapped with no outage: a new router beside the old, then the proxy moves"


def action_reason(s: Step, roll: RollPlan | None = None) -> str:
    """The converge table's reason; a router change says what it costs."""
    if s.service.role == "router" and s.kind == "recreate":
        swap = roll is not None and roll.router_swap
        return f"{s.reason}; {ROUTER_SWAP if swap else ROUTER_OUTAGE}"
    return s.reason


def plan_only(
    inv: Inventory, rolling: bool, accept_new: bool, emit: Emit, hosts_factory: HostsFactory
) -> int:
    """`up --plan`: what runs (config hash labels) against the inventory, as the steps `up`
    would take; nothing is pulled, shipped, started or stopped. EXIT_OK: nothing to do,
    EXIT_CHANGES: changes, EXIT_FAILED: the hosts could not be read."""
    hosts = hosts_factory(inv, list(build_plan(inv).hosts), accept_new)
    add_former_hosts(inv, hosts, emit, hosts_factory, accept_new)
    try:
        if hosts.errors:
            report_errors(emit, "cannot reach", hosts.errors)
            return EXIT_FAILED
        inv, commit = as_recorded(inv, hosts)  # the commit `up` pinned: no hub request
        if commit:
            emit(Note(f"weights: {inv.model} at commit {commit} (pinned by an earlier up)"))
        findings, unread = read_records(inv, hosts)
        if unread:
            report_errors(emit, "cannot read the RDMA record on", unread)
            return EXIT_FAILED
        plan = plan_from(inv, findings)
        values, errors = hosts.each(
            lambda _h, link: link.engine.containers(plan.deployment), OP_DEADLINE
        )
        if errors:
            report_errors(emit, "cannot list containers on", errors)
            return EXIT_FAILED
        observed = [o for obs in values.values() for o in obs]
        live = live_workers(inv)
        stages, roll = roll_plan(plan, observed, live=live, rolling=live and rolling)
        changed = False
        if roll.rolling:  # which path, and why: a new build never rolls (versions.py)
            steps = [s for st in stages for s in st]
            images = versions.image_versions(hosts, steps, {})  # unpulled: unknown
            path = versions.upgrade_path(
                plan, stages, images, versions.running_versions(hosts, steps)
            )
            if versions.unread_build_only(path):
                versions.emit_pending(emit, path)  # what `up` does depends on the pull
            else:
                versions.emit_path(emit, path)
            pending = versions.unread_build_only(path)
            if path.kind == "outage" and not pending:
                stages, roll = roll_plan(plan, observed, live=live, rolling=False)
            elif path.kind == "blue-green" and not pending:  # its phases (above) are the steps
                roll = replace(roll, steps=())
                changed = True
        emit(StageStarted("plan"))
        for steps in stages:
            for s in steps:
                emit(ServiceAction(s.service.key, s.kind, action_reason(s, roll)))
        emit_plan(emit, roll)
        for line in roll.notes:
            emit(Note(line, "warn"))
        proxy = any(s.kind != "unchanged" for st in stages for s in st if s.service.role == "proxy")
        return EXIT_CHANGES if roll.changes or proxy or changed else EXIT_OK
    finally:
        hosts.close()


def add_former_hosts(
    inv: Inventory, hosts: Hosts, emit: Emit, hosts_factory: HostsFactory, accept_new: bool
) -> None:
    """Hosts of the inventory that no tier uses any more (a prefill host removed from its
    tier): visited only to find this deployment's engines left there, which `up` drains and
    stops. One that cannot be reached is a warning, not a failure: nothing runs there that
    the inventory wants."""
    former = [h for h in inv.hosts if h not in hosts.links and h not in hosts.errors]
    if not former:
        return
    extra = hosts_factory(inv, former, accept_new)
    hosts.links.update(extra.links)
    for host, why in sorted(extra.errors.items()):
        emit(
            Note(
                f"{host} is in no tier and cannot be reached ({why}): engines pdboot "
                "started there earlier are left as they are",
                "warn",
            )
        )
