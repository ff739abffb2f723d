"""Observed containers + the wanted plan -> what `up` and `down` must do (pure).

pdboot recognises its own containers by labels (deployment, role, host, engine index,
config hash), never by name, so it never touches a container it did not start. A service whose hash
label equals the plan's is left alone; one whose hash differs is recreated. With static
router lists the router is recreated whenever one of its workers was (re)created, because it
registered the old engines; with live workers (router.live_workers) its hash leaves the
worker lists out and `up` registers and deregisters engines instead (rolling.py orders
it). Steps stay grouped by tier (decode, prefill, router): `up` starts both engine tiers
together and the router after them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Literal

from pdboot.inventory.engines import engine_name
from pdboot.inventory.schema import TIERS
from pdboot.plan.diff import config_changes
from pdboot.plan.model import (
    LABEL_CONFIG_HASH,
    LABEL_DEPLOYMENT,
    LABEL_ENGINE,
    LABEL_HOST,
    LABEL_ROLE,
    LABEL_ROUTER_SLOT,
    ROLES,
    Plan,
    Role,
    Service,
)
from pdboot.timestamps import parse_rfc3339

StepKind = Literal["create", "recreate", "unchanged"]


@dataclass(frozen=True)
class Observed:
    """A container as the engine reports it (only the fields pdboot needs)."""

    host: str  # the inventory host it was found on
    id: str
    name: str
    labels: Mapping[str, str]
    state: str  # docker's State.Status: running, exited, created, restarting, ...
    image: str = ""
    started_at: str = ""  # RFC 3339, as docker prints it
    created: str = ""  # RFC 3339: when the container was created (docker inspect's Created)
    exit_code: int | None = None
    restart_count: int = 0
    docker_health: str = ""  # the compose healthcheck's verdict: healthy, starting, ...
    # what `up --plan` compares field by field when the config hash differs (inspect only)
    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    gpus: str = ""  # "all", "0,1", or "" (no GPU request)

    @property
    def deployment(self) -> str | None:
        return self.labels.get(LABEL_DEPLOYMENT)

    @property
    def role(self) -> str | None:
        return self.labels.get(LABEL_ROLE)

    @property
    def config_hash(self) -> str | None:
        return self.labels.get(LABEL_CONFIG_HASH)

    @property
    def engine_index(self) -> int:
        """Its engine index on the host (label absent: 0, the only or first engine)."""
        raw = self.labels.get(LABEL_ENGINE, "0")
        return int(raw) if raw.isdigit() else 0

    @property
    def service_name(self) -> str:
        """The plan's Service.name it stands for: ``decode``, ``prefill-2``, ``router``."""
        role = self.role or "?"
        if role == "router" and self.labels.get(LABEL_ROUTER_SLOT) == "spare":
            return "router-swap"  # a router swap's successor (plan/router_slots.py)
        if role in ("router", "proxy", "keepalived", "watch"):
            return role
        return engine_name(role, self.engine_index)

    @property
    def key(self) -> str:
        return f"{self.service_name}@{self.labels.get(LABEL_HOST, self.host)}"

    @property
    def running(self) -> bool:
        return self.state in ("running", "restarting")


class Cause(Enum):
    """Why a step does what it does, as a value: decisions read this, the reason says it
    in words (rolling.py restarts rather than replaces on NIXL_STATE)."""

    NOT_RUNNING = "not running"  # no container: create
    DUPLICATES = "duplicates"  # more than one container for the service
    CONFIG_CHANGED = "config changed"  # the config hash label differs
    WORKERS_RESTARTED = "workers restarted"  # a static-list router whose engines changed
    STOPPED = "stopped"  # the container is not running (exited, created, ...)
    DP_TIER = "dp tier"  # its data-parallel tier restarts as a whole
    NIXL_STATE = "nixl state"  # a decode holding NIXL state for a prefill that restarts
    SAME = "same"  # running with the same configuration: unchanged


@dataclass(frozen=True)
class Step:
    service: Service
    kind: StepKind
    reason: str
    current: Observed | None = None
    cause: Cause = Cause.SAME


def owned(observed: Iterable[Observed], deployment: str) -> list[Observed]:
    """Only containers labelled as this deployment's."""
    return [o for o in observed if o.deployment == deployment and o.role in ROLES]


def _index(observed: Iterable[Observed]) -> dict[tuple[str, str], list[Observed]]:
    out: dict[tuple[str, str], list[Observed]] = {}
    for o in observed:
        if o.role is not None:
            out.setdefault((o.host, o.service_name), []).append(o)
    return out


def plan_up(plan: Plan, observed: Iterable[Observed], *, live: bool = False) -> list[list[Step]]:
    """Per stage (decode, prefill, router): one step per service. ``live``: the router's
    workers are registered at runtime, so a changed engine set leaves it running."""
    index = _index(owned(observed, plan.deployment))
    stages: list[list[Step]] = []
    workers_changed = False
    for stage in plan.stages:
        steps: list[Step] = []
        for svc in stage:
            found = index.get((svc.host, svc.name), [])
            step = _step(svc, found, workers_changed and svc.role == "router" and not live)
            steps.append(step)
        steps = _whole_dp_tiers(steps)
        if any(s.service.is_engine and s.kind != "unchanged" for s in steps):
            workers_changed = True
        stages.append(steps)
    return stages


def plan_ingress(plan: Plan, observed: Iterable[Observed]) -> list[Step]:
    """One step per service of the standby ingress (plan/ingress.py), in its start order:
    the standby's router and proxy, then keepalived. None without router.standby."""
    index = _index(owned(observed, plan.deployment))
    return [_step(s, index.get((s.host, s.name), []), False) for s in plan.ingress_services()]


def _step(svc: Service, found: Sequence[Observed], workers_changed: bool) -> Step:
    if not found:
        return Step(svc, "create", "not running", cause=Cause.NOT_RUNNING)
    cur = found[0]
    if len(found) > 1:
        why = f"{len(found)} containers found, expected one"
        return Step(svc, "recreate", why, cur, Cause.DUPLICATES)
    if cur.config_hash != svc.config_hash:
        why = f"configuration changed: {config_changes(svc, cur)}"
        return Step(svc, "recreate", why, cur, Cause.CONFIG_CHANGED)
    if workers_changed:
        return Step(svc, "recreate", "its workers were (re)started", cur, Cause.WORKERS_RESTARTED)
    if cur.state != "running":
        code = f", exit code {cur.exit_code}" if cur.exit_code is not None else ""
        return Step(svc, "recreate", f"container is {cur.state}{code}", cur, Cause.STOPPED)
    return Step(svc, "unchanged", "running with the same configuration", cur)


def _whole_dp_tiers(steps: list[Step]) -> list[Step]:
    """A data-parallel tier restarts as a whole: vLLM's head accepts ranks only while it
    starts (its RPC socket closes once it serves), so a follower cannot rejoin a running
    head, and a new head waits for every follower (docs/data-parallel.md)."""
    out = list(steps)
    for role in TIERS:
        tier = [i for i, s in enumerate(out) if s.service.role == role and s.service.dp_role]
        changed = [out[i].service.key for i in tier if out[i].kind != "unchanged"]
        if not changed:
            continue
        for i in tier:
            s = out[i]
            if s.kind == "unchanged":
                why = f"its data-parallel tier restarts ({', '.join(changed)} changed)"
                out[i] = Step(s.service, "recreate", why, s.current, Cause.DP_TIER)
    return out


# A prefill that started this much later than a running decode may have been restarted under
# it (docker's restart policy, `docker restart`, or removed and created again by `down` of part
# + `up`). Both tiers start together in one `up` (seconds apart), so a small gap means
# nothing; a real engine takes longer than this to load, so a decode that predates its prefill
# by more served the old one.
STALE_AFTER_SECONDS = 30.0


def started(o: Observed | None) -> datetime | None:
    """Docker's StartedAt as an aware datetime; None when unknown."""
    return None if o is None else parse_rfc3339(o.started_at)


def _newer(prefill: Observed | None, decode: Observed | None) -> bool:
    p, d = started(prefill), started(decode)
    if p is None or d is None or (p - d).total_seconds() <= STALE_AFTER_SECONDS:
        return False
    return not _joined(prefill)


def _joined(prefill: Observed | None) -> bool:
    """The prefill was created and started at once, never restarted since: an engine `up`
    added beside running decodes (a roll, a live add, blue/green's growth), registered with
    the router only after a P/D probe through each of its pairs. A decode holds no state for
    an older process of it: there was none. (A container restarted in place keeps its
    creation time; one created again by a partial `down` + `up` is restarted by that `up`.)"""
    if prefill is None or prefill.restart_count:
        return False
    created, begun = parse_rfc3339(prefill.created), started(prefill)
    return (
        created is not None
        and begun is not None
        and (begun - created).total_seconds() <= STALE_AFTER_SECONDS
    )


def decode_restarts(stages: Sequence[Sequence[Step]]) -> list[Step]:
    """The running decode engines `up` must restart once the prefill tier is ready.

    A decode caches, per prefill engine id, the NIXL handshake (peer agent metadata, remote
    block layout); a prefill that restarts comes back with a new engine id and new memory
    registrations while the decode may still hold the old ones: users report decodes that
    segfault or keep pulling from the dead peer (llm-d#2187, vllm-pd-facts.md). So a decode
    left "unchanged" is restarted when any prefill is (re)created in this run, or when a
    running prefill started well after it (restarted under it earlier). A created prefill
    counts too: converge cannot tell one new to the deployment from one removed under a
    running decode (a partial `down`, a `docker rm`), which that decode still holds state for."""
    steps = [s for stage in stages for s in stage]
    prefills = [s for s in steps if s.service.role == "prefill"]
    changed = [s.service.key for s in prefills if s.kind != "unchanged"]
    out = []
    for d in steps:
        if d.service.role != "decode" or d.kind != "unchanged":
            continue
        newer = [
            p.service.key
            for p in prefills
            if p.kind == "unchanged" and _newer(p.current, d.current)
        ]
        if changed:
            why = f"{', '.join(changed)} is (re)created in this run"
        elif newer:
            why = f"{', '.join(newer)} restarted after it"
        else:
            continue
        out.append(
            Step(
                d.service,
                "recreate",
                f"{why}: drops NIXL state held for the old prefill",
                d.current,
                Cause.NIXL_STATE,
            )
        )
    return out


def with_restarts(
    stages: Sequence[Sequence[Step]], restarts: Sequence[Step], *, live: bool = False
) -> list[list[Step]]:
    """The stages as `up` shows them: each restarted decode's step replaced, and the router
    recreated when it was to stay (it registered the engines being restarted) unless its
    workers are live (``live``: they are deregistered and registered again instead)."""
    by_key = {s.service.key: s for s in restarts}
    out = []
    for stage in stages:
        new = []
        for s in stage:
            if s.service.key in by_key:
                s = by_key[s.service.key]
            elif restarts and s.service.role == "router" and s.kind == "unchanged" and not live:
                why = "its workers were (re)started"
                s = Step(s.service, "recreate", why, s.current, Cause.WORKERS_RESTARTED)
            new.append(s)
        out.append(new)
    return out


def orphans(plan: Plan, observed: Iterable[Observed]) -> list[Observed]:
    """This deployment's containers that the plan no longer has (a host left a tier)."""
    wanted = {(s.host, s.name) for s in (*plan.services(), *plan.ingress_services())}
    return [o for o in owned(observed, plan.deployment) if (o.host, o.service_name) not in wanted]


def plan_down(deployment: str, observed: Iterable[Observed]) -> list[tuple[Role, list[Observed]]]:
    """Teardown order: router, then prefill, then decode; only this deployment's containers."""
    mine = owned(observed, deployment)
    out: list[tuple[Role, list[Observed]]] = []
    for role in reversed(ROLES):
        batch = [o for o in mine if o.role == role]
        if batch:
            out.append((role, batch))
    return out
