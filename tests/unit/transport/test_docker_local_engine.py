"""Which Docker engine a `local` host's SDK client talks to: the same one the local
`docker` CLI (and so `docker compose`) uses. Contexts are created with the real docker
CLI in a private DOCKER_CONFIG; no engine is contacted."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pdboot.transport.docker_sdk import local_engine_kwargs

needs_docker_cli = pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI")


@pytest.fixture
def docker_config(tmp_path: Path) -> Path:
    cfg = tmp_path / "docker-config"
    cfg.mkdir()
    return cfg


def kw(cfg: Path, **env: str) -> dict[str, Any]:
    return local_engine_kwargs({"DOCKER_CONFIG": str(cfg), **env})


def cli(cfg: Path, *args: str) -> None:
    subprocess.run(
        ["docker", *args], check=True, capture_output=True, env={"DOCKER_CONFIG": str(cfg)}
    )


def test_docker_host_wins(docker_config: Path) -> None:
    got = kw(docker_config, DOCKER_HOST="unix:///run/pdt/docker.sock", DOCKER_CONTEXT="x")
    assert got["base_url"] == "unix:///run/pdt/docker.sock"


def test_no_setting_is_the_default_socket(docker_config: Path) -> None:
    assert "base_url" not in kw(docker_config)


@needs_docker_cli
def test_the_context_the_cli_uses(docker_config: Path) -> None:
    cli(docker_config, "context", "create", "pdt", "--docker", "host=unix:///srv/pdt.sock")
    assert kw(docker_config, DOCKER_CONTEXT="pdt")["base_url"] == "unix:///srv/pdt.sock"
    assert "base_url" not in kw(docker_config)  # not current yet
    cli(docker_config, "context", "use", "pdt")
    assert kw(docker_config)["base_url"] == "unix:///srv/pdt.sock"
    assert "base_url" not in kw(docker_config, DOCKER_CONTEXT="default")


def test_an_unknown_context_is_an_error(docker_config: Path) -> None:
    with pytest.raises(RuntimeError, match="docker context 'nope' not found"):
        kw(docker_config, DOCKER_CONTEXT="nope")
