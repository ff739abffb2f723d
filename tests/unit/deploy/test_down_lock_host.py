"""`down` and the lock host's SSH errors (issue 32, item 2): a changed host key stops it,
naming the host, as it stops `up`; only a host that does not answer lets it go on unlocked,
and it says so."""

from __future__ import annotations

from typing import Any

import pytest

from pdboot import events as ev
from pdboot.deploy.down import DownOptions, down
from pdboot.transport.connection import RemoteError
from tests.unit.orchestrator_fakes import Recorder, World, inventory


def _refusing(kind: Any, message: str, fix: str = "") -> Any:
    def factory(*_a: Any) -> Any:
        raise RemoteError("r", kind, message, fix)

    return factory


def _down(world: World, factory: Any) -> tuple[int, Recorder]:
    rec = Recorder()
    code = down(world.inv, DownOptions(), rec, hosts_factory=world.hosts, lock_factory=factory)
    return code, rec


@pytest.mark.parametrize(
    "kind", ["host_key_changed", "host_key", "auth", "error"]
)  # fmt: skip
def test_down_stops_on_a_lock_host_ssh_error_that_is_not_silence(kind: Any) -> None:
    world = World(inventory())
    code, rec = _down(world, _refusing(kind, "the host key changed", "check the host's key"))
    assert code == 1
    assert not any(op in ("stop_remove", "compose_up") for op, _h, _w in world.calls)
    err = [n for n in rec.of(ev.Note) if n.level == "error"]
    assert err and "deployment lock on r" in err[0].message
    assert "the host key changed" in err[0].message and "check the host's key" in err[0].message


@pytest.mark.parametrize("kind", ["unreachable", "timeout"])
def test_down_goes_on_without_the_lock_only_when_its_host_does_not_answer(kind: Any) -> None:
    world = World(inventory())
    code, rec = _down(world, _refusing(kind, "connection refused"))
    assert code == 0
    warn = [n for n in rec.of(ev.Note) if n.level == "warn"]
    assert warn and "host r is unreachable" in warn[0].message
    assert "without the lock" in warn[0].message
