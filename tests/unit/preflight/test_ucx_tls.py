"""rdma.ucx_tls: UCX_TLS values that cannot work on GPU engine hosts fail before any engine
starts (UCX's transport names and aliases, pdboot/preflight/checks/ucx_tls.py)."""

from __future__ import annotations

import pytest

from pdboot.inventory.schema import Requirements
from pdboot.preflight.checks import GpuNeed, HostContext, ucx_tls
from pdboot.preflight.checks.facts import HostFacts


@pytest.mark.parametrize(
    ("tls", "status", "says"),
    [
        ("rc_verbs,self", "fail", "rc_verbs without UD, DC or TCP"),
        ("rc_mlx5,cuda_copy", "fail", "active-message transport"),
        ("rc_verbs,ud_verbs,cuda_copy", "pass", ""),
        ("rc,cuda_copy", "pass", ""),  # the rc alias brings UD for the handshake
        ("rc_x,cuda_copy,cuda_ipc", "pass", ""),
        ("tcp,cuda_copy", "pass", ""),
        ("tcp", "fail", "no cuda_copy"),
        ("self,sm,cuda_copy", "fail", "no transport between hosts"),
        ("all", "pass", ""),
        ("^cuda_copy", "fail", "excludes cuda_copy"),
        ("^ud", "pass", ""),
        ("RC,CUDA_COPY", "pass", ""),  # UCX reads names case-insensitively
    ],
)
def test_values(tls: str, status: str, says: str) -> None:
    r = ucx_tls.verdict(tls, remote_peers=True)
    assert r.status == status, r.message
    assert says in r.message
    if status == "fail":
        assert "rc,cuda_copy" in (r.fix or "")


def test_shared_memory_alone_is_enough_when_both_tiers_share_the_host() -> None:
    assert ucx_tls.verdict("self,sm,cuda_copy,cuda_ipc", remote_peers=False).status == "pass"


def ctx(**kw: object) -> HostContext:
    base: dict[str, object] = dict(
        name="gpu-b",
        roles=("decode",),
        req=Requirements(),
        gpu_needs=(GpuNeed("decode", 1, "all"),),
        peers=("10.0.0.1",),
    )
    base.update(kw)
    return HostContext(**base)  # type: ignore[arg-type]


def test_judged_on_gpu_engine_hosts_with_a_value_only() -> None:
    assert ucx_tls.evaluate(ctx(ucx_tls="rc_verbs,self"), HostFacts())[0].status == "fail"
    assert ucx_tls.evaluate(ctx(), HostFacts()) == []  # unset: UCX decides
    assert ucx_tls.evaluate(ctx(ucx_tls="tcp", device="cpu"), HostFacts()) == []  # cpu.ucx_tcp
    router = ctx(roles=("router",), gpu_needs=(), ucx_tls="rc_verbs,self")
    assert ucx_tls.evaluate(router, HostFacts()) == []
