"""The docker CLI's command lines, spelled once: deploy/ and preflight/ say what they want
(compose up of a file, exec in a container, a one-shot program in an image, stop, remove,
restart, list by label) and run the argv through the host's connection; only transport/
spells `docker ...` (tests/unit/repo/test_docker_seam.py holds it). Pure.

SDK or CLI, by kind of operation (docker_host.py holds the SDK side):
- the SDK (docker_sdk.py, over pdboot's verified SSH channel): pulls (per-layer progress the
  CLI prints only to a TTY), listing and inspecting containers by label, logs, stopping and
  removing what a listing found: typed JSON, lenient to version drift;
- the CLI, here: Compose (it has no API), a program run in a container or a one-shot
  container (its output read as text, with the host's own exit code), and what the
  router swap, the watch service and staging do by container name or label in the same
  round trip as their other commands.
"""

from __future__ import annotations

from collections.abc import Sequence


def compose_up(
    project_dir: str,
    project: str,
    services: Sequence[str],
    *,
    file: str = "compose.yaml",
    recreate: bool = False,
) -> list[str]:
    """`docker compose up` of these services of ``project_dir/file``: detached, no
    dependencies, never pulling (images were pulled before, by digest)."""
    argv = [
        "docker", "compose", "--project-name", project, "--project-directory", project_dir,
        "--file", f"{project_dir}/{file}",
        "up", "--detach", "--no-deps", "--pull", "never",
    ]  # fmt: skip
    if recreate:
        argv.append("--force-recreate")
    return [*argv, *services]


def exec_in(container: str, *command: str) -> list[str]:
    """``command`` run inside a running container."""
    return ["docker", "exec", container, *command]


def run_once(
    image: str,
    *command: str,
    entrypoint: str | None = None,
    network: str | None = None,
    gpus: str | None = None,
    pull_never: bool = False,
    options: Sequence[str] = (),
) -> list[str]:
    """A one-shot container of ``image`` (removed when it exits) running ``command``.
    ``options``: further `docker run` options (mounts, environment), before the image."""
    argv = ["docker", "run", "--rm"]
    if pull_never:
        argv += ["--pull", "never"]
    if network is not None:
        argv += ["--network", network]
    if gpus is not None:
        argv += ["--gpus", gpus]
    argv += options
    if entrypoint is not None:
        argv += ["--entrypoint", entrypoint]
    return [*argv, image, *command]


def stop(container: str, grace_s: int) -> list[str]:
    """SIGTERM, then SIGKILL after ``grace_s`` seconds."""
    return ["docker", "stop", "--time", str(grace_s), container]


def restart(container: str, grace_s: int) -> list[str]:
    return ["docker", "restart", "--time", str(grace_s), container]


def remove(*containers: str) -> list[str]:
    """Remove these containers, running or not."""
    return ["docker", "rm", "--force", *containers]


def ids_with_label(label: str) -> list[str]:
    """The ids of every container (running or not) with this label (``key=value``)."""
    return ["docker", "ps", "-aq", "--filter", f"label={label}"]


def image_id(image: str) -> list[str]:
    """The local image's id (`docker image inspect`)."""
    return ["docker", "image", "inspect", "--format", "{{.Id}}", image]


# preflight's probes: read-only lines of its one batch script (shlex.join of these)


def info_json() -> list[str]:
    return ["docker", "info", "--format", "{{json .}}"]


def docker_root_dir() -> list[str]:
    return ["docker", "info", "--format", "{{.DockerRootDir}}"]


def compose_version() -> list[str]:
    return ["docker", "compose", "version", "--short"]


def image_env(image: str) -> list[str]:
    """The local image's environment (its config's Env, as JSON)."""
    return ["docker", "image", "inspect", "--format", "{{json .Config.Env}}", image]


def containers_json(label: str) -> list[str]:
    """Every container (running or not) with this label, one JSON object a line."""
    return [
        "docker",
        "ps",
        "-a",
        "--no-trunc",
        "--filter",
        f"label={label}",
        "--format",
        "{{json .}}",
    ]
