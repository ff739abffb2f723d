"""After the pull, before the start: the engine image asked on each engine host, with that
host's GPUs, whether its kernels cover the GPUs and its NIXL loads UCX with CUDA (and
InfiniBand where KV moves over RDMA). What is asked and how it is judged:
pdboot/preflight/checks/image_caps.py; this module only runs it (one container per host, in
parallel) over pdboot's connections. ``image_checks`` runs it and the image's own argument
check (preflight/image_args.py) at once on each host: two containers that each spend most of
their time importing PyTorch, side by side rather than one after the other."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from pdboot.plan.model import Plan, Service
from pdboot.plan.nixl_compat import ImageVersion
from pdboot.preflight import image_args
from pdboot.preflight.args_cache import Cache
from pdboot.preflight.checks import CheckResult
from pdboot.preflight.checks import image_caps as caps
from pdboot.transport.connection import RemoteError
from pdboot.transport.docker_parse import EngineError
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


def image_checks(
    plan: Plan,
    hosts: Hosts,
    timeout: float = PROBE_TIMEOUT_S,
    args_timeout: float = image_args.TIMEOUT_S,
    cache: Cache | None = None,
    versions: dict[str, ImageVersion] | None = None,
) -> dict[str, list[CheckResult]]:
    """After the pull: per engine host, the image probe (docker.image_arch, docker.image_nixl)
    and the image's own parser (docker.image_args, its verdicts cached on pdboot's machine),
    the latter in a thread of its own beside the former. Results: the probe's, then the
    parser's. A host where the probe could not be run gets one failed docker.image_arch;
    where the parser could not, one failed docker.image_args. ``versions``, when given, gets
    image -> the vLLM and NIXL connector versions the parser read (one image, one build:
    any host's answer stands for all)."""
    engines = {h: [s for s in hp.services if s.is_engine] for h, hp in plan.hosts.items()}
    engines = {h: svcs for h, svcs in engines.items() if svcs}
    commands = image_args.engine_commands(plan)
    kept = cache or image_args.default_cache()
    read: dict[str, ImageVersion] = {}  # filled from the hosts' threads, one key per image

    def parsed(host: str, link: Link) -> list[CheckResult]:
        out: list[CheckResult] = []
        try:
            for image in sorted(commands.get(host, {})):
                cmds = commands[host][image]
                out += image_args.judge(
                    link.engine.run_once, image, cmds, kept, args_timeout, versions=read
                )
        except (RemoteError, EngineError) as e:
            return [image_args.not_run(e.message)]
        return out

    def one(host: str, link: Link) -> list[CheckResult]:
        with ThreadPoolExecutor(1, thread_name_prefix=f"pdboot-args-{host}") as pool:
            args = pool.submit(parsed, host, link)
            out: list[CheckResult] = []
            for image in sorted({s.image for s in engines[host]}):
                argv = caps.docker_argv(image, host_gpus(engines[host]), plan.device)
                rc, text = link.engine.run_once(argv, timeout)
                rdma = any(s.rdma for s in engines[host])
                out += caps.verdicts(caps.parse(text, rc), image, rdma=rdma, device=plan.device)
            return out + args.result()

    longest = max(timeout, args_timeout + image_args.INSPECT_TIMEOUT_S)
    values, errors = hosts.each(one, longest + 30, only=engines)
    results = dict(values)
    for host, why in errors.items():
        msg = f"could not run the image probe: {why}"
        results[host] = [CheckResult(caps.ARCH_ID, "fail", msg, caps.FIX_PROBE)]
    if versions is not None:
        versions.update(read)
    return results


def failed(results: dict[str, list[CheckResult]]) -> bool:
    return any(r.status == "fail" for rs in results.values() for r in rs)
