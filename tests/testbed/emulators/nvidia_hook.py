"""EMULATED nvidia-container-runtime-hook (NVIDIA Container Toolkit) for testbed hosts.

dockerd adds `nvidia-container-runtime-hook prestart` to the OCI spec of every container
that requests GPUs (and accepts such requests only when the hook is on its PATH). The real
hook mounts the driver's libraries and nvidia-smi into the container. This one installs the
emulated nvidia-smi into the container's root filesystem, answering for the GPUs in
NVIDIA_VISIBLE_DEVICES (renumbered from 0, as a container sees them), so
`docker run --gpus ... IMAGE nvidia-smi` works the way it does on a GPU host. It needs
/usr/bin/python3 and /bin/sh in the image (the testbed's images have both). No GPU involved.

It also records, beside the host's profile (gpu-procs/<container id>.json), that the
container's process holds memory on its GPUs: as much as a vLLM engine takes at start,
--gpu-memory-utilization (vLLM's default 0.9) of each GPU's total. The host's emulated
nvidia-smi lists that process and counts that memory as used for as long as the process
lives in that container (nvidia_smi.engine_processes), the way a real engine's CUDA
context shows on the host until it exits.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VERSION = "NVIDIA Container Runtime Hook version 1.17.8\ncommit: emulated-pdboot-testbed\n"


def visible(profile: dict[str, Any], spec: str) -> list[dict[str, Any]]:
    """The GPUs NVIDIA_VISIBLE_DEVICES grants (indices or UUIDs, comma-separated), in the
    host's order whatever the request's order (NVML enumerates a container's GPUs by PCI bus
    id), each once. dockerd writes that variable from the request: `device_ids` joined with
    commas, `count: N` as 0..N-1, `count: all` as `all`. An unknown id fails like the real
    hook (nvidia-container-cli) does, so the container does not start."""
    gpus = profile.get("gpus", [])
    if spec.strip() in ("all", ""):
        return list(gpus)
    wanted = [ident.strip() for ident in spec.split(",") if ident.strip()]
    for ident in wanted:
        if not any(ident in (str(g["index"]), g["uuid"]) for g in gpus):
            raise ValueError(f"nvidia-container-cli: device error: {ident}: unknown device")
    return [g for g in gpus if str(g["index"]) in wanted or g["uuid"] in wanted]


DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's


def memory_utilization(args: list[str]) -> float:
    """--gpu-memory-utilization from the container's command line (vLLM's spellings)."""
    for i, a in enumerate(args):
        name, eq, val = a.partition("=")
        if name in ("--gpu-memory-utilization", "--gpu_memory_utilization"):
            raw = val if eq else (args[i + 1] if i + 1 < len(args) else "")
            try:
                return float(raw)
            except ValueError:
                return DEFAULT_GPU_MEMORY_UTILIZATION
    return DEFAULT_GPU_MEMORY_UTILIZATION


def record_holder(
    profile_path: Path, state: dict[str, Any], args: list[str], gpus: list[dict[str, Any]]
) -> None:
    """The container's first process (state["pid"], the engine once runc execs it) holds
    its share of each granted GPU's memory: written for the host's nvidia-smi to read."""
    pid = state.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return
    util = memory_utilization(args)
    held = {str(g["index"]): int(g["memory_total"] * util) for g in gpus}
    procs = profile_path.parent / "gpu-procs"
    procs.mkdir(exist_ok=True)
    tmp = procs / f".{state['id']}.tmp"
    tmp.write_text(json.dumps({"id": state["id"], "pid": pid, "memory_mib": held}))
    tmp.replace(procs / f"{state['id']}.json")


def prestart(state: dict[str, Any]) -> None:
    bundle = Path(state["bundle"])
    config = json.loads((bundle / "config.json").read_text())
    root = Path(config["root"]["path"])
    if not root.is_absolute():
        root = bundle / root
    env = dict(e.split("=", 1) for e in config.get("process", {}).get("env", []) if "=" in e)
    spec = env.get("NVIDIA_VISIBLE_DEVICES", "")
    if spec in ("void", "none") or config["root"].get("readonly"):
        return
    profile_path = Path(os.environ["PDT_PROFILE"])
    profile = json.loads(profile_path.read_text())
    gpus = visible(profile, spec)
    record_holder(profile_path, state, list(config.get("process", {}).get("args", [])), gpus)
    gpus = [dict(g) for g in gpus]
    for i, g in enumerate(gpus):
        g["index"] = i
    view = dict(profile, gpus=gpus, processes=[], mig_devices=[])
    share = root / "usr" / "local" / "share" / "pdt-nvidia"
    (share / "data").mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / "nvidia_smi.py", share / "nvidia_smi.py")
    for f in (HERE / "data").iterdir():
        shutil.copy(f, share / "data" / f.name)
    (share / "profile.json").write_text(json.dumps(view))
    smi = root / "usr" / "bin" / "nvidia-smi"
    smi.parent.mkdir(parents=True, exist_ok=True)
    smi.write_text(
        "#!/bin/sh\n# EMULATED nvidia-smi, installed by the testbed's toolkit hook\n"
        "PDT_PROFILE=/usr/local/share/pdt-nvidia/profile.json "
        'exec /usr/bin/python3 -S -E /usr/local/share/pdt-nvidia/nvidia_smi.py "$@"\n'
    )
    smi.chmod(0o755)


def main(argv: list[str]) -> int:
    if argv[:1] in (["--version"], ["-version"]):
        sys.stdout.write(VERSION)
        return 0
    raw = sys.stdin.read()
    if argv[:1] == ["prestart"] and raw.strip():
        try:
            prestart(json.loads(raw))
        except (OSError, ValueError, KeyError) as e:
            # the real hook fails the container start when it cannot set the GPUs up
            sys.stderr.write(f"nvidia-container-runtime-hook (emulated): {e}\n")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
