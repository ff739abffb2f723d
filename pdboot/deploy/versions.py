"""The vLLM build each changed engine runs now, read inside its running container: the image
reference it started from may since name another build (a nightly tag moves at every pull),
and the build is what NIXL's compatibility hash sees (plan/nixl_compat.py). Read only for
engines whose image changes; `up` reads the new images' versions after the pull
(preflight/image_args.py). Then the path a change takes (plan/upgrade.py), in events, and
what the path's choice (plan/upgrade.py's ``decide``, pure: one choice for `up` and
`up --plan`) needs read from the hosts (``read_builds``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pdboot.deploy.all_hosts import OP_DEADLINE
from pdboot.events import Emit, Note
from pdboot.plan import degraded
from pdboot.plan.change_plan import ChangePlan
from pdboot.plan.converge import Step
from pdboot.plan.nixl_compat import UNKNOWN, ImageVersion
from pdboot.plan.upgrade import Decision, UpgradePath, replaced_engines
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


@dataclass(frozen=True)
class BuildsRead:
    """What the pure choice (plan/upgrade.py's ``decide``) needs read from the hosts."""

    running: Mapping[str, ImageVersion]  # the build each replaced engine runs now
    images: Mapping[str, ImageVersion]  # the build each new image holds (pulled or local)


def read_builds(
    hosts: Hosts, change: ChangePlan, pulled: Mapping[str, ImageVersion] | None
) -> BuildsRead | None:
    """The builds that run and the ones the new images hold, for a change that replaces
    engines (None: it replaces none, nothing to read). ``pulled``: what `up`'s image check
    read in the pulled images; None for `up --plan`, which pulls nothing."""
    if not change.rolls:
        return None
    steps = [s for st in change.stages for s in st]
    return BuildsRead(running_versions(hosts, steps), image_versions(hosts, steps, pulled or {}))


def emit_decision(emit: Emit, decided: Decision) -> None:
    if decided.path is None:
        return
    if decided.pending:
        emit_pending(emit, decided.path)
    else:
        emit_path(emit, decided.path)


def emit_pending(emit: Emit, path: UpgradePath) -> None:
    olds = sorted({d.old for d in path.compat.differences})
    emit(
        Note(
            "upgrade path: roll engine by engine if the new image holds the build that runs "
            f"(vLLM {', '.join(olds)}); `up` reads its version after the pull, and a new "
            "build is never rolled: it then goes blue/green, or, where a tier has one engine "
            "or no proxy is in front, through degraded mode (each tier serves alone while "
            "the other is replaced)",
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
        if p.mode != "pd":
            state += f", {degraded.describe(p.mode)}"
        emit(
            Note(
                f"  phase {p.number}: {p.what}; clients on {p.serving} ({caps}); {state}; "
                f"running: {', '.join(p.running) or 'none'}"
            )
        )


__all__ = [
    "BuildsRead",
    "emit_decision",
    "emit_path",
    "emit_pending",
    "exec_argv",
    "image_versions",
    "parse",
    "read_builds",
    "run_argv",
    "running_versions",
]
