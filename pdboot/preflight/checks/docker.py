"""Container runtime checks: engine reachable for the SSH user, version, Compose v2, the
NVIDIA runtime, and whether the image's CUDA can run on this host's driver.

``docker info`` is read as JSON (``--format '{{json .}}'``); the text form is also
understood, for captures and for old CLIs. The dockerd process itself is looked at
through /proc (its limits, capabilities and PATH), because that is what containers
inherit and where dockerd finds ``nvidia-container-runtime-hook``.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pdboot.preflight.checks import (
    CheckResult,
    Command,
    HostContext,
    ParseError,
    Section,
    unparsed,
    version_tuple,
)
from pdboot.preflight.checks.cuda import image_cuda_check, parse_image_env
from pdboot.transport import docker_cli

if TYPE_CHECKING:
    from pdboot.preflight.checks.facts import HostFacts

INFO = shlex.join(docker_cli.info_json())
COMPOSE = shlex.join(docker_cli.compose_version())
COMPOSE_MIN = (2, 24)
HOOK = "nvidia-container-runtime-hook"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Every dockerd on the machine (a test machine runs several): its command line, limits,
# capabilities and whether the NVIDIA hook is on ITS PATH. The one serving DOCKER_HOST is
# chosen when parsing.
DOCKERD = (
    'echo "docker_host=$DOCKER_HOST"; '
    "for p in $(pgrep -x dockerd); do "
    'echo "pid=$p"; '
    'echo "cmdline=$(tr "\\0" " " < /proc/$p/cmdline)"; '
    "grep -E '^Max (locked memory|open files)' /proc/$p/limits; "
    "grep '^CapEff' /proc/$p/status; "
    "env=$(tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null) || env=unreadable; "
    'if [ "$env" = unreadable ]; then echo "environ=unreadable"; path=$PATH; '
    "else path=$(printf '%s\\n' \"$env\" | sed -n 's/^PATH=//p'); "
    f"path=${{path:-{DEFAULT_PATH}}}; fi; "
    # look through /proc/PID/root: dockerd may live in another mount namespace
    'r=/proc/$p/root; [ -e "$r/" ] || r=; '
    f'IFS=:; for d in $path; do [ -x "$r$d/{HOOK}" ] && echo "hook=$d/{HOOK}"; done; unset IFS; '
    "done; true"
)


def image_command(image: str) -> str:
    return shlex.join(docker_cli.image_env(image))


def commands(ctx: HostContext) -> list[Command]:
    out = [
        Command("info", INFO, "docker"),
        Command("compose", COMPOSE, "docker"),
        Command("dockerd", DOCKERD, "docker", also_for=("host",)),
    ]
    if ctx.gpus_here and ctx.image:
        out.append(Command("image", image_command(ctx.image), "docker"))
    return out


# --------------------------------------------------------------------------- parsers


@dataclass(frozen=True)
class DockerInfo:
    server_version: str | None
    root_dir: str | None
    runtimes: tuple[str, ...]
    default_runtime: str | None
    cdi_devices: tuple[str, ...]
    errors: tuple[str, ...]
    # registries (names, CIDRs) dockerd pulls from over plain http
    insecure_registries: tuple[str, ...] = ()


def _insecure_json(d: Mapping[str, object]) -> tuple[str, ...]:
    rc = d.get("RegistryConfig")
    if not isinstance(rc, dict):
        return ()
    names = [
        str(k)
        for k, v in (rc.get("IndexConfigs") or {}).items()
        if isinstance(v, dict) and v.get("Secure") is False
    ]
    return (*names, *(str(c) for c in rc.get("InsecureRegistryCIDRs") or []))


def _insecure_text(lines: list[str]) -> tuple[str, ...]:
    """The lines indented under " Insecure Registries:" (names and CIDRs)."""
    out: list[str] = []
    indent: int | None = None
    for ln in lines:
        depth = len(ln) - len(ln.lstrip())
        if ln.strip() == "Insecure Registries:":
            indent = depth
        elif indent is not None and ln.strip() and depth > indent:
            out.append(ln.strip())
        else:
            indent = None
    return tuple(out)


def parse_info(text: str) -> DockerInfo:
    """`docker info --format '{{json .}}'` (plus any error lines), or the plain text form."""
    lines = text.splitlines()
    js = next((ln for ln in lines if ln.startswith("{")), None)
    errors = tuple(
        ln.strip()
        for ln in lines
        if not ln.startswith("{") and re.search(r"cannot connect|permission denied|error", ln, re.I)
    )
    if js is not None:
        try:
            d = json.loads(js)
        except json.JSONDecodeError as e:
            raise ParseError(f"bad JSON: {e}") from None
        if not isinstance(d, dict):
            raise ParseError("JSON is not an object")
        devices = tuple(
            str(x.get("ID", "")) for x in d.get("DiscoveredDevices") or [] if isinstance(x, dict)
        )
        return DockerInfo(
            server_version=d.get("ServerVersion") or None,
            root_dir=d.get("DockerRootDir") or None,
            runtimes=tuple(sorted(d.get("Runtimes") or {})),
            default_runtime=d.get("DefaultRuntime") or None,
            cdi_devices=devices,
            errors=errors + tuple(str(e) for e in d.get("ServerErrors") or []),
            insecure_registries=_insecure_json(d),
        )
    kv: dict[str, str] = {}
    devices_t: list[str] = []
    for ln in lines:
        key, sep, val = ln.strip().partition(":")
        if sep and key and key not in kv:
            kv[key] = val.strip()
        if ln.strip().startswith("cdi: "):
            devices_t.append(ln.strip()[len("cdi: ") :])
    if "Server Version" not in kv and not errors:
        raise ParseError("neither JSON nor `docker info` text")
    return DockerInfo(
        server_version=kv.get("Server Version") or None,
        root_dir=kv.get("Docker Root Dir") or None,
        runtimes=tuple(sorted(kv.get("Runtimes", "").split())),
        default_runtime=kv.get("Default Runtime") or None,
        cdi_devices=tuple(devices_t),
        errors=errors,
        insecure_registries=_insecure_text(lines),
    )


@dataclass(frozen=True)
class Dockerd:
    pid: int
    cmdline: str
    memlock_hard: int | None  # bytes; None = unlimited
    nofile_hard: int | None
    cap_eff: int | None
    hooks: tuple[str, ...] = ()
    environ_readable: bool = True

    @property
    def can_raise_limits(self) -> bool:
        """CAP_SYS_RESOURCE (bit 24) lets dockerd give containers more than its own limits."""
        return self.cap_eff is not None and bool(self.cap_eff >> 24 & 1)


@dataclass(frozen=True)
class DockerdScan:
    docker_host: str
    procs: tuple[Dockerd, ...] = field(default_factory=tuple)

    def serving(self) -> Dockerd | None:
        """The dockerd behind DOCKER_HOST (or the only one)."""
        if len(self.procs) == 1:
            return self.procs[0]
        sock = self.docker_host.removeprefix("unix://") if self.docker_host else ""
        for p in self.procs:
            if sock and sock in p.cmdline:
                return p
        if not sock:  # the default socket: the dockerd started without -H unix://
            plain = [p for p in self.procs if "unix://" not in p.cmdline]
            if len(plain) == 1:
                return plain[0]
        return None


def _limit(line: str) -> int | None:
    # "Max locked memory         8388608              8388608              bytes"
    parts = line.split()
    hard = parts[-2] if parts[-1] in ("bytes", "files") else parts[-1]
    if hard == "unlimited":
        return None
    if not hard.isdigit():
        raise ParseError(f"bad limit line: {line!r}")
    return int(hard)


def parse_dockerd(text: str) -> DockerdScan:
    docker_host = ""
    procs: list[Dockerd] = []
    cur: dict[str, object] | None = None

    def flush() -> None:
        if cur is not None:
            procs.append(Dockerd(**cur))  # type: ignore[arg-type]

    for ln in text.splitlines():
        if ln.startswith("docker_host="):
            docker_host = ln.split("=", 1)[1].strip()
        elif ln.startswith("pid="):
            flush()
            pid = ln.split("=", 1)[1].strip()
            if not pid.isdigit():
                raise ParseError(f"bad pid line {ln!r}")
            cur = {
                "pid": int(pid),
                "cmdline": "",
                "memlock_hard": None,
                "nofile_hard": None,
                "cap_eff": None,
                "hooks": (),
            }
        elif cur is None:
            continue
        elif ln.startswith("cmdline="):
            cur["cmdline"] = ln.split("=", 1)[1].strip()
        elif ln.startswith("Max locked memory"):
            cur["memlock_hard"] = _limit(ln)
        elif ln.startswith("Max open files"):
            cur["nofile_hard"] = _limit(ln)
        elif ln.startswith("CapEff:"):
            try:
                cur["cap_eff"] = int(ln.split(":", 1)[1].strip(), 16)
            except ValueError:
                raise ParseError(f"bad CapEff line {ln!r}") from None
        elif ln.startswith("hook="):
            cur["hooks"] = (*cur["hooks"], ln.split("=", 1)[1])  # type: ignore[misc]
        elif ln.startswith("environ=unreadable"):
            cur["environ_readable"] = False
    flush()
    return DockerdScan(docker_host, tuple(procs))


# --------------------------------------------------------------------------- verdicts

FIX_TOOLKIT = (
    "install nvidia-container-toolkit, then `sudo nvidia-ctk runtime configure "
    "--runtime=docker && sudo systemctl restart docker`"
)


@dataclass(frozen=True)
class ComposeFacts:
    section: Section  # `docker compose version --short`, for the failure message
    version: tuple[int, int] | None  # None: not installed or not a version


def parse_compose(c: Section) -> ComposeFacts:
    text = c.output.strip()
    m = re.match(r"^v?(\d+)\.(\d+)\S*$", text.splitlines()[0] if text else "")
    if c.rc != 0 or not m:
        return ComposeFacts(c, None)
    return ComposeFacts(c, (int(m.group(1)), int(m.group(2))))


@dataclass(frozen=True)
class DockerFacts:
    info_section: Section  # `docker info`, for the failure messages
    compose: ComposeFacts
    info: DockerInfo | None = None  # None: no CLI, or its text did not parse
    info_error: str | None = None  # why it did not parse
    dockerd: DockerdScan | None = None  # None: not found or not readable
    image: Section | None = None  # `docker image inspect` of the engine image (GPU hosts)
    image_cuda: str | None = None  # CUDA_VERSION of that image, when on the host
    image_error: bool = False  # the inspect ran but did not parse

    @property
    def cli_missing(self) -> bool:
        s = self.info_section
        return s.rc == 127 or "command not found" in s.output


def parse(ctx: HostContext, s: Mapping[str, Section]) -> DockerFacts:
    info: DockerInfo | None = None
    error = None
    try:
        info = parse_info(s["info"].output)
    except ParseError as e:
        error = str(e)
    try:
        scan: DockerdScan | None = parse_dockerd(s["dockerd"].output)
    except ParseError:
        scan = None
    img = s.get("image")
    cuda, img_error = None, False
    if img is not None and img.rc == 0:
        try:
            cuda = parse_image_env(img.output)
        except ParseError:
            img_error = True
    return DockerFacts(
        s["info"], parse_compose(s["compose"]), info, error, scan, img, cuda, img_error
    )


def evaluate(ctx: HostContext, facts: HostFacts) -> list[CheckResult]:
    f = facts.docker
    if f is None:
        return []
    if f.cli_missing:
        return [
            CheckResult(
                "docker.engine",
                "fail",
                "docker CLI not found",
                "install Docker Engine (docker-ce) and the compose plugin",
            )
        ]
    info = f.info
    if info is None:
        return [unparsed("docker.engine", f.info_section, f"docker info ({f.info_error})")]
    if info.server_version is None:
        err = "; ".join(info.errors) or f.info_section.first_lines(2)
        fix = "start dockerd (systemctl start docker)"
        if "permission denied" in err.lower():
            fix = (
                "add the SSH user to the docker group (sudo usermod -aG docker USER), log in again"
            )
        return [CheckResult("docker.engine", "fail", f"engine not reachable: {err}", fix)]
    out = [
        CheckResult("docker.engine", "pass", f"engine {info.server_version} reachable"),
        _version(info.server_version),
        _compose(f.compose),
    ]
    if ctx.gpus_here:  # device: cpu: cpu.py says why these are skipped
        out.append(_runtime(info, f.dockerd))
        if ctx.image:
            gpu = facts.gpu
            driver = gpu.driver if gpu is not None else None
            out.append(image_cuda_check(ctx, f.image, f.image_cuda, f.image_error, driver))
    return out


def _version(server: str) -> CheckResult:
    try:
        old = version_tuple(server.split("-")[0].split("+")[0])[:2] < (20, 10)
    except ParseError:
        old = False
    if old:
        return CheckResult(
            "docker.version",
            "warn",
            f"Docker {server} is older than 20.10",
            "upgrade Docker Engine",
        )
    return CheckResult("docker.version", "pass", f"Docker {server}")


def _compose(c: ComposeFacts) -> CheckResult:
    text = c.section.output.strip()
    if c.version is None:
        return CheckResult(
            "docker.compose",
            "fail",
            f"Compose v2 not available: {c.section.first_lines(2)}",
            "install the docker-compose-plugin package (Compose v2, `docker compose`)",
        )
    if c.version[0] < 2:
        return CheckResult(
            "docker.compose", "fail", f"Compose {text} is v1", "install Compose v2 (plugin)"
        )
    if c.version < COMPOSE_MIN:
        # The rendered projects use env_file entries with `path`/`required` (Compose 2.24+):
        # an older Compose rejects the file at `up`, after the pulls.
        return CheckResult(
            "docker.compose",
            "fail",
            f"Compose {text} is older than {COMPOSE_MIN[0]}.{COMPOSE_MIN[1]}",
            f"upgrade the docker-compose-plugin package to {COMPOSE_MIN[0]}.{COMPOSE_MIN[1]} "
            "or newer",
        )
    return CheckResult("docker.compose", "pass", f"Compose {text}")


def _runtime(info: DockerInfo, scan: DockerdScan | None) -> CheckResult:
    how = []
    if "nvidia" in info.runtimes:
        how.append("runtime 'nvidia' registered")
    if any(d.startswith("nvidia.com/gpu") for d in info.cdi_devices):
        how.append("CDI nvidia.com/gpu devices")
    proc = scan.serving() if scan else None
    if proc and proc.hooks:
        how.append(f"{HOOK} on dockerd's PATH")
    if how:
        return CheckResult("docker.nvidia_runtime", "pass", "; ".join(how))
    runtimes = ", ".join(info.runtimes) or "none listed"
    return CheckResult(
        "docker.nvidia_runtime",
        "fail",
        f"no NVIDIA container runtime (runtimes: {runtimes}; no {HOOK} on dockerd's PATH): "
        "GPU containers fail with 'could not select device driver \"nvidia\"'",
        FIX_TOOLKIT,
    )
