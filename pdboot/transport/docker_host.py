"""Docker on one host: pull with progress, compose up per service, inspect, logs, removal.

With ``docker_sdk`` the only modules that import the docker SDK. The SDK gives typed JSON
(lenient to version drift) and the streamed per-layer pull progress that the docker CLI only
prints to a TTY. Compose has no API, so it runs as the ``docker compose`` CLI on the host
through the same connection, with argv lists (quoted by ``pdboot.transport.connection``).
Parsing of what the engine returns lives in ``docker_parse``.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import shlex
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors

from pdboot.plan.converge import Observed
from pdboot.plan.model import LABEL_DEPLOYMENT
from pdboot.transport import docker_cli
from pdboot.transport.connection import (
    Connection,
    RemoteError,
)
from pdboot.transport.docker_parse import (
    EngineError,
    EngineLost,
    PullProgress,
    docker_unreachable,
    observed_from_inspect,
    pull_error_cause,
    split_image,
)
from pdboot.transport.docker_sdk import api_for
from pdboot.transport.masking import mask
from pdboot.transport.pulled_record import PULLED_FILE, parse_record, record_lines
from pdboot.transport.ship_scripts import (
    PROJECT_MARKER,
    claim_project_dir,
    secret_tar,
    ship_script,
)

log = logging.getLogger(__name__)


class ContainerGone(EngineError):
    """Docker has no such container (it was removed meanwhile)."""


@dataclass(frozen=True)
class PullResult:
    image: str
    pulled: bool  # False: already present with the registry's digest
    digest: str | None
    note: str = ""


class Engine:
    """Docker on one host, through that host's pdboot connection."""

    def __init__(self, conn: Connection, api: Any, timeout: int | None = 120) -> None:
        self.conn = conn
        self.host = conn.name
        self.api = api
        self.timeout = timeout

    @classmethod
    def open(cls, conn: Connection, timeout: int | None = 120) -> Engine:
        """``timeout``: seconds a read may wait; None for streams that can stay quiet
        for long (``logs -f``)."""
        try:
            return cls(conn, api_for(conn, timeout), timeout)
        except EngineError:
            raise
        except RemoteError as e:
            raise EngineError(conn.name, f"cannot reach Docker: {e.message}") from e
        except Exception as e:
            raise EngineError(conn.name, docker_unreachable(_short(e), _cli_says(conn))) from e

    def _err(self, message: str) -> EngineError:
        """The error to raise: the host's loss when its connection was lost (every call on
        it fails then, and "cannot inspect" would hide why), else ``message``."""
        lost = self.conn.lost
        return EngineLost(self.host, lost) if lost else EngineError(self.host, message)

    def reopen(self) -> None:
        """A new SDK client after the connection reconnected (the old one's HTTP pool holds
        channels of the closed transport), in place for every holder of this engine."""
        self.close()
        self.api = Engine.open(self.conn, self.timeout).api

    def close(self) -> None:
        try:
            self.api.close()
        except Exception:  # closing must not hide the error that got us here
            log.debug("closing the docker client of %s failed", self.host, exc_info=True)

    # ---- images

    def local_digests(self, image: str) -> list[str]:
        try:
            data = self.api.inspect_image(image)
        except docker.errors.ImageNotFound:
            return []
        except Exception as e:
            raise self._err(f"cannot inspect image {image}: {_short(e)}") from e
        return [d.split("@", 1)[1] for d in data.get("RepoDigests") or [] if "@" in d]

    def registry_digest(self, image: str) -> str | None:
        try:
            data = self.api.inspect_distribution(image)
        except Exception:  # the pull that follows reports why the registry is unhappy
            return None
        desc = data.get("Descriptor") or {}
        d = desc.get("digest")
        return str(d) if d else None

    def pull(self, image: str, on_progress: Callable[[PullProgress], None]) -> PullResult:
        """Pull unless present with the registry's digest. Raises EngineError with the cause."""
        have = self.local_digests(image)
        remote = self.registry_digest(image)
        if have and remote and remote in have:
            return PullResult(image, False, remote, "already present")
        if have and remote is None:
            # Present but the registry cannot tell us its digest; let the pull decide.
            pass
        progress = PullProgress(image)
        repo, tag = split_image(image)
        try:
            for event in self.api.pull(repo, tag=tag, stream=True, decode=True):
                progress.feed(event)
                on_progress(progress)
                if progress.error:
                    break
        except docker.errors.APIError as e:
            raise self._err(f"pull {image}: {pull_error_cause(_explain(e))}") from e
        except Exception as e:
            raise self._err(f"pull {image}: {pull_error_cause(_short(e))}") from e
        if progress.error:
            raise self._err(f"pull {image}: {pull_error_cause(progress.error)}")
        return PullResult(image, True, progress.digest)

    def remove_image(self, image: str) -> bool:
        try:
            self.api.remove_image(image)
        except docker.errors.ImageNotFound:
            return False
        except Exception as e:
            raise self._err(f"cannot remove image {image}: {_explain(e)}") from e
        return True

    def record_pulled(self, project_dir: str, entries: list[tuple[str, str]]) -> None:
        """Append what this run pulled (image, digest) to the host's record in the project
        dir (claimed as ``ship`` does: the pull comes before the ship)."""
        lines = record_lines(entries)
        if not lines:
            return
        path = shlex.quote(f"{project_dir}/{PULLED_FILE}")
        script = "set -e; umask 077\n" + claim_project_dir(project_dir) + f"cat >> {path}\n"
        try:
            res = self.conn.run(script, stdin=lines)
        except RemoteError as e:
            raise self._err(f"cannot record the pulled images: {e.message}") from e
        if res.rc != 0:
            raise self._err(f"cannot record the pulled images: {mask(res.stderr.strip())}")

    def pulled(self, project_dir: str) -> list[tuple[str, str]]:
        """The (image, digest) pairs pdboot recorded pulling on this host."""
        return parse_record(self.read_file(f"{project_dir}/{PULLED_FILE}"))

    # ---- containers

    def containers(self, deployment: str) -> list[Observed]:
        """This deployment's containers on the host (by label; running or not)."""
        try:
            items = self.api.containers(
                all=True, filters={"label": [f"{LABEL_DEPLOYMENT}={deployment}"]}
            )
        except Exception as e:
            raise self._err(f"cannot list containers: {_short(e)}") from e
        out = []
        for item in items:
            try:
                out.append(self.inspect(str(item["Id"])))
            except ContainerGone:  # removed between list and inspect
                continue
        return out

    def inspect(self, container_id: str) -> Observed:
        """Raises ContainerGone only when Docker says there is no such container: any other
        failure (a slow engine, a dropped channel) is an error, never "not running"; a
        container skipped on a failed read made `up --plan` see a change that was not
        there (tests/e2e/test_rolling.py)."""
        try:
            data = self.api.inspect_container(container_id)
        except docker.errors.NotFound as e:
            raise ContainerGone(self.host, f"no container {container_id[:12]}") from e
        except Exception as e:
            raise self._err(f"cannot inspect {container_id[:12]}: {_short(e)}") from e
        return observed_from_inspect(self.host, data)

    def logs(
        self,
        container_id: str,
        tail: int | None = 50,
        since: int | None = None,
        timestamps: bool = False,
    ) -> list[str]:
        """The last ``tail`` lines (None: all; ``since``: only lines written after this Unix
        time; ``timestamps``: Docker's RFC 3339 time before each line)."""
        try:
            raw = self.api.logs(
                container_id,
                stdout=True,
                stderr=True,
                tail="all" if tail is None else tail,
                since=since,
                timestamps=timestamps,
            )
        except Exception as e:
            raise self._err(f"cannot read logs: {_short(e)}") from e
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        return [mask(line) for line in text.splitlines()]

    def follow_logs(
        self,
        container_id: str,
        tail: int | None = 50,
        since: int | None = None,
        timestamps: bool = False,
    ) -> Iterator[str]:
        try:
            stream = self.api.logs(
                container_id,
                stdout=True,
                stderr=True,
                tail="all" if tail is None else tail,
                since=since,
                timestamps=timestamps,
                stream=True,
                follow=True,
            )
            buf = ""
            for chunk in stream:
                buf += chunk.decode(errors="replace") if isinstance(chunk, bytes) else str(chunk)
                *lines, buf = buf.split("\n")
                for line in lines:
                    yield mask(line)
            if buf:
                yield mask(buf)
            if self.conn.lost:  # the stream just ends when the link dies
                raise self._err("")
        except EngineLost:
            raise
        except Exception as e:
            raise self._err(f"cannot follow logs: {_short(e)}") from e

    def stop_remove(self, container_ids: list[str], grace: int = 30) -> None:
        """Stop (SIGTERM, then SIGKILL after ``grace`` s) and remove these containers."""
        errors = []
        for cid in container_ids:
            try:
                self.api.stop(cid, timeout=grace)
            except docker.errors.NotFound:
                continue
            except Exception as e:
                errors.append(f"stop {cid[:12]}: {_short(e)}")
            try:
                self.api.remove_container(cid, force=True)
            except docker.errors.NotFound:
                continue
            except Exception as e:
                errors.append(f"remove {cid[:12]}: {_short(e)}")
        if errors:
            raise self._err("; ".join(errors))

    # ---- compose and files (through the host's shell; argv lists are quoted by remote)

    def ship(
        self,
        project_dir: str,
        compose_text: str,
        secrets_text: str | None,
        extra: Mapping[str, str] | None = None,
    ) -> None:
        """compose.yaml (0644), any ``extra`` files (0644, e.g. the RDMA record) and, if
        given, secrets.env (0600) into a 0700 project dir, in one round trip. Every file
        travels on stdin (see ship_script), never in the command line: the secrets stay out
        of argument lists, and a compose file over 128 KiB does not hit E2BIG."""
        script, stdin = ship_script(
            project_dir, {"compose.yaml": compose_text, **(extra or {})}, secrets_text
        )
        try:
            res = self.conn.run(script, stdin=stdin)
        except RemoteError as e:
            raise self._err(e.message) from e
        if res.rc != 0:
            raise self._err(f"cannot write into {project_dir}: {mask(res.stderr.strip())}")

    def compose_up(
        self,
        project_dir: str,
        project: str,
        service: str | Sequence[str],
        *,
        recreate: bool,
        timeout: float,
        file: str = "compose.yaml",
    ) -> None:
        """`docker compose up` of one service, or several at once (compose starts them in
        parallel: the engines of a host)."""
        names = [service] if isinstance(service, str) else list(service)
        # ``file``: another than compose.yaml for a roll bringing an old engine back
        argv = docker_cli.compose_up(project_dir, project, names, file=file, recreate=recreate)
        what = f"start {', '.join(names)}"
        try:
            self._run(argv, what, timeout=timeout)
        except EngineError as e:
            if not is_transient_runtime_error(str(e)):
                raise
            # runc occasionally fails a container's init on a loaded host without a cause
            # (seen as "error during container init: %!w(<nil>)"); compose left the
            # container created, and a second `up` of the same service starts it.
            self._run(argv, what, timeout=timeout)

    def run_once(self, argv: list[str], timeout: float) -> tuple[int, str]:
        """A short-lived `docker run --rm ...` on the host (the docker CLI, argv quoted by
        remote): (exit code, stdout + stderr). A nonzero exit is the caller's to judge."""
        try:
            res = self.conn.run(argv, timeout=timeout)
        except RemoteError as e:
            raise EngineError(self.host, f"cannot run {shlex.join(argv[:3])}: {e.message}") from e
        return res.rc, mask(res.stdout + res.stderr)

    def run_streamed(
        self,
        name: str,
        image: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        binds: Sequence[str],
        on_line: Callable[[str], None],
        secret_files: Mapping[str, str] | None = None,
    ) -> int:
        """A one-shot container (host network, no GPU) whose output lines are handed to
        ``on_line`` (masked) as they come; returns its exit code and removes it. A container
        left by an interrupted earlier run under the same name is removed first.
        ``secret_files`` (path in the container -> text): put into the created container
        (0600, a tar through the Docker API) before it starts, so that no secret is in its
        configuration (`docker inspect`); the program is expected to read and remove them."""
        api = self.api
        with contextlib.suppress(docker.errors.NotFound):
            api.remove_container(name, force=True)
        try:
            hc = api.create_host_config(binds=list(binds), network_mode="host")
            c = api.create_container(
                image,
                command=list(argv[1:]),
                entrypoint=[argv[0]],
                environment=dict(env),
                host_config=hc,
                name=name,
                labels={"pdboot.oneshot": name},
            )
            for path, text in (secret_files or {}).items():
                api.put_archive(c["Id"], posixpath.dirname(path), secret_tar(path, text))
            api.start(c["Id"])
            buf = ""
            for chunk in api.logs(c["Id"], stdout=True, stderr=True, stream=True, follow=True):
                buf += chunk.decode(errors="replace") if isinstance(chunk, bytes) else str(chunk)
                *lines, buf = buf.replace("\r", "\n").split("\n")
                for line in lines:
                    on_line(mask(line))
            if buf:
                on_line(mask(buf))
            return int(api.wait(c["Id"])["StatusCode"])
        except EngineError:
            raise
        except Exception as e:
            raise self._err(f"cannot run {name}: {_short(e)}") from e
        finally:
            with contextlib.suppress(Exception):
                api.remove_container(name, force=True)

    def read_file(self, path: str) -> str | None:
        """A small file's text, or None when it is not there (or unreadable)."""
        try:
            res = self.conn.run(["cat", "--", path], timeout=30)
        except RemoteError as e:
            raise self._err(f"cannot read {path}: {e.message}") from e
        return res.stdout if res.rc == 0 else None

    def remove_project_dir(self, project_dir: str) -> None:
        """rm -rf, only of a directory whose marker names this deployment: `up` wrote it
        when it created the directory, so nothing pdboot did not create is ever removed."""
        d, m = shlex.quote(project_dir), shlex.quote(f"{project_dir}/{PROJECT_MARKER}")
        name = shlex.quote(posixpath.basename(project_dir))
        script = (
            f"[ -e {d} ] || exit 0\n"
            f'if [ "$(cat {m} 2>/dev/null)" != {name} ]; then\n'
            f"  echo refusing to remove {d}: it has no {PROJECT_MARKER} naming deployment"
            f" {name}, so pdboot did not create it. Remove it by hand if it is yours. >&2\n"
            "  exit 3\nfi\n"
            f"rm -rf --one-file-system {d}\n"
        )
        try:
            res = self.conn.run(script)
        except RemoteError as e:
            raise EngineError(self.host, f"cannot remove {project_dir}: {e.message}") from e
        if res.rc != 0:
            raise EngineError(self.host, mask(res.stderr.strip() or f"rm exit {res.rc}"))

    def _run(self, argv: list[str], what: str, timeout: float | None = None) -> str:
        try:
            res = self.conn.run(argv, timeout=timeout)
        except RemoteError as e:
            raise self._err(f"cannot {what}: {e.message}") from e
        if res.rc != 0:
            detail = mask((res.stderr.strip() or res.stdout.strip())[-800:])
            raise self._err(f"cannot {what} ({shlex.join(argv[:2])} exit {res.rc}): {detail}")
        return res.stdout


# Written by `up` into the project dir it creates (the deployment's name); `down --purge`
# removes only a directory holding it.
def is_transient_runtime_error(message: str) -> bool:
    """A container start that failed inside runc with no cause given: worth one retry.
    Failures that name a cause (a missing NVIDIA hook, a bad mount, no such file) are not."""
    return "error during container init: %!w(<nil>)" in message


def _cli_says(conn: Connection) -> str:
    """The docker CLI's own words on the host when the SDK could not reach the engine
    (the SDK's error seldom names the cause); empty when it answered or could not run."""
    try:
        res = conn.run(["docker", "version", "--format", "{{.Server.Version}}"], timeout=20)
    except Exception:  # the caller reports the SDK's error then
        return ""
    return "" if res.rc == 0 else mask(res.stderr.strip() or res.stdout.strip())


def _explain(e: Exception) -> str:
    expl = getattr(e, "explanation", None)
    return mask(str(expl or e))


def _short(e: Exception) -> str:
    text = str(e) or type(e).__name__
    return mask(text.splitlines()[0][:300] if text else type(e).__name__)
