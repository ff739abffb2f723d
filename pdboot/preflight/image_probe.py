"""After the pull, before the start: the engine image asked on each engine host, with that
host's GPUs, whether its kernels cover the GPUs and its NIXL loads UCX with CUDA (and
InfiniBand where KV moves over RDMA). What is asked and how it is judged:
pdboot/preflight/checks/image_caps.py; this module only runs it (one container per host, in
parallel) over pdboot's connections."""

from __future__ import annotations

from typing import Literal

from pdboot.plan.model import Plan, Service
from pdboot.preflight.checks import CheckResult
from pdboot.preflight.checks import image_caps as caps
from pdboot.transport.hosts import Hosts, Link

PROBE_TIMEOUT_S = 120.0  # a cold image start on a loaded host; the probe itself is seconds


def host_gpus(services: list[Service]) -> Literal["all"] | tuple[int, ...]:
    """The GPUs the host's engines use: "all" when any engine takes all."""
    picked: set[int] = set()
    for s in services:
        if s.gpus == "all" or s.gpus is None:
            return "all"
        picked.update(s.gpus)
    return tuple(sorted(picked))


def image_caps_check(
    plan: Plan, hosts: Hosts, timeout: float = PROBE_TIMEOUT_S
) -> dict[str, list[CheckResult]]:
    """host -> results (docker.image_arch, docker.image_nixl) for every engine host; a host
    where the probe could not be run gets one failed docker.image_arch with the cause."""
    engines = {h: [s for s in hp.services if s.role != "router"] for h, hp in plan.hosts.items()}
    engines = {h: svcs for h, svcs in engines.items() if svcs}

    def one(host: str, link: Link) -> list[CheckResult]:
        out: list[CheckResult] = []
        for image in sorted({s.image for s in engines[host]}):
            argv = caps.docker_argv(image, host_gpus(engines[host]), plan.device)
            rc, text = link.engine.run_once(argv, timeout)
            rdma = any(s.rdma for s in engines[host])
            out += caps.verdicts(caps.parse(text, rc), image, rdma=rdma, device=plan.device)
        return out

    values, errors = hosts.each(one, timeout + 30, only=engines)
    results = dict(values)
    for host, why in errors.items():
        msg = f"could not run the image probe: {why}"
        results[host] = [CheckResult(caps.ARCH_ID, "fail", msg, caps.FIX_PROBE)]
    return results


def failed(results: dict[str, list[CheckResult]]) -> bool:
    return any(r.status == "fail" for rs in results.values() for r in rs)
