"""What preflight judges on this machine (the secret references, the inventory's agreement)
is reported even when a host cannot be reached, with `--only secrets` too: an unset `env:`
reference must not hide behind an unreachable host (fake connections, real checks)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from pdboot.inventory.schema import Inventory
from pdboot.preflight import run as pf
from pdboot.transport.connection import CommandResult, RemoteError
from pdboot.views import preflight as report
from tests.unit.builders import inventory
from tests.unit.views.test_preflight_report import _Host

UNSET = "PDBOOT_TEST_NEVER_SET_46"


class _Unreachable:
    def __init__(self, name: str) -> None:
        self.name = name

    def run(
        self, cmd: Sequence[str] | str, timeout: float | None = None, stdin: str | None = None
    ) -> CommandResult:
        raise RemoteError(self.name, "unreachable", "connection refused", "is sshd running?")

    def put_text(self, path: str, text: str, mode: int = 0o644) -> None:
        raise AssertionError("preflight writes nothing on a host")

    def close(self) -> None:
        pass


def _inventory() -> Inventory:
    return inventory(overrides={"secrets.env": {"EXTRA": f"env:{UNSET}"}})


@pytest.mark.parametrize("only", [[], ["secrets"]])
def test_an_unset_secret_is_reported_with_every_host_unreachable(
    monkeypatch: pytest.MonkeyPatch, only: list[str]
) -> None:
    monkeypatch.delenv(UNSET, raising=False)
    inv = _inventory()
    conns = {n: _Unreachable(n) for n in pf.contexts(inv)}
    result = pf.run_preflight(inv, selection=pf.Selection.of(only), connections=conns)
    assert not any(h.reachable for h in result.hosts.values())
    found = [(n, c) for n, h in result.hosts.items() for c in h.checks if c.id == "secrets.env"]
    (host, check) = found[0]
    assert len(found) == 1 and host == "p1"  # the deployment's first host, once
    assert check.status == "fail" and UNSET in check.message and f"export {UNSET}=" in check.fix
    if only:
        assert {c.area for h in result.hosts.values() for c in h.checks} == {"ssh", "secrets"}
    # the JSON and the table say it too
    assert UNSET in report.to_json(result)


def test_with_the_secret_set_it_passes_beside_the_unreachable_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(UNSET, "value-never-printed")
    inv = _inventory()
    ctxs = pf.contexts(inv)
    conns = {"p1": _Unreachable("p1"), "d1": _Host(ctxs["d1"], 0.0), "r": _Host(ctxs["r"], 0.0)}
    result = pf.run_preflight(inv, selection=pf.Selection.of(["secrets"]), connections=conns)
    (check,) = [c for h in result.hosts.values() for c in h.checks if c.id == "secrets.env"]
    assert check.status == "pass"
    assert "value-never-printed" not in report.to_json(result)
    assert [h.reachable for h in result.hosts.values()] == [False, True, True]
