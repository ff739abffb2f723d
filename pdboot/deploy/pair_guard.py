"""A roll's guard on the pairs it creates (verify/pairs.py probes them): before an engine
that joined is registered, every P/D pair it makes with the serving engines must move KV.
A failing pair undoes the step: a new engine is stopped and removed, a replaced one is
recreated from the compose file that ran before this `up` (kept beside compose.yaml as
PREVIOUS_COMPOSE when `up` ships), so the old engine serves again; the roll stops.

Why a kept file and not the container: compose recreates a service in place (same name,
same labels), so the old container is gone once its replacement starts; its definition is
not, when `up` kept the file it came from."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from pdboot.deploy.all_hosts import OP_DEADLINE
from pdboot.deploy.down import PREVIOUS_COMPOSE, stop_remove
from pdboot.deploy.readiness import find_container
from pdboot.events import Emit, Note, RollProgress
from pdboot.plan.converge import Observed, Step
from pdboot.plan.model import Plan, Service
from pdboot.transport.hosts import Hosts
from pdboot.transport.http import HttpFn
from pdboot.verify.pairs import check_pairs


def keep_previous(hosts: Hosts, plan: Plan, project_dir: str) -> dict[str, str]:
    """Host -> the compose.yaml that runs there now (before `up` ships its own); a host
    without one (first `up`) or whose file cannot be read is left out: nothing to restore."""
    values, _ = hosts.each(
        lambda _h, link: link.engine.read_file(f"{project_dir}/compose.yaml"),
        OP_DEADLINE,
        only=list(plan.hosts),
    )
    return {h: text for h, text in values.items() if text}


def serving_engines(plan: Plan, fetch: HttpFn, joining: Sequence[Service]) -> list[Service]:
    """The plan's other engines that answer /health now (the ones a client could meet)."""
    keys = {s.key for s in joining}
    others = [s for s in plan.services() if s.is_engine and not s.headless and s.key not in keys]
    return [s for s in others if fetch(f"{s.url}/health", timeout=5.0).status == 200]


def pairs_ok(
    plan: Plan,
    fetch: HttpFn,
    headers: Mapping[str, str],
    joining: Sequence[Service],
    emit: Emit,
    explain: Callable[[str], None],
    number: int,
) -> bool:
    checks = check_pairs(plan, fetch, headers, joining, serving_engines(plan, fetch, joining))
    for c in checks:
        emit(RollProgress(number, "pair", c.describe()))
    failed = [c for c in checks if not c.ok]
    if not failed:
        return True
    emit(
        Note(
            f"error: {len(failed)} of {len(checks)} new P/D pair(s) failed their probe "
            f"({failed[0].describe()}); the new engine is taken back before any client "
            "reaches it",
            "error",
        )
    )
    explain("a new P/D pair failed its probe")  # the logs, before the new container goes
    return False


def holds(previous: Mapping[str, str], step: Step) -> bool:
    """The kept compose file of the step's host renders what ran (its config hash label): an
    `up` that shipped and then stopped (an outage refused) leaves a compose.yaml nothing runs."""
    text = previous.get(step.service.host)
    ran = step.current.config_hash if step.current is not None else None
    return bool(text) and bool(ran) and str(ran) in str(text)


def restore(
    steps: Sequence[Step],
    plan: Plan,
    hosts: Hosts,
    project_dir: str,
    previous: Mapping[str, str],
    observed: list[Observed],
    emit: Emit,
) -> list[Service]:
    """Undo a change to engines (a roll step whose pairs failed, blue/green's green that
    failed before the switch): new engines stopped and removed; replaced ones recreated from
    PREVIOUS_COMPOSE. Returns the services recreated (to wait for)."""
    added = [s for s in steps if s.kind == "create"]
    gone = [
        o for s in added if (o := find_container(observed, plan.deployment, s.service)) is not None
    ]
    if gone:
        stop_remove(hosts, gone, emit, plan.stop_grace_s)
    back: list[Service] = []
    for s in steps:
        if s.kind == "create":
            continue
        if not holds(previous, s):
            emit(
                Note(
                    f"{s.service.key}: the compose file kept before this up does not hold the "
                    "configuration that ran (an earlier up shipped and stopped): not brought back",
                    "warn",
                )
            )
            continue
        link = hosts.links[s.service.host]
        link.engine.compose_up(
            project_dir,
            plan.hosts[s.service.host].project,
            s.service.name,
            recreate=True,
            timeout=OP_DEADLINE,
            file=PREVIOUS_COMPOSE,
        )
        emit(Note(f"{s.service.key}: brought back in its old configuration"))
        back.append(s.service)
    return back


__all__ = [
    "PREVIOUS_COMPOSE",
    "holds",
    "keep_previous",
    "pairs_ok",
    "restore",
    "serving_engines",
]
