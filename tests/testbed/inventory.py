"""Test inventories pointing at a testbed (the YAML an operator would write, for our hosts).

Defaults: hosts named decode/prefill/ingress take those roles (else the first host decodes,
the second prefills, the last routes); images from the testbed's registry; ssh as root with
the testbed's key and known_hosts (strict checking stays on); ulimits lowered to what this
machine allows (memlock 8 MiB, nofile 20000: see the recipe's CAP_SYS_RESOURCE note);
requirements.min_free_disk_gb lowered (the machine's disk is shared by all test hosts).
`overrides` is deep-merged last, so a test can set anything (or break anything).

engine="standin" (default: the EMULATED engine with its fault knobs, for the older tests) or
engine="vllm": the REAL vLLM CPU engine (`device: cpu`, tb.cpu_image, the tiny model at its
local path tb.cpu_model, float32, a 1 GiB KV cache per engine, one core per engine: prefill
engines from core 0 up, decode engines from the last core down, so that the two tiers of
one testbed, which share this machine's cores, do not share one), with timeouts for engines
that take 50-200 s to start on 2 cores. The testbed must be started with real_vllm=True.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tests.testbed.profiles import deep_merge

if TYPE_CHECKING:
    from tests.testbed.harness import Testbed

TEST_MODEL = "Qwen/Qwen3-0.6B"
REAL_SERVED_NAME = "tiny-llama"
REAL_TIER_ARGS = ("--max-model-len", "8192", "--enforce-eager")  # real_engine_settings: why
# Engines of one testbed share this machine's cores; 2 here. A tier's engines per host.
REAL_CORES = os.cpu_count() or 2


def real_engine_settings(tb: Testbed, engines_per_host: int = 1) -> dict[str, Any]:
    """The inventory keys that make the engines real vLLM on CPU (see the module doc)."""
    n = engines_per_host
    prefill = [[i % REAL_CORES] for i in range(n)]
    decode = [[(REAL_CORES - 1 - i) % REAL_CORES] for i in range(n)]
    # float32 is pdboot's `device: cpu` default (README). --enforce-eager: the test image has
    # no C++ compiler, and torch.compile on CPU (inductor) needs one ("InvalidCxxCompiler: No
    # working C++ compiler found"); eager also starts faster on 2 cores. 8192 tokens: pdboot's
    # KV speed prompt (900 words) is ~5000 tokens with the tiny model's small vocabulary.
    tier: dict[str, Any] = {"extra_args": list(REAL_TIER_ARGS)}
    if n > 1:
        tier["engines_per_host"] = n
    return {
        "model": str(tb.cpu_model),
        "served_model_name": REAL_SERVED_NAME,
        "image": tb.cpu_image,
        "device": "cpu",
        "cpu": {"kv_cache_gib": 1},
        "prefill": {**tier, "cpus": prefill if n > 1 else prefill[0]},
        "decode": {**tier, "cpus": decode if n > 1 else decode[0]},
        "kv_transfer": {"rdma": "off"},  # KV over UCX/TCP: no RDMA NIC in a cpu-only host
        "timeouts": {
            "ready_seconds": 420,
            "router_ready_seconds": 120,
            "pull_seconds": 600,
            "poll_interval_seconds": 0.5,
        },
    }


def ssh_settings(tb: Testbed) -> dict[str, Any]:
    """How pdboot reaches the testbed's hosts: root, the testbed's key and known_hosts, no
    ~/.ssh/config of this machine's user, a short connect timeout."""
    return {
        "user": "root",
        "identity_file": str(tb.identity_file),
        "known_hosts": str(tb.known_hosts),
        "use_ssh_config": False,
        "connect_timeout": 5,
    }


def inventory_dict(
    tb: Testbed,
    *,
    name: str = "pdtest",
    model: str = TEST_MODEL,
    decode: list[str] | None = None,
    prefill: list[str] | None = None,
    router: str | None = None,
    engine: str = "standin",
    engines_per_host: int = 1,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    names = list(tb.hosts)
    decode = decode or (["decode"] if "decode" in tb.hosts else names[:1])
    prefill = prefill or (["prefill"] if "prefill" in tb.hosts else names[1:2] or names[:1])
    router = router or ("ingress" if "ingress" in tb.hosts else names[-1])
    inv: dict[str, Any] = {
        "name": name,
        "model": model,
        "image": tb.image,
        "router_image": tb.router_image,
        "ssh": ssh_settings(tb),
        "hosts": {h.name: {"address": h.address} for h in tb.hosts.values()},
        "prefill": {"hosts": prefill},
        "decode": {"hosts": decode},
        "router": {"host": router, "proxy_image": tb.proxy_image},
        "container": {"ulimits": {"memlock": 8388608, "nofile": 20000}, "shm_size": "1g"},
        "requirements": {"min_free_disk_gb": 1},
        # TEST_MODEL is a name only: no hub serves it, the stand-in loads nothing (tests of
        # staging name tb.hub's repository and turn it on, tests/e2e/test_weights_staged_once_per_host.py)
        "weights": {"stage": False},
        "timeouts": {
            "ready_seconds": 120,
            "router_ready_seconds": 60,
            "pull_seconds": 300,
            "poll_interval_seconds": 0.2,
        },
    }
    if engine == "vllm":
        inv = deep_merge(inv, real_engine_settings(tb, engines_per_host))
    elif engine != "standin":
        raise ValueError(f"engine must be 'standin' or 'vllm', not {engine!r}")
    return deep_merge(inv, overrides or {})


def write_inventory(tb: Testbed, path: Path, **kw: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(inventory_dict(tb, **kw), sort_keys=False))
    return path


def rtx_pair_dict(
    tb: Testbed,
    name: str,
    prefill: dict[str, Any],
    decode: dict[str, Any],
    router: str = "gpu-a",
) -> dict[str, Any]:
    """The inventory of an RTX_PAIR testbed (tests/conftest.py): the tiers as given (hosts, gpus, engines per
    host), stand-ins that load in 0.3 s, round-robin routing, kv_transfer.rdma auto."""
    env = {"STANDIN_LOAD_SECONDS": "0.3"}
    inv = inventory_dict(
        tb, name=name, prefill=prefill["hosts"], decode=decode["hosts"], router=router
    )
    inv["prefill"] = {**prefill, "env": env}
    inv["decode"] = {**decode, "env": env}
    inv["router"] = {
        "host": router,
        "prefill_policy": "round_robin",
        "decode_policy": "round_robin",
        "proxy_image": tb.proxy_image,
    }
    inv["kv_transfer"] = {"rdma": "auto"}
    return inv


def watched_inventory(
    tb: Testbed, path: Path, name: str, decode: list[str], interval: float, **watch: Any
) -> Path:
    """The prefill host's engine, ``decode``'s, the router on ingress, and the watch service
    (this checkout's pdboot image) polling every ``interval`` s with a 3 s deadline, then
    ``watch``'s keys (evict_after, readmit_after)."""
    standin_env = {"STANDIN_LOAD_SECONDS": "0.5"}
    watching = {"interval_seconds": interval, "deadline_seconds": 3, **watch}
    return write_inventory(
        tb,
        path,
        name=name,
        decode=decode,
        prefill=["prefill"],
        router="ingress",
        overrides={
            "prefill": {"env": standin_env},
            "decode": {"env": standin_env},
            "watch": {**watching, "image": tb.pdboot_image()},
        },
    )
