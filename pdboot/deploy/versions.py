"""The vLLM build each changed engine runs now, read inside its running container: the image
reference it started from may since name another build (a nightly tag moves at every pull),
and the build is what NIXL's compatibility hash sees (plan/nixl_compat.py). Read only for
engines whose image changes; `up` reads the new images' versions after the pull
(preflight/image_args.py). Then the path a change takes (plan/upgrade.py), in events, and
the change plan that path applies (`decide`: one choice for `up` and `up --plan`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from pdboot.deploy.seams import OP_DEADLINE
from pdboot.events import Emit, Note
from pdboot.inventory.schema import TIERS
from pdboot.plan.change_plan import ChangePlan, all_at_once
from pdboot.plan.converge import Step
from pdboot.plan.model import Plan
from pdboot.plan.nixl_compat import UNKNOWN, ImageVersion
from pdboot.plan.upgrade import (
    PathKind,
    UpgradePath,
    choose,
    compatibility,
    replaced_engines,
)
from pdboot.transport import docker_cli
from pdboot.transport.hosts import Hosts, Link

MARK = "PDBOOT_VERSION "
EXEC_TIMEOUT_S = 60.0  # importing vllm in a running engine's container: seconds
SCRIPT = (
    "import json\n"
    "try:\n"
    "    import vllm\n"
    "    v = str(getattr(vllm, '__version__', '') or '')\n"
    "except BaseException:\n"
    "    v = ''\n"
    "print('PDBOOT_VERSION ' + json.dumps({'version': v}), flush=True)\n"
)


def exec_argv(container_id: str) -> list[str]:
    return docker_cli.exec_in(container_id, "python3", "-c", SCRIPT)


def run_argv(image: str) -> list[str]:
    return docker_cli.run_once(
        image, "-c", SCRIPT, entrypoint="python3", network="none", pull_never=True
    )


def parse(text: str) -> ImageVersion | None:
    line = next((ln for ln in text.splitlines() if ln.startswith(MARK)), None)
    if line is None:
        return None
    try:
        v = json.loads(line[len(MARK) :]).get("version")
    except (ValueError, AttributeError):
        return None
    return ImageVersion(str(v)) if v else None


def running_versions(hosts: Hosts, steps: Sequence[Step]) -> dict[str, ImageVersion]:
    """Engine key -> the version its running container answers, for replaced engines whose
    image changes; one that does not answer is left out (unknown: never assumed equal)."""
    todo: dict[str, list[Step]] = {}
    for s in replaced_engines(steps):
        if s.current is not None and s.current.running and s.current.image != s.service.image:
            todo.setdefault(s.service.host, []).append(s)

    def one(host: str, link: Link) -> dict[str, ImageVersion]:
        out: dict[str, ImageVersion] = {}
        for s in todo[host]:
            assert s.current is not None
            _, text = link.engine.run_once(exec_argv(s.current.id), EXEC_TIMEOUT_S)
            v = parse(text)
            if v is not None:
                out[s.service.key] = v
        return out

    if not todo:
        return {}
    values, _ = hosts.each(one, EXEC_TIMEOUT_S + OP_DEADLINE, only=list(todo))
    return {k: v for found in values.values() for k, v in found.items()}


def image_versions(
    hosts: Hosts, steps: Sequence[Step], known: Mapping[str, ImageVersion]
) -> dict[str, ImageVersion]:
    """``known`` plus the version of each new image a replaced engine changes to that the
    after-pull probe did not read (--skip-preflight skips that probe; the path still needs
    the build): one short container per image, on a host that pulled it."""
    where: dict[str, str] = {}
    for s in replaced_engines(steps):
        moved = s.current is not None and s.current.image != s.service.image
        if moved and s.service.image not in known:
            where.setdefault(s.service.image, s.service.host)
    by_host: dict[str, list[str]] = {}
    for image, host in where.items():
        by_host.setdefault(host, []).append(image)

    def one(host: str, link: Link) -> dict[str, ImageVersion]:
        out: dict[str, ImageVersion] = {}
        for image in by_host[host]:
            v = parse(link.engine.run_once(run_argv(image), EXEC_TIMEOUT_S * 2)[1])
            if v is not None:
                out[image] = v
        return out

    found = dict(known)
    if by_host:
        values, _ = hosts.each(one, EXEC_TIMEOUT_S * 2 + OP_DEADLINE, only=list(by_host))
        for got in values.values():
            found.update(got)
    return found


def upgrade_path(
    plan: Plan,
    stages: Sequence[Sequence[Step]],
    versions: Mapping[str, ImageVersion],
    running: Mapping[str, ImageVersion],
) -> UpgradePath:
    steps = [s for st in stages for s in st]
    compat = compatibility(steps, versions, running)
    blue = {
        t: [
            s.service.key
            for s in steps
            if s.service.role == t
            and not s.service.headless
            and s.current is not None
            and s.current.running
        ]
        for t in TIERS
    }
    green = {t: [s.key for s in plan.services() if s.role == t and not s.headless] for t in TIERS}
    # blue/green replaces every engine: one kept as it runs would pair old with new
    every = all(s.kind == "recreate" for s in steps if s.service.is_engine and s.current)
    ok = plan.proxy is not None and every
    return choose(replaced_engines(steps), compat, blue, green, blue_green=ok)


@dataclass(frozen=True)
class Decision:
    """The path a change takes and the change plan it applies: an outage replaces every
    engine at once (all_at_once), blue/green has no roll steps (its phases are the steps)."""

    change: ChangePlan
    path: UpgradePath | None = None  # None: no running engine is replaced
    pending: bool = False  # `up --plan` only: the path waits on a version read after the pull

    def taken(self, kind: PathKind) -> bool:
        return self.path is not None and self.path.kind == kind and not self.pending


def decide(
    emit: Emit,
    hosts: Hosts,
    plan: Plan,
    change: ChangePlan,
    pulled: Mapping[str, ImageVersion] | None,
) -> Decision:
    """Roll, blue/green or outage, from the builds that run and the ones the new images hold.
    ``pulled``: what `up`'s image check read in the pulled images; None for `up --plan`, which
    pulls nothing: a new image not on its host yet leaves the path pending (a version never
    read is never assumed equal, so `up` itself never waits: it goes blue/green or outage)."""
    if not change.rolls:
        return Decision(change)
    steps = [s for st in change.stages for s in st]
    running = running_versions(hosts, steps)
    images = image_versions(hosts, steps, pulled or {})
    path = upgrade_path(plan, change.stages, images, running)
    if pulled is None and unread_build_only(path):
        emit_pending(emit, path)
        return Decision(change, path, pending=True)
    emit_path(emit, path)
    if path.kind == "outage":
        change = all_at_once(plan, change)
    elif path.kind == "blue-green":
        change = replace(change, roll=replace(change.roll, steps=()))
    return Decision(change, path)


def unread_build_only(path: UpgradePath) -> bool:
    """The only differences are new images whose vLLM version is not known yet (`up --plan`
    pulls nothing): the path depends on what `up` reads after the pull."""
    diffs = path.compat.differences
    return bool(diffs) and all(d.factor == "vllm_version" and d.new == UNKNOWN for d in diffs)


def emit_pending(emit: Emit, path: UpgradePath) -> None:
    olds = sorted({d.old for d in path.compat.differences})
    emit(
        Note(
            "upgrade path: roll engine by engine if the new image holds the build that runs "
            f"(vLLM {', '.join(olds)}); `up` reads its version after the pull, and a new "
            "build is never rolled: it then goes blue/green, or, where a tier has one engine "
            "or no proxy is in front, every engine is replaced at once (an outage, asked first)",
            "warn",
        )
    )


def emit_path(emit: Emit, path: UpgradePath) -> None:
    """The path and why; the phases of a path that is not a roll (a roll's are its steps)."""
    if path.kind == "none":
        return
    emit(Note(path.describe(), "warn" if path.kind == "outage" else "info"))
    if any(
        d.factor == "vllm_version" and UNKNOWN in (d.old, d.new) for d in path.compat.differences
    ):
        emit(
            Note(
                "  a vLLM version shown as ? could not be read (an image not pulled yet is "
                "read by `up` after its pull): the same build and hash inputs would roll"
            )
        )
    for p in path.phases:
        caps = ", ".join(c.describe() for c in p.capacity)
        state = "endpoint up" if p.endpoint_up else "ENDPOINT DOWN"
        emit(
            Note(
                f"  phase {p.number}: {p.what}; clients on {p.serving} ({caps}); {state}; "
                f"running: {', '.join(p.running) or 'none'}"
            )
        )


__all__ = [
    "Decision",
    "decide",
    "emit_path",
    "emit_pending",
    "exec_argv",
    "image_versions",
    "parse",
    "run_argv",
    "running_versions",
    "unread_build_only",
    "upgrade_path",
]
