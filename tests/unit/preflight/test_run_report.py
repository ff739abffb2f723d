"""run_preflight's report: a guarded area that raises is a failed check naming the exception.

The hosts are connections that answer the batch script with the healthy RTX PRO 6000 capture
(derived/rtx6000x2-r580-healthy.txt, rebuilt for each host's own command lines), so the whole
path from output to report runs; only the area made to raise differs between the two runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from pdboot.inventory.load import load_inventory
from pdboot.inventory.schema import Inventory
from pdboot.preflight import run as pf
from pdboot.preflight.checks import HostContext
from pdboot.preflight.checks import topo as topo_checks
from pdboot.preflight.checks.facts import HostFacts
from pdboot.transport.connection import CommandResult, Connection
from tests.unit.paths import INVENTORIES
from tests.unit.preflight.test_checks import batch

INVENTORY = INVENTORIES / "1p1d.yaml"
# No docker/host areas: those would look the images up in their registry.
SELECTION = pf.Selection.of(only=["gpu", "rdma", "topo"])


class CapturedHost:
    """A host that answers the batch script with captured output; nothing else runs."""

    def __init__(self, name: str, ctx: HostContext) -> None:
        self.name = name
        self.ctx = ctx

    def run(
        self, cmd: Sequence[str] | str, timeout: float | None = None, stdin: str | None = None
    ) -> CommandResult:
        return CommandResult(0, batch(self.ctx), "", 0.01)

    def put_text(self, path: str, text: str, mode: int = 0o644) -> None:
        raise AssertionError("preflight writes nothing on a host")

    def close(self) -> None:
        pass


def _run(inv: Inventory) -> pf.PreflightResult:
    ctxs = pf.contexts(inv)
    hosts: dict[str, Connection] = {n: CapturedHost(n, c) for n, c in ctxs.items()}
    return pf.run_preflight(inv, selection=SELECTION, connections=hosts)


def test_every_host_is_reported_without_internal_errors() -> None:
    result = _run(load_inventory(INVENTORY))
    assert set(result.hosts) == {"gpu-a", "gpu-b"}
    for rep in result.hosts.values():
        assert rep.reachable
        assert not [c for c in rep.checks if c.id.endswith(".evaluate")]


def test_an_area_that_raises_is_a_failed_check_naming_the_exception(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(ctx: HostContext, facts: HostFacts) -> dict[str, object]:
        raise RuntimeError(f"no NIC table for {ctx.name}")

    monkeypatch.setattr(topo_checks, "engine_nics", broken)
    result = _run(load_inventory(INVENTORY))
    for name, rep in result.hosts.items():
        crashed = [c for c in rep.checks if c.id == "topo.evaluate"]
        assert len(crashed) == 1, [c.id for c in rep.checks]
        assert crashed[0].status == "fail"
        assert f"RuntimeError: no NIC table for {name}" in crashed[0].message
        assert rep.nics == {}
        assert not rep.ok
    assert not result.ok
