"""The preflight `up` runs first: the full preflight, each host and each of its checks an event
(the fields `pdboot preflight --json` reports), and its findings for the plan. The views render
the events (the terminal view prints them compactly once PreflightDone arrives)."""

from __future__ import annotations

from collections.abc import Callable

from pdboot.deploy.seams import PreflightFn, PreflightOutcome
from pdboot.events import Emit, Event, PreflightCheck, PreflightHost
from pdboot.inventory.schema import Inventory
from pdboot.preflight.findings import from_preflight
from pdboot.preflight.run import PreflightResult, run_preflight

RunPreflight = Callable[..., PreflightResult]


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
