"""Which listening sockets and GPU processes on a host belong to this deployment.

Re-running `up` on a live deployment finds its ports taken and its GPUs' memory held -- by
its own engines and router. Preflight tells those apart from anything else by two commands
of the same batch (no extra SSH round trip):

- this deployment's containers, found by pdboot's deployment label (``docker ps --filter
  label=...``, the same labels `up` and `down` go by), with their role/host/engine labels
  and config hash;
- every process's container, read from ``/proc/<pid>/cgroup``: Docker puts each container
  in a cgroup named by its 64-hex id whatever the cgroup driver or version
  (``/docker/<id>``, ``/system.slice/docker-<id>.scope``, a ``--cgroup-parent``
  ``/<parent>/<id>``), and that file is world-readable.

Why cgroups and not ``docker top`` or the containers' State.Pid: a listener or a GPU
context is often a child process (vLLM's API server, its EngineCore), not the container's
first process, and ``docker top`` costs one API call per container. The cgroup grep covers
every process in one command. A socket's pid comes from ``ss -p`` (the host area's
command), which shows other users' processes only to root: to a non-root SSH user a port
held by anything stays "taken" (the message says why), never passed on a guess.

What ``up`` then does with each container is decided by the converge plan (``fates``):
kept as is, replaced (recreated: its ports and GPU memory are freed first), or removed
(no longer in the inventory).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pdboot.plan.converge import Observed, decode_restarts, orphans, owned, plan_up, with_restarts
from pdboot.plan.model import LABEL_DEPLOYMENT, Plan
from pdboot.preflight.checks import CheckResult, Command, HostContext, Section
from pdboot.transport import docker_cli

if TYPE_CHECKING:
    from pdboot.preflight.checks.facts import HostFacts

# -m1: a cgroup v1 file names the container once per controller; the first is enough
CGROUPS = "grep -s -m1 -o -E '[0-9a-f]{64}' /proc/[0-9]*/cgroup"


def containers_command(deployment: str) -> str:
    return shlex.join(docker_cli.containers_json(f"{LABEL_DEPLOYMENT}={deployment}"))


def commands(ctx: HostContext) -> list[Command]:
    if not ctx.deployment:
        return []
    return [
        Command("deployment", containers_command(ctx.deployment), "host", also_for=("gpu",)),
        Command("cgroups", CGROUPS, "host", also_for=("gpu",)),
    ]


# --------------------------------------------------------------------------- parsers


def parse_labels(text: str) -> dict[str, str]:
    """`docker ps --format json`'s Labels: "k=v,k=v" (a value's own commas, as in a
    compose config_files list, stay with that value)."""
    out: dict[str, str] = {}
    last = ""
    for part in text.split(",") if text else []:
        key, eq, value = part.partition("=")
        if eq and key:
            out[key] = value
            last = key
        elif last:
            out[last] += "," + part
    return out


def parse_ps(host: str, text: str) -> list[Observed]:
    """One JSON object a line (``docker ps --format '{{json .}}'``) -> Observed. A line
    that is not JSON (an error message) is skipped; the exit code tells."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(item, dict):
            continue
        status = str(item.get("Status", ""))
        m = re.search(r"Exited \((\d+)\)", status)
        out.append(
            Observed(
                host=host,
                id=str(item.get("ID", "")),
                name=str(item.get("Names", "")),
                labels=parse_labels(str(item.get("Labels", ""))),
                state=str(item.get("State", "unknown")),
                image=str(item.get("Image", "")),
                exit_code=int(m.group(1)) if m else None,
            )
        )
    return out


_CGROUP_RE = re.compile(r"^/proc/(\d+)/cgroup:([0-9a-f]{64})$")


def parse_cgroups(text: str) -> dict[int, str]:
    """``/proc/PID/cgroup:ID`` lines (grep -o over every process) -> pid -> container id."""
    out: dict[int, str] = {}
    for line in text.splitlines():
        m = _CGROUP_RE.match(line.strip())
        if m:
            out[int(m.group(1))] = m.group(2)
    return out


# --------------------------------------------------------------------------- fates

Action = Literal["keep", "replace", "remove"]


@dataclass(frozen=True)
class Fate:
    """What `up` will do with one of this deployment's containers."""

    container_id: str
    key: str  # decode@h3, prefill-1@h4 (the converge plan's service key)
    action: Action
    why: str = ""

    def describe(self) -> str:
        what = {"keep": "up keeps it", "replace": "up replaces it", "remove": "up removes it"}
        return f"{self.key} ({what[self.action]}{': ' + self.why if self.why else ''})"


# converge's "configuration changed: image ... -> ...; --port ...": up --plan shows that detail,
# here the fate is enough
_DETAIL_RE = re.compile(r"(?<=configuration changed): .*$")


def fates(plan: Plan, observed: Iterable[Observed]) -> dict[str, Fate]:
    """Container id -> what the converge plan does with it, exactly as `up` decides it
    (plan_up, decode restarts, orphans). Only containers labelled with the plan's
    deployment get one."""
    mine = owned(observed, plan.deployment)
    stages = plan_up(plan, mine)
    by_service: dict[tuple[str, str], list[Observed]] = {}
    for o in mine:
        by_service.setdefault((o.host, o.service_name), []).append(o)
    out: dict[str, Fate] = {}
    for step in (s for st in with_restarts(stages, decode_restarts(stages)) for s in st):
        svc = step.service
        for o in by_service.get((svc.host, svc.name), []):
            if step.kind == "unchanged":
                out[o.id] = Fate(o.id, svc.key, "keep")
            else:
                out[o.id] = Fate(o.id, svc.key, "replace", _DETAIL_RE.sub("", step.reason))
    for o in orphans(plan, mine):
        out[o.id] = Fate(o.id, o.key, "remove", "no longer in the inventory")
    return out


# --------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class OwnerFacts:
    """This deployment's containers on the host, and which container each process is in."""

    containers: tuple[Observed, ...]
    pid_container: Mapping[int, str]  # host pid -> container id (any container's)
    listed: bool  # the container list ran and answered (docker reachable)
    section: Section

    def container_of(self, pid: int) -> Observed | None:
        """This deployment's container the process runs in, None: another or none."""
        cid = self.pid_container.get(pid)
        return next((c for c in self.containers if c.id == cid), None) if cid else None


def parse(ctx: HostContext, s: Mapping[str, Section]) -> OwnerFacts | None:
    if not ctx.deployment:
        return None
    ps = s["deployment"]
    found = parse_ps(ctx.name, ps.output) if ps.rc == 0 else []
    mine = tuple(owned(found, ctx.deployment))
    return OwnerFacts(mine, parse_cgroups(s["cgroups"].output), ps.rc == 0, ps)


def holder(ctx: HostContext, c: Observed) -> str:
    """ "decode@h3 (up keeps it)": the container, with its fate when known."""
    fate = next((f for f in ctx.fates if f.container_id == c.id), None)
    return fate.describe() if fate is not None else c.key


def evaluate(ctx: HostContext, facts: HostFacts) -> list[CheckResult]:
    """One line naming this deployment's containers here, when there are any: what the
    ports and GPU checks' notes refer to."""
    f = facts.owners
    if f is None or not f.containers:
        return []
    running = [c for c in f.containers if c.running]
    rows = ", ".join(
        f"{holder(ctx, c)}{'' if c.running else ' [' + c.state + ']'}" for c in f.containers
    )
    return [
        CheckResult(
            "host.deployment",
            "pass",
            f"this deployment runs here ({len(running)} of {len(f.containers)} running): {rows}",
        )
    ]
