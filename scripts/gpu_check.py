#!/usr/bin/env python3
"""`make gpu-check`: what pdboot sees on a real GPU host, captured in one folder.

Made for a GPU host lent for a few minutes, without Docker or network (an H100 or H200,
Python 3.12): `make gpu-wheels` built pdboot's wheels on a networked machine; this script

1. installs them into a virtualenv with `pip --no-index --find-links` (no network),
2. runs the same commands pdboot's preflight runs (imported from its check modules, so the
   capture can never drift from what pdboot asks) and the wider views a fixture wants
   (`nvidia-smi -q`, `topo -m`, `topo -p2p r`, the kernel module's parameters, ulimits, RDMA),
   writing them in the fixture format (``### $ CMD`` / output / ``### exit=N``, the format
   of tests/unit/fixtures/h200-host/),
3. runs `pdboot preflight --json` against an inventory whose one host is `local`
   (docker.* and the model checks fail there: no Docker, no network; the report says so),
4. packs the folder into gpu-check.tar.gz beside it.

The first stage needs only the standard library; it re-runs this file with the virtualenv's
Python for the rest (``--capture``). CONTRIBUTING.md says how the captures become fixtures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tarfile
import time
import venv
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEP_TIMEOUT_S = 60  # one command; `nvidia-smi -q` on 8 GPUs takes a few seconds
CAPTURE_BUDGET_S = 150.0  # all commands together: the whole check stays under 5 minutes
PREFLIGHT_TIMEOUT_S = 150  # preflight's own deadlines end well inside this

# One `local` host, two engines on GPUs 0 and 1 (a one-GPU host fails gpu.count: a real
# verdict). The requirements stay at their defaults (RTX PRO 6000 Blackwell, 12.0), so an
# H100/H200 shows what preflight says to a host that is not Blackwell.
INVENTORY = """\
name: gpucheck
model: Qwen/Qwen3-0.6B
hosts:
  gpu: {address: local}
prefill: {hosts: [gpu], gpus: [0], port: 18200, side_channel_port: 15600}
decode: {hosts: [gpu], gpus: [1], port: 18201, side_channel_port: 15601}
router: {host: gpu, port: 18000, metrics_port: 19000}
container: {hf_cache: /var/lib/pdboot-gpucheck/hf-cache}
requirements: {min_free_disk_gb: 0}
"""

# The wider views, beyond pdboot's own commands: what a fixture and its README want.
EXTRA = (
    "nvidia-smi",
    "nvidia-smi -L",
    "nvidia-smi -q",
    "nvidia-smi topo -m",
    "nvidia-smi nvlink -s",
    "nvidia-smi --query-gpu=index,name,compute_cap,mig.mode.current,ecc.mode.current,"
    "ecc.errors.uncorrected.volatile.total,persistence_mode,pcie.link.gen.current,"
    "pcie.link.width.current --format=csv",
    "cat /proc/cmdline",
    "ls /sys/kernel/iommu_groups",
    "cat /etc/os-release; uname -a; nproc",
    "ulimit -a",
    "ls -la /dev/infiniband /sys/class/infiniband",
    "ibv_devinfo -v",
    "which ibv_devinfo ucx_info nixl docker nvidia-ctk nvidia-container-cli python3",
    "nvcc --version",
    "python3 -c 'import torch; print(torch.__version__, torch.version.cuda, "
    "torch.cuda.is_available(), [torch.cuda.get_device_capability(i) "
    "for i in range(torch.cuda.device_count())])'",
    "pip list 2>/dev/null | grep -i -E 'nixl|ucx|torch|nvidia'",
)


# --------------------------------------------------------------------------- the wheels

# manylinux_2_28 covers Ubuntu 20.04+ / Debian 11+ (glibc 2.28+); most wheels are 2_17
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64", "any")


def runtime_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """pdboot's runtime dependencies, as pyproject.toml lists them (never the test extras)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: pip's vendored copy of the same parser
        from pip._vendor import tomli as tomllib  # type: ignore[no-redef]

    with pyproject.open("rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])


def download_command(wheels: Path, python_version: str, reqs: list[str]) -> list[str]:
    """pip download of binary wheels for another interpreter: pip then needs
    --only-binary=:all: and the target's version, ABI and platforms spelled out."""
    abi = "cp" + python_version.replace(".", "")
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:"]
    cmd += ["--dest", str(wheels), "--python-version", python_version, "--implementation", "cp"]
    for a in (abi, "abi3", "none"):
        cmd += ["--abi", a]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    return cmd + reqs


def build_wheels(wheels: Path, python_version: str) -> list[str]:
    """pdboot's own wheel (pure Python) and every runtime dependency's, into `wheels`."""
    if wheels.exists():
        for old in wheels.glob("*.whl"):
            old.unlink()
    wheels.mkdir(parents=True, exist_ok=True)
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels)]
    subprocess.run([*pip_wheel, str(ROOT)], check=True)
    subprocess.run(download_command(wheels, python_version, runtime_requirements()), check=True)
    return sorted(w.name for w in wheels.glob("*.whl"))


# --------------------------------------------------------------------------- stage 1


def install(wheels: Path, env_dir: Path) -> Path:
    """A virtualenv holding pdboot from `wheels`, no index: what `make gpu-wheels` built.
    Where ensurepip is missing (Debian's python3 without python3-venv) the host Python's
    own pip installs into the pip-less virtualenv (`pip --python`, pip >= 22.3)."""
    py = env_dir / "bin" / "python"
    pip = ["install", "--quiet", "--no-index", "--find-links", str(wheels), "pdboot"]
    try:
        venv.create(env_dir, with_pip=True, clear=True)
        run = [str(py), "-m", "pip", *pip]
    except (subprocess.CalledProcessError, OSError):
        venv.create(env_dir, with_pip=False, clear=True)
        run = [sys.executable, "-m", "pip", "--python", str(py), *pip]
    subprocess.run(run, check=True, timeout=300)
    return py


# --------------------------------------------------------------------------- stage 2


def pdboot_commands() -> list[str]:
    """The lines pdboot's preflight runs on a GPU host, from the check modules themselves."""
    from pdboot.preflight.checks import gpu, gpu_settings, rdma, topo

    return [
        *(gpu.KMOD, gpu.QUERY, gpu.APPS, gpu.VERSION, topo.COMMAND),
        *(gpu_settings.P2P, gpu_settings.HMM, rdma.DEVICES, rdma.IBV),
    ]


def run_block(cmd: str, timeout_s: float = STEP_TIMEOUT_S) -> tuple[str, int, float]:
    """(output, exit code, seconds) of one bash line, stdout and stderr together. A line
    that outlives its time is recorded as exit 124, as timeout(1) reports it."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(
            ["bash", "-c", cmd],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout_s,
            check=False,
        )
        out, rc = p.stdout.decode("utf-8", "replace"), p.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.output or b"").decode("utf-8", "replace") + f"\n(timed out after {timeout_s}s)"
        rc = 124
    return out, rc, time.monotonic() - t0


def block(cmd: str, output: str, rc: int) -> str:
    """One block in the fixture format that parse_sections reads back."""
    body = output if output.endswith("\n") or not output else output + "\n"
    return f"### $ {cmd}\n{body}### exit={rc}\n"


def capture(
    cmds: Iterable[str], timeout_s: float = STEP_TIMEOUT_S, budget_s: float = CAPTURE_BUDGET_S
) -> tuple[str, list[dict]]:
    """The fixture text of `cmds` and, per command, its exit code and seconds. Once the
    budget is spent the rest are recorded as not run (exit 124), so a hung driver cannot
    keep the lent machine past its minutes."""
    text, timings = [], []
    t0 = time.monotonic()
    for cmd in cmds:
        left = budget_s - (time.monotonic() - t0)
        if left <= 0:
            text.append(block(cmd, f"(not run: gpu-check's {budget_s:.0f}s budget spent)", 124))
            timings.append({"command": cmd, "exit": 124, "seconds": 0.0})
            continue
        out, rc, secs = run_block(cmd, min(timeout_s, left))
        text.append(block(cmd, out, rc))
        timings.append({"command": cmd, "exit": rc, "seconds": round(secs, 3)})
    return "".join(text), timings


def first_gpu(query_text: str) -> dict[str, str]:
    """Name, compute capability and driver of GPU 0 from pdboot's own query, for the README."""
    from pdboot.preflight.checks import ParseError, gpu

    try:
        g = gpu.parse_query(query_text)[0]
    except (ParseError, IndexError):
        return {}
    return {"name": g.name, "compute_cap": g.compute_cap, "driver": g.driver}


def readme(gpu0: dict[str, str], when: str) -> str:
    what = (
        f"{gpu0['name']} (compute capability {gpu0['compute_cap']}), driver {gpu0['driver']}"
        if gpu0
        else "no GPU answered nvidia-smi's query"
    )
    return (
        "# Real output of one GPU host (`make gpu-check`)\n\n"
        f"Captured {when} by scripts/gpu_check.py: {what}.\n\n"
        "| file | what |\n| --- | --- |\n"
        "| smi.txt | the commands pdboot's preflight runs (gpu, gpu_settings: topo -p2p r and "
        "uvm_disable_hmm, topo, rdma check modules) |\n"
        "| host.txt | the wider views: `nvidia-smi -q`, the query with a header, "
        "kernel command line, IOMMU groups, ulimits, RDMA, torch |\n"
        "| preflight.json | `pdboot preflight --json` against inventory.yaml (one `local` "
        "host; docker.* fail where Docker is absent) |\n"
        "| timings.json | each command's exit code and seconds |\n\n"
        "To keep it as a fixture: copy smi.txt and host.txt into "
        "tests/unit/fixtures/<host>/ with this README, then "
        "`PDBOOT_UPDATE_FACTS=1 python -m pytest -q tests/unit/preflight/test_checks_fixtures.py` "
        "and review the facts files it writes.\n"
    )


def preflight(py: str, out: Path) -> dict:
    inv = out / "inventory.yaml"
    inv.write_text(INVENTORY)
    t0 = time.monotonic()
    try:
        p = subprocess.run(
            [py, "-m", "pdboot", "preflight", str(inv), "--json"],
            capture_output=True,
            text=True,
            timeout=PREFLIGHT_TIMEOUT_S,
            check=False,
        )
        stdout, stderr, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired:
        stdout, stderr, rc = "", "(timed out)", 124
    (out / "preflight.json").write_text(stdout)
    (out / "preflight.stderr.txt").write_text(stderr)
    return {"exit": rc, "seconds": round(time.monotonic() - t0, 3)}


def pack(out: Path) -> Path:
    """gpu-check.tar.gz beside the folder: one file to carry back."""
    tar = out.parent / "gpu-check.tar.gz"
    with tarfile.open(tar, "w:gz") as t:
        for f in sorted(out.rglob("*")):
            if f.is_file():
                t.add(f, arcname=str(Path(out.name) / f.relative_to(out)))
    return tar


def capture_all(out: Path, timeout_s: float = STEP_TIMEOUT_S) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    smi, t1 = capture(pdboot_commands(), timeout_s, CAPTURE_BUDGET_S / 2)
    host, t2 = capture(EXTRA, timeout_s, CAPTURE_BUDGET_S / 2)
    (out / "smi.txt").write_text(smi)
    (out / "host.txt").write_text(host)
    from pdboot.preflight.checks import gpu, parse_sections

    query = parse_sections(smi).get(gpu.QUERY)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    (out / "README.md").write_text(readme(first_gpu(query.output if query else ""), when))
    report = {"commands": t1 + t2}
    (out / "timings.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheels", type=Path, default=ROOT / "build" / "gpu-wheels")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "gpu-check" / "out")
    ap.add_argument("--capture", action="store_true", help="stage 2 (inside the virtualenv)")
    ap.add_argument("--build-wheels", action="store_true", help="make gpu-wheels (network)")
    ap.add_argument("--python-version", default="3.12", help="the GPU host's Python")
    a = ap.parse_args(argv)
    a.out = a.out.resolve()
    if a.build_wheels:
        names = build_wheels(a.wheels.resolve(), a.python_version)
        print(f"gpu-wheels: {len(names)} wheels in {a.wheels} for CPython {a.python_version}")
        return 0
    if not a.capture:
        t0 = time.monotonic()
        py = install(a.wheels.resolve(), a.out.parent / "venv")
        print(f"gpu-check: pdboot installed offline in {time.monotonic() - t0:.1f}s", flush=True)
        # the installed pdboot, not this checkout's: the script runs from outside ROOT
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        cmd = [str(py), str(Path(__file__).resolve()), "--capture", "--out", str(a.out)]
        return subprocess.run(cmd, env=env, cwd="/", check=False).returncode
    report = capture_all(a.out)
    report["preflight"] = preflight(sys.executable, a.out)
    (a.out / "timings.json").write_text(json.dumps(report, indent=1) + "\n")
    tar = pack(a.out)
    print(f"gpu-check: {a.out} and {tar} (preflight exit {report['preflight']['exit']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
