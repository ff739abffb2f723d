"""Pure parsing of what the Docker engine returns, on output captured from the testbed's
dockerd 20.10 through pdboot's own SSH channel (tests/unit/fixtures/deploy/): container
inspect and list JSON, a real pull event stream, and real pull errors."""

from __future__ import annotations

import json

from pdboot.transport.docker_parse import (
    PullProgress,
    observed_from_inspect,
    observed_from_list,
    pull_error_cause,
    split_image,
)
from tests.unit.paths import FIXTURES

FIX = FIXTURES / "deploy"


def _jsonl(name: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in (FIX / name).read_text().splitlines() if line.strip()]


def test_split_image_with_registry_port() -> None:
    assert split_image("10.77.0.1:5000/vllm/vllm-openai:v0.33.0") == (
        "10.77.0.1:5000/vllm/vllm-openai",
        "v0.33.0",
    )
    assert split_image("10.77.0.1:5000/vllm/vllm-router") == (
        "10.77.0.1:5000/vllm/vllm-router",
        "latest",
    )


def test_real_pull_errors() -> None:
    errors = json.loads((FIX / "pull-errors.json").read_text())
    no_tag = errors["no-such-tag"]["APIError.explanation"]
    down = errors["registry-down"]["APIError.explanation"]
    assert pull_error_cause(no_tag).startswith("no such image or tag")
    assert pull_error_cause(down).startswith("registry unreachable")
    disk = [e for e in _jsonl("pull-events-disk-full.jsonl") if "error" in e]
    p = PullProgress("img")
    for e in _jsonl("pull-events-disk-full.jsonl"):
        p.feed(e)
    assert p.error is not None and disk
    assert pull_error_cause(p.error).startswith("disk full")


def test_real_pull_stream_progress() -> None:
    p = PullProgress("img")
    seen = []
    for e in _jsonl("pull-events-engine.jsonl"):
        p.feed(e)
        seen.append((p.done, p.total))
    assert p.error is None
    assert p.total > 0 and p.done == p.total  # every layer completed
    assert any(0 < d < t for d, t in seen)  # partial progress was visible on the way
    assert p.digest and p.digest.startswith("sha256:")
    assert p.status.startswith("Downloaded newer image")


def test_pull_progress_synthetic_layers() -> None:
    p = PullProgress("img")
    p.feed({"status": "Downloading", "progressDetail": {"current": 100, "total": 1000}, "id": "a"})
    p.feed({"status": "Downloading", "progressDetail": {"current": 50, "total": 500}, "id": "b"})
    assert (p.done, p.total) == (150, 1500)
    p.feed({"status": "Download complete", "progressDetail": {}, "id": "a"})
    assert p.done == 1050


def test_observed_from_captured_inspect() -> None:
    data = json.loads((FIX / "inspect-decode-running.json").read_text())
    o = observed_from_inspect("d1", data)
    assert o.role == "decode" and o.deployment == "dev1" and o.state == "running"
    assert o.config_hash and len(o.config_hash) == 16
    assert o.restart_count == 0 and o.exit_code == 0
    assert o.started_at == "2026-11-30T01:25:06.455888827Z"
    assert o.created == "2026-11-30T01:25:06.345023158Z"  # converge tells a join from a restart
    assert o.name == "pdboot-dev1-decode"


def test_observed_from_captured_list() -> None:
    items = json.loads((FIX / "containers-list.json").read_text())
    roles = sorted(str(observed_from_list("h", i).role) for i in items)
    assert roles == ["decode", "prefill", "router"]


def test_observed_from_inspect_is_lenient() -> None:
    o = observed_from_inspect("gpu-b", {"Id": "abc", "State": {"Status": "exited", "ExitCode": 3}})
    assert o.state == "exited" and o.exit_code == 3 and o.labels == {} and o.role is None


# ---- issue 32, item 6: Docker that does not answer, with cause and fix

SDK_ABORTED = (
    "Error while fetching server API version: ('Connection aborted.', "
    "FileNotFoundError(2, 'No such file or directory'))"
)


def test_docker_unreachable_names_cause_and_fix() -> None:
    from pdboot.transport.docker_parse import docker_unreachable

    cli = (
        "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
        "Is the docker daemon running?"
    )
    msg = docker_unreachable(SDK_ABORTED, cli)
    assert "the Docker daemon is not running" in msg and cli in msg
    assert "(fix: start dockerd (systemctl start docker)" in msg
    denied = docker_unreachable(
        "Error while fetching server API version: ('Connection aborted.', "
        "PermissionError(13, 'Permission denied'))",
        "permission denied while trying to connect to the Docker daemon socket at "
        "unix:///var/run/docker.sock",
    )
    assert "may not use the Docker socket" in denied and "usermod -aG docker" in denied
    assert "docker CLI is not installed" in docker_unreachable(
        "x", "bash: docker: command not found"
    )
    other = docker_unreachable("Error while fetching server API version: HTTP 500", "")
    assert "did not answer" in other and "fix: " in other and "HTTP 500" in other
