"""The preflight `up` runs first: the full preflight, each host and each of its checks an event
(the fields `pdboot preflight --json` reports), and its findings for the plan; or, without
preflight (`up --skip-preflight`, `up --plan`, `status`), the findings an earlier one recorded
on the hosts. The views render the events (the terminal view prints them compactly once
PreflightDone arrives)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pdboot.deploy.all_hosts import OP_DEADLINE
from pdboot.events import Emit, Event, PreflightCheck, PreflightHost
from pdboot.inventory.schema import Inventory
from pdboot.plan.facts import PlanFacts
from pdboot.preflight.findings import RECORD_FILE, from_preflight, from_records
from pdboot.preflight.run import PreflightResult, run_preflight
from pdboot.transport.hosts import Hosts, project_dir

RunPreflight = Callable[..., PreflightResult]


@dataclass(frozen=True)
class PreflightOutcome:
    ok: bool
    rdma: PlanFacts | None = None  # per host: usable RDMA found (for kv_transfer.rdma auto)


# (inventory, accept_new_host_keys) -> outcome; its report is shown by whoever made it
PreflightFn = Callable[[Inventory, bool], PreflightOutcome]


def preflight_events(result: PreflightResult) -> list[Event]:
    """Per host in the report's order: the host, then its checks in the order preflight
    found them."""
    out: list[Event] = []
    for name, h in result.hosts.items():
        out.append(PreflightHost(name, h.reachable, h.seconds))
        out += [PreflightCheck(name, c.id, c.status, c.message, c.fix) for c in h.checks]
    return out


def preflight_gate(emit: Emit, run: RunPreflight = run_preflight) -> PreflightFn:
    """``run`` is preflight itself (``run_preflight``); a test passes its own result."""

    def gate(inv: Inventory, accept_new_host_keys: bool) -> PreflightOutcome:
        result = run(inv, accept_new_host_keys=accept_new_host_keys)
        for event in preflight_events(result):
            emit(event)
        return PreflightOutcome(result.ok, from_preflight(result))

    return gate


def recorded_findings(inv: Inventory, hosts: Hosts) -> PlanFacts:
    """The RDMA findings `up` recorded on the hosts (not read for kv_transfer.rdma on,
    where neither the RDMA choice nor the TCP interface matters; an unreadable host counts
    as no record: the step that needs it reports the host)."""
    return read_records(inv, hosts)[0]


def read_records(inv: Inventory, hosts: Hosts) -> tuple[PlanFacts, dict[str, str]]:
    """recorded_findings, and the hosts whose record could not be read (host -> why): a
    caller that compares config hashes (`up --plan`) must not take an unread record for
    none, or it sees a change that is not there."""
    if inv.kv_transfer.rdma == "on":
        return PlanFacts(rdma_present={}, source="recorded"), {}
    path = f"{project_dir(inv)}/{RECORD_FILE}"
    texts, errors = hosts.each(lambda _h, link: link.engine.read_file(path), OP_DEADLINE)
    return from_records(texts), errors
