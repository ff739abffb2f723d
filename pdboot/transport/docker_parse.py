"""What Docker answers, parsed (pure, tested on captured output): pull progress and pull
errors, containers as ``Observed``, image references; and the errors a Docker host raises.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from docker.utils import parse_repository_tag

from pdboot.plan.converge import Observed
from pdboot.transport.connection import (
    HostLost,
)


class EngineError(Exception):
    """A Docker operation failed on a host; the message names the host and the cause."""

    def __init__(self, host: str, message: str) -> None:
        self.host = host
        self.message = message
        super().__init__(f"{host}: {message}")


class EngineLost(HostLost, EngineError):
    """The host was lost mid-run (see ``connection.HostLost``; catch that to handle both)."""

    def __init__(self, host: str, why: str) -> None:
        # Not through RemoteError.__init__: its super() call would land in EngineError's.
        model = HostLost(host, why)
        self.host, self.kind, self.message, self.fix = host, model.kind, model.message, model.fix
        Exception.__init__(self, f"{host}: {model.message}")


def docker_unreachable(sdk: str, cli: str = "") -> str:
    """Why the Docker engine of a host did not answer, with the fix, as preflight's
    docker.engine check says it. ``sdk``: the SDK's error (often only "Connection
    aborted"); ``cli``: what the docker CLI on the host said when asked the same (its
    stderr names the socket and the cause), empty when it could not be asked."""
    said = cli.strip().splitlines()[0][:300] if cli.strip() else sdk
    both = f"{sdk}\n{cli}".lower()
    if "permission denied" in both or "permissionerror" in both:
        cause, fix = (
            "the SSH user may not use the Docker socket",
            "add the SSH user to the docker group (sudo usermod -aG docker USER), log in again",
        )
    elif "command not found" in both or "docker: not found" in both:
        cause, fix = (
            "the docker CLI is not installed on the host",
            "install Docker Engine (docker-ce) and the compose plugin",
        )
    elif any(
        s in both
        for s in (
            "filenotfounderror",
            "no such file or directory",
            "cannot connect to the docker daemon",
            "is the docker daemon running",
            "connection refused",
        )
    ):
        cause, fix = (
            "the Docker daemon is not running (its socket does not answer)",
            "start dockerd (systemctl start docker); for a local host, check DOCKER_HOST",
        )
    else:
        cause, fix = (
            "the Docker engine did not answer",
            "check that dockerd runs on the host (`pdboot preflight` checks it)",
        )
    return f"cannot reach Docker: {cause} ({said}) (fix: {fix})"


def pull_error_cause(message: str) -> str:
    """Docker's pull error text -> a short cause an operator can act on."""
    m = message.lower()
    if "manifest unknown" in m or ("not found" in m and "manifest" in m):
        return f"no such image or tag in the registry ({message.strip()})"
    if "no space left on device" in m:
        return f"disk full on the host ({message.strip()})"
    if any(
        s in m
        for s in (
            "connection refused",
            "no such host",
            "i/o timeout",
            "dial tcp",
            "network is unreachable",
            "no route to host",
            "tls handshake timeout",
            "server gave http response to https client",
        )
    ):
        return f"registry unreachable ({message.strip()})"
    if "unauthorized" in m or "denied" in m or "authentication required" in m:
        return f"registry refused access ({message.strip()})"
    return message.strip()


@dataclass
class PullProgress:
    """Folds the engine's per-layer pull events into bytes done / total for one image."""

    image: str
    layers_total: dict[str, int] = field(default_factory=dict)
    layers_done: dict[str, int] = field(default_factory=dict)
    status: str = "starting"
    digest: str | None = None
    error: str | None = None

    def feed(self, event: Mapping[str, Any]) -> None:
        if "error" in event or "errorDetail" in event:
            detail = event.get("errorDetail") or {}
            self.error = str(detail.get("message") or event.get("error") or "pull failed")
            self.status = "failed"
            return
        status = str(event.get("status", ""))
        layer = str(event.get("id", ""))
        prog = event.get("progressDetail") or {}
        if status.startswith("Digest: "):
            self.digest = status[len("Digest: ") :].strip()
        if status.startswith("Status: "):
            self.status = status[len("Status: ") :].strip()
            return
        if not layer or status.startswith("Pulling from"):
            return
        total = prog.get("total")
        if status == "Downloading" and isinstance(total, int) and total > 0:
            self.layers_total[layer] = total
            self.layers_done[layer] = int(prog.get("current", 0))
            self.status = "downloading"
        elif status in ("Download complete", "Pull complete", "Verifying Checksum") or (
            status == "Extracting"
        ):
            if layer in self.layers_total:
                self.layers_done[layer] = self.layers_total[layer]
            if status == "Extracting":
                self.status = "extracting"
        elif status == "Already exists":
            self.layers_done.setdefault(layer, 0)

    @property
    def done(self) -> int:
        return sum(self.layers_done.values())

    @property
    def total(self) -> int:
        return sum(self.layers_total.values())


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) else None


def observed_from_inspect(host: str, data: Mapping[str, Any]) -> Observed:
    """``docker inspect`` JSON of one container -> Observed (lenient: missing keys are ok)."""
    state = data.get("State") or {}
    config = data.get("Config") or {}
    health = (state.get("Health") or {}).get("Status") or ""
    return Observed(
        host=host,
        id=str(data.get("Id", "")),
        name=str(data.get("Name", "")).lstrip("/"),
        labels=dict(config.get("Labels") or {}),
        state=str(state.get("Status", "unknown")),
        image=str(config.get("Image", "")),
        started_at=str(state.get("StartedAt", "")),
        created=str(data.get("Created", "")),
        exit_code=_int(state.get("ExitCode")),
        restart_count=_int(data.get("RestartCount")) or 0,
        docker_health=str(health),
        command=tuple(str(a) for a in config.get("Cmd") or ()),
        env=tuple(_env_pair(e) for e in config.get("Env") or () if "=" in str(e)),
        gpus=_gpus(data.get("HostConfig") or {}),
    )


def _env_pair(item: object) -> tuple[str, str]:
    name, _, value = str(item).partition("=")
    return name, value


def _gpus(host_config: Mapping[str, Any]) -> str:
    """The GPUs compose asked for: "all" (count -1), the device ids, or "" (none)."""
    for req in host_config.get("DeviceRequests") or ():
        if ["gpu"] in (req.get("Capabilities") or []):
            ids = req.get("DeviceIDs")
            return ",".join(str(i) for i in ids) if ids else "all" if req.get("Count") == -1 else ""
    return ""


def observed_from_list(host: str, item: Mapping[str, Any]) -> Observed:
    """One entry of the engine's container list (``docker ps -a``) -> Observed."""
    names = item.get("Names") or [""]
    status = str(item.get("Status", ""))
    m = re.search(r"Exited \((\d+)\)", status)
    return Observed(
        host=host,
        id=str(item.get("Id", "")),
        name=str(names[0]).lstrip("/"),
        labels=dict(item.get("Labels") or {}),
        state=str(item.get("State", "unknown")),
        image=str(item.get("Image", "")),
        exit_code=int(m.group(1)) if m else None,
    )


def split_image(image: str) -> tuple[str, str]:
    repo, tag = parse_repository_tag(image)
    return repo, tag or "latest"
