"""One cause, one failure: checks that read what another check found are not judged on
their own when that check already failed (or warned).

A host without nvidia-smi fails ``gpu.nvidia_smi``; the topology matrix, GPUDirect and the
image's CUDA check run nvidia-smi too (or read what it found) and would each report the
same missing driver in their own words. ``collapse`` turns such dependents into a "skip"
that names the check they depend on, so the report shows one failure with its fix. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable

from pdboot.preflight.checks import STATUS_ORDER, CheckResult

# check -> the checks that read its command's output (or the facts it judged); a root's
# own area prefix ("gpu.") covers every check of that area.
DEPENDS_ON: dict[str, tuple[str, ...]] = {
    # nvidia-smi (the query, topo -m, the PCI bus ids) and the driver version it reports
    "gpu.nvidia_smi": (
        "gpu.",
        "rdma.gpudirect",
        "rdma.nic_affinity",
        "docker.image_cuda",
        "model.weights",
    ),
    # every docker.* reads `docker info` or asks the engine
    "docker.engine": ("docker.", "host.deployment"),
    # no verbs device at all: the ports, links and UCX devices cannot be found either
    "rdma.devices": ("rdma.",),
}


def depends(check_id: str, root: str) -> bool:
    if check_id == root:
        return False
    deps = DEPENDS_ON[root]
    return any(check_id == d or (d.endswith(".") and check_id.startswith(d)) for d in deps)


def collapse(results: Iterable[CheckResult]) -> list[CheckResult]:
    """``results`` with each dependent of a failed (or warned) root made a skip naming
    the root. Only a dependent no better than its root collapses (a failure under a
    warning stays), so a host's verdict never changes; a pass or a skip stays."""
    rs = list(results)
    roots = {r.id: r for r in rs if r.id in DEPENDS_ON and r.status in ("fail", "warn")}
    out: list[CheckResult] = []
    for r in rs:
        root = next(
            (
                x
                for x in roots.values()
                if depends(r.id, x.id)
                and r.status in ("fail", "warn")  # a skip keeps its own reason
                and STATUS_ORDER[r.status] >= STATUS_ORDER[x.status]
            ),
            None,
        )
        if root is None:
            out.append(r)
        else:
            word = "failed" if root.status == "fail" else "warned"
            out.append(CheckResult(r.id, "skip", f"not judged: {root.id} {word} (its fix first)"))
    return out


def skipped_because(results: Iterable[CheckResult], root: str) -> list[str]:
    """The ids ``collapse`` skipped because of ``root``."""
    tag = f"not judged: {root} "
    return [r.id for r in results if r.status == "skip" and r.message.startswith(tag)]
