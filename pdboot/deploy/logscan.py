"""Recent logs of a deployment's services, read for diagnosis (thin I/O around diagnose).

Kept apart from the orchestrator so that `up` (a failed test request, a bad KV verdict),
`status` and `logs --diagnose` read the same logs the same way."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pdboot.ansi import strip_ansi
from pdboot.deploy.readiness import find_container
from pdboot.deploy.waits import Clock
from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.plan.converge import Observed
from pdboot.plan.model import Plan, Service
from pdboot.transport.hosts import Hosts, open_hosts
from pdboot.verify.diagnose import Finding, diagnose

RECENT_LINES = 300  # enough for a handshake failure's traceback after the access log lines
# An engine logs its error before it answers 500, but Docker copies a container's output into
# its log file on its own schedule: on a loaded host the client's 500 can arrive before the
# line is readable (seen in CI: a hash mismatch logged, `docker logs` without it a moment later).
LOG_SETTLE_S = 3.0
LOG_REREAD_S = 0.5


def recent_logs(
    hosts: Hosts, plan: Plan, services: Iterable[Service], tail: int = RECENT_LINES
) -> dict[str, list[str]]:
    """service key -> its container's last lines (a note when they cannot be read).
    Containers are found by their labels, like everywhere else."""
    out: dict[str, list[str]] = {}
    listed: dict[str, list[Observed]] = {}
    for svc in services:
        link = hosts.links.get(svc.host)
        if link is None:
            continue
        try:
            if svc.host not in listed:
                listed[svc.host] = link.engine.containers(plan.deployment)
            found = find_container(listed[svc.host], plan.deployment, svc)
            if found is None:
                lines = [f"(no container labelled {svc.key})"]
            else:
                lines = link.engine.logs(found.id, tail=tail)
        except Exception as e:  # one unreadable log must not hide the others' causes
            lines = [f"(cannot read logs: {e})"]
        out[svc.key] = [strip_ansi(line) for line in lines]
    return out


def explain(
    hosts: Hosts, plan: Plan, services: Iterable[Service], clock: Clock | None = None
) -> list[Finding]:
    """Known causes in the recent logs of these services. With a clock (right after a failure
    was seen), logs that show no cause are read again until LOG_SETTLE_S has passed."""
    wanted = list(services)

    def read() -> list[Finding]:
        return diagnose(recent_logs(hosts, plan, wanted))

    return read() if clock is None else settled(read, clock)


def settled(
    read: Callable[[], list[Finding]],
    clock: Clock,
    window: float = LOG_SETTLE_S,
    every: float = LOG_REREAD_S,
) -> list[Finding]:
    """The first reading that finds a cause, or the last one once the window has passed."""
    start = clock.now()
    while True:
        found = read()
        if found or clock.now() - start + every > window:
            return found
        clock.sleep(every)


def explain_services(inv: Inventory, keys: Iterable[str]) -> list[Finding]:
    """Known causes in the logs of these services (``decode@gpu-b``...), on fresh links: for
    `status`, which reads logs only for the services that are not healthy."""
    plan = build_plan(inv)
    wanted = set(keys)
    services = [s for s in plan.services() if s.key in wanted]
    if not services:
        return []
    hosts = open_hosts(inv, sorted({s.host for s in services}))
    try:
        return explain(hosts, plan, services)
    finally:
        hosts.close()


def report_lines(findings: list[Finding]) -> list[str]:
    """Three lines per finding (cause, fix, its troubleshooting section); one line saying
    so when nothing is known."""
    if not findings:
        return ["no known cause in the engines' and router's recent logs (see `pdboot logs`)"]
    return [line for f in findings for line in f.lines()]
