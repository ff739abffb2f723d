"""Host checks: free disk (Docker's data root, the HF cache), /dev/shm, the limits
containers can get (memlock / nofile), and that every port pdboot binds is free -- or held
by this deployment's own containers (owners.py), which `up` keeps or replaces."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdboot.preflight.checks import (
    CheckResult,
    Command,
    HostContext,
    ParseError,
    Section,
    gib,
    unparsed,
)
from pdboot.preflight.checks.docker import DockerdScan
from pdboot.preflight.checks.owners import OwnerFacts, holder
from pdboot.transport import docker_cli

if TYPE_CHECKING:
    from pdboot.preflight.checks.facts import HostFacts

PORTS = "ss -ltnpH"
SHM = "/dev/shm"  # noqa: S108 - the host's shared memory mount, not a temp file


def df_command(hf_cache: str) -> str:
    # The HF cache may not exist yet: measure the nearest existing parent.
    return (
        f"root=$({shlex.join(docker_cli.docker_root_dir())} 2>/dev/null); "
        'root=${root:-/var/lib/docker}; [ -e "$root" ] || root=/; '
        f"hf={shlex.quote(hf_cache)}; "
        'while [ ! -e "$hf" ]; do hf=$(dirname "$hf"); done; '
        'echo "docker_root=$root"; echo "hf_cache=$hf"; df -Pk "$root" "$hf" ' + SHM
    )


def commands(ctx: HostContext) -> list[Command]:
    out = [Command("ports", PORTS, "host")]
    out.append(Command("df", df_command(ctx.hf_cache), "host"))
    return out


@dataclass(frozen=True)
class Mount:
    filesystem: str
    size_kib: int
    avail_kib: int
    mounted_on: str


@dataclass(frozen=True)
class DiskFacts:
    docker_root: str
    hf_cache: str
    docker: Mount
    hf: Mount
    shm: Mount | None


def parse_df(text: str) -> list[Mount]:
    """`df -Pk` rows (header skipped)."""
    rows = []
    for ln in text.splitlines():
        parts = ln.split()
        if len(parts) < 6 or parts[0] == "Filesystem" or not parts[1].isdigit():
            continue
        if not parts[3].isdigit():
            raise ParseError(f"bad df row {ln!r}")
        rows.append(Mount(parts[0], int(parts[1]), int(parts[3]), " ".join(parts[5:])))
    return rows


def parse_disk(text: str) -> DiskFacts:
    kv = dict(ln.split("=", 1) for ln in text.splitlines() if re.match(r"^\w+=", ln))
    rows = parse_df(text)
    if len(rows) < 2 or "docker_root" not in kv:
        raise ParseError("expected docker_root, hf_cache and df rows")
    shm = rows[2] if len(rows) > 2 else None
    return DiskFacts(kv["docker_root"], kv.get("hf_cache", "?"), rows[0], rows[1], shm)


@dataclass(frozen=True)
class Listener:
    address: str
    port: int
    process: str  # the first holder, in words: "vllm (pid 16785)"; "" when ss shows none
    pids: tuple[int, ...] = ()  # every process holding the socket (forked servers share it)


_USERS_RE = re.compile(r'users:\(\("([^"]+)",pid=(\d+)')
_PID_RE = re.compile(r"\bpid=(\d+)")


def parse_ss(text: str) -> list[Listener]:
    """`ss -ltnpH` (or -ltn with a header) -> listening TCP sockets."""
    out = []
    for ln in text.splitlines():
        parts = ln.split()
        if not parts or parts[0] in ("State", "Netid"):
            continue
        if len(parts) < 4:
            raise ParseError(f"bad ss row {ln!r}")
        local = parts[3]
        addr, _, port = local.rpartition(":")
        if not port.isdigit():
            raise ParseError(f"bad local address {local!r}")
        m = _USERS_RE.search(ln)
        pids = tuple(dict.fromkeys(int(p) for p in _PID_RE.findall(ln)))
        who = f"{m.group(1)} (pid {m.group(2)})" if m else ""
        out.append(Listener(addr, int(port), who, pids))
    return out


@dataclass(frozen=True)
class HostSysFacts:
    df: Section  # the df script's output, for the failure message
    disk: DiskFacts | None  # None: did not parse (disk_error says why)
    ports_section: Section  # `ss -ltnpH`
    listeners: tuple[Listener, ...] | None  # None: ss missing or its text did not parse
    disk_error: str = ""
    ports_error: str = ""

    @property
    def ss_missing(self) -> bool:
        return self.ports_section.rc == 127


def parse(ctx: HostContext, s: Mapping[str, Section]) -> HostSysFacts:
    disk, disk_error = None, ""
    try:
        disk = parse_disk(s["df"].output)
    except ParseError as e:
        disk_error = str(e)
    listeners: tuple[Listener, ...] | None = None
    ports_error = ""
    if s["ports"].rc != 127:
        try:
            listeners = tuple(parse_ss(s["ports"].output))
        except ParseError as e:
            ports_error = str(e)
    return HostSysFacts(s["df"], disk, s["ports"], listeners, disk_error, ports_error)


def evaluate(ctx: HostContext, facts: HostFacts) -> list[CheckResult]:
    f = facts.host
    if f is None:
        return []
    out = _disk(ctx, f)
    out.append(_ports(ctx, f, facts.owners))
    if ctx.gpu_host:
        out.append(_ulimits(ctx, facts.docker.dockerd if facts.docker is not None else None))
    return out


def _disk(ctx: HostContext, f: HostSysFacts) -> list[CheckResult]:
    d = f.disk
    if d is None:
        return [unparsed("host.disk", f.df, f"df ({f.disk_error})")]
    min_b = ctx.req.min_free_disk_gb * 1e9
    out = []
    same = d.docker.filesystem == d.hf.filesystem and d.docker.mounted_on == d.hf.mounted_on
    checks = [("host.disk_docker", f"Docker data root {d.docker_root}", d.docker, min_b)]
    if ctx.gpu_host:
        # one filesystem holding both: it must take the image and the weights together
        need = min_b + (ctx.image_size_bytes if same else 0)
        checks.append(("host.disk_hf_cache", f"HF cache {ctx.hf_cache}", d.hf, need))
    for cid, what, m, need in checks:
        free = m.avail_kib * 1024
        msg = f"{what}: {gib(free)} free on {m.mounted_on}"
        if free < need:
            out.append(
                CheckResult(
                    cid,
                    "fail",
                    f"{msg}, needs {gib(need)} (requirements.min_free_disk_gb"
                    f"{' + the image, same filesystem' if need > min_b else ''})",
                    f"free space on {m.mounted_on} or move Docker's data-root / "
                    "container.hf_cache to a larger disk",
                )
            )
        else:
            out.append(CheckResult(cid, "pass", msg))
    if ctx.gpus_here:  # device: cpu: cpu.shm (free space per engine)
        if d.shm is None:
            out.append(CheckResult("host.shm", "warn", f"{SHM} not found"))
        elif d.shm.size_kib * 1024 < ctx.shm_size_bytes:
            out.append(
                CheckResult(
                    "host.shm",
                    "warn",
                    f"{SHM} is {gib(d.shm.size_kib * 1024)}, container.shm_size asks "
                    f"{gib(ctx.shm_size_bytes)} (engines share the host's IPC namespace)",
                    "mount -o remount,size=<N>G /dev/shm (and in /etc/fstab)",
                )
            )
        else:
            out.append(CheckResult("host.shm", "pass", f"{SHM} {gib(d.shm.size_kib * 1024)}"))
    return out


def _ports(ctx: HostContext, f: HostSysFacts, owners: OwnerFacts | None) -> CheckResult:
    if f.ss_missing:
        return CheckResult(
            "host.ports", "warn", "ss not found; ports not checked", "install iproute2"
        )
    listeners = f.listeners
    if listeners is None:
        return unparsed("host.ports", f.ports_section, f"ss ({f.ports_error})")
    taken: list[str] = []
    ours: dict[str, list[str]] = {}  # holder -> its ports, in words
    hidden = False
    for port, what in ctx.ports:
        users = [ln for ln in listeners if ln.port == port]
        if not users:
            continue
        mine = _own_holders(ctx, users, owners)
        if mine is not None:
            for h in mine:
                ours.setdefault(h, []).append(f"{port} ({what})")
            continue
        foreign = next((u for u in users if not _all_own(u, owners)), users[0])
        hidden = hidden or not foreign.pids
        who = foreign.process or f"listening on {foreign.address}:{port}"
        taken.append(f"{port} ({what}) is taken by {who}")
    held = "; ".join(f"{', '.join(ps)} held by this deployment: {h}" for h, ps in ours.items())
    if taken:
        if hidden and owners is not None and owners.containers:
            taken.append(
                "ss shows no process for it (only root sees other users' sockets), so it "
                "cannot be told apart from this deployment's containers: run preflight as root"
            )
        return CheckResult(
            "host.ports",
            "fail",
            "; ".join(taken + ([held] if held else [])),
            "stop what listens there or change the port in the inventory",
        )
    busy = {p for ps in ours.values() for p in ps}
    free = [str(p) for p, what in ctx.ports if f"{p} ({what})" not in busy]
    parts = [f"ports {', '.join(free)} free"] if free or not held else []
    return CheckResult("host.ports", "pass", "; ".join(parts + ([held] if held else [])))


def _all_own(ln: Listener, owners: OwnerFacts | None) -> bool:
    return (
        bool(ln.pids)
        and owners is not None
        and all(owners.container_of(p) is not None for p in ln.pids)
    )


def _own_holders(
    ctx: HostContext, users: list[Listener], owners: OwnerFacts | None
) -> list[str] | None:
    """The containers of this deployment holding every one of these sockets, named with
    their fate; None when any holder is something else (or unknown: no pid shown)."""
    if owners is None or not all(_all_own(u, owners) for u in users):
        return None
    found = {}
    for u in users:
        for p in u.pids:
            c = owners.container_of(p)
            if c is not None:
                found[c.id] = holder(ctx, c)
    return list(found.values())


def _fmt_limit(v: int | None) -> str:
    return "unlimited" if v is None or v < 0 else str(v)


def _ulimits(ctx: HostContext, scan: DockerdScan | None) -> CheckResult:
    proc = scan.serving() if scan else None
    if proc is None:
        return CheckResult(
            "host.ulimits",
            "skip",
            "dockerd process not found; cannot tell which limits containers can get",
        )
    problems = []
    want_ml = None if ctx.memlock < 0 else ctx.memlock
    if not proc.can_raise_limits:
        if proc.memlock_hard is not None and (want_ml is None or want_ml > proc.memlock_hard):
            problems.append(
                f"memlock {_fmt_limit(want_ml)} requested but dockerd's hard limit is "
                f"{proc.memlock_hard} bytes"
            )
        if proc.nofile_hard is not None and ctx.nofile > proc.nofile_hard:
            problems.append(
                f"nofile {ctx.nofile} requested but dockerd's hard limit is {proc.nofile_hard}"
            )
    if problems:
        return CheckResult(
            "host.ulimits",
            "fail",
            "; ".join(problems)
            + " and it lacks CAP_SYS_RESOURCE: containers fail to start ('error setting "
            "rlimit'); with lowered limits RDMA memory registration breaks or falls back to TCP",
            "run dockerd with LimitMEMLOCK=infinity and LimitNOFILE=1048576 (systemd unit), "
            "or lower container.ulimits",
        )
    if want_ml is not None and want_ml < (64 << 20):
        return CheckResult(
            "host.ulimits",
            "warn",
            f"container memlock limited to {want_ml} bytes: RDMA memory registration will "
            "fail or fall back to TCP",
            "set container.ulimits.memlock: -1 on hosts that allow it",
        )
    return CheckResult(
        "host.ulimits",
        "pass",
        f"containers can get memlock {_fmt_limit(want_ml)}, nofile {ctx.nofile} "
        f"(dockerd hard limits {_fmt_limit(proc.memlock_hard)} / {_fmt_limit(proc.nofile_hard)})",
    )
