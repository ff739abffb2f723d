"""What the orchestrator needs from the outside world, as small interfaces.

`up` and `down` take these as injection points, so a unit test can drive them with fake
hosts, a fake engine, a fake HTTP function and a fake clock
(tests/unit/deploy/test_orchestrator.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from pdboot.events import Emit, HostErrors
from pdboot.inventory.schema import Inventory
from pdboot.preflight.findings import RECORD_FILE, Findings, from_records
from pdboot.transport import lock
from pdboot.transport.hosts import Hosts, open_hosts, project_dir

OP_DEADLINE = 300.0  # compose up / stop of one host's services


# (inventory, host names, accept_new_host_keys) -> opened hosts (Hosts.links[h].engine
# is a transport.hosts.EngineOps, .conn a transport.connection.Connection)
HostsFactory = Callable[[Inventory, Iterable[str], bool], Hosts]


def default_hosts(inv: Inventory, names: Iterable[str], accept_new_host_keys: bool) -> Hosts:
    return open_hosts(inv, names, accept_new_host_keys=accept_new_host_keys)


@dataclass(frozen=True)
class PreflightOutcome:
    ok: bool
    rdma: Findings | None = None  # per host: usable RDMA found (for kv_transfer.rdma auto)


# (inventory, accept_new_host_keys) -> outcome; its report is shown by whoever made it
PreflightFn = Callable[[Inventory, bool], PreflightOutcome]


def report_errors(emit: Emit, what: str, errors: Mapping[str, str]) -> None:
    if errors:
        emit(HostErrors(what, tuple(sorted(errors.items()))))


def recorded_findings(inv: Inventory, hosts: Hosts) -> Findings:
    """The RDMA findings `up` recorded on the hosts (not read for kv_transfer.rdma on,
    where neither the RDMA choice nor the TCP interface matters; an unreadable host counts
    as no record: the step that needs it reports the host)."""
    return read_records(inv, hosts)[0]


def read_records(inv: Inventory, hosts: Hosts) -> tuple[Findings, dict[str, str]]:
    """recorded_findings, and the hosts whose record could not be read (host -> why): a
    caller that compares config hashes (`up --plan`) must not take an unread record for
    none, or it sees a change that is not there."""
    if inv.kv_transfer.rdma == "on":
        return Findings({}, {}, "recorded"), {}
    path = f"{project_dir(inv)}/{RECORD_FILE}"
    texts, errors = hosts.each(lambda _h, link: link.engine.read_file(path), OP_DEADLINE)
    return from_records(texts), errors


class HeldLock(Protocol):
    """The part of pdboot.transport.lock.HeldLock the orchestrator uses."""

    def release(self) -> None: ...

    @property
    def lost_reason(self) -> str | None: ...


# (inventory, operation, wait, accept_new_host_keys, say) -> the held deployment lock;
# raises lock.LockBusy (another live run holds it) or RemoteError (its host is unreachable)
LockFactory = Callable[[Inventory, str, bool, bool, Callable[[str], None]], HeldLock]


def default_lock(
    inv: Inventory, operation: str, wait: bool, accept_new: bool, say: Callable[[str], None]
) -> HeldLock:
    return lock.take(inv, operation, wait=wait, say=say, accept_new_host_keys=accept_new)
