"""A state pdboot could not read is an error, never "not running" (issue 32, items 7 and
10): Docker's inspect failing for any reason but "no such container" fails the listing
instead of dropping the container from it. A dropped container made `up --plan` answer
"create ... not running" right after a roll (tests/e2e/test_rolling.py's race)."""

from __future__ import annotations

from typing import Any

import docker.errors
import pytest
import requests

from pdboot.plan.model import LABEL_DEPLOYMENT
from pdboot.transport.connection import LocalConnection
from pdboot.transport.docker_host import Engine
from pdboot.transport.docker_parse import EngineError

INSPECT = {
    "Id": "c" * 64,
    "Name": "/pdboot-demo-decode",
    "State": {"Status": "running", "StartedAt": "2026-12-04T10:00:00Z", "ExitCode": 0},
    "RestartCount": 0,
    "Config": {"Image": "reg/x:1", "Labels": {LABEL_DEPLOYMENT: "demo"}},
}


class Api:
    """The docker SDK's APIClient calls Engine.containers makes, answering as Docker does
    (the exceptions are the SDK's own classes)."""

    def __init__(self, fail: Exception | None) -> None:
        self.fail = fail

    def containers(self, **_kw: Any) -> list[dict[str, str]]:
        return [{"Id": "c" * 64}]

    def inspect_container(self, _cid: str) -> dict[str, Any]:
        if self.fail is not None:
            raise self.fail
        return INSPECT


def engine(fail: Exception | None) -> Engine:
    return Engine(LocalConnection("h"), Api(fail))


def test_a_container_removed_meanwhile_is_skipped() -> None:
    resp = requests.Response()
    resp.status_code = 404
    gone = docker.errors.NotFound("No such container", response=resp)
    assert engine(gone).containers("demo") == []
    assert [o.id for o in engine(None).containers("demo")] == ["c" * 64]


@pytest.mark.parametrize(
    "fail",
    [
        requests.exceptions.ConnectionError("('Connection aborted.', OSError('Socket is closed'))"),
        requests.exceptions.ReadTimeout("Read timed out. (read timeout=120)"),
    ],
)
def test_an_inspect_that_fails_otherwise_fails_the_listing(fail: Exception) -> None:
    with pytest.raises(EngineError) as ei:
        engine(fail).containers("demo")
    assert "cannot inspect" in ei.value.message
