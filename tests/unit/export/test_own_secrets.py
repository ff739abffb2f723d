"""Least privilege in the exports, as `up` does it with router-secrets.env: the router and the
proxy never see HF_TOKEN. The Slurm script gives each its one line of the node's secrets
file (own_secret, run here in real bash); the Kubernetes router and proxy containers take
the key alone from the Secret, by name."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdboot.export.k8s import render_k8s
from pdboot.export.slurm import SlurmOptions, render_slurm
from pdboot.inventory.load import parse_inventory
from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from tests.unit.paths import INVENTORIES

_ARRAY = re.compile(r"^CMD_(\d+)=\(\n(.*?)\n\)$", re.M | re.S)


def keyed() -> Inventory:
    text = (INVENTORIES / "1p1d.yaml").read_text()
    return parse_inventory(
        text.replace("  hf_token: env:HF_TOKEN", "  hf_token: env:HF_TOKEN\n  api_key: env:K")
    )


def slurm_text(runtime: str) -> str:
    inv = keyed()
    opts = SlurmOptions(runtime=runtime, download_at_start=True)  # type: ignore[arg-type]
    return next(iter(render_slurm(inv, build_plan(inv), opts).values()))


def started(text: str) -> dict[str, list[str]]:
    """Service key (router@gpu-a) -> its CMD_n array as bash splits it."""
    arrays = {int(n): shlex.split(body) for n, body in _ARRAY.findall(text)}
    keys = re.findall(r"^start_(?:docker|pyxis) (\d+) \d+ (\S+) ", text, re.M)
    return {key: arrays[int(n)] for n, key in keys}


@pytest.mark.parametrize("runtime", ["docker", "pyxis"])
def test_slurm_router_and_proxy_get_their_own_file_engines_the_whole_one(runtime: str) -> None:
    steps = started(slurm_text(runtime))
    own = {"router@gpu-a": '"$OWN_SECRETS"/router.env', "proxy@gpu-a": '"$OWN_SECRETS"/proxy.env'}
    assert set(own) < set(steps)
    for key, argv in steps.items():
        words = " ".join(argv)
        if key in own:
            want = shlex.split(own[key])[0]
            assert want in words and "$SECRETS_FILE" not in words, key
        else:  # prefill and decode: HF token, key and secrets.env entries
            assert "$SECRETS_FILE" in words and "$OWN_SECRETS" not in words, key


def _own_secret(text: str) -> str:
    start = text.index("own_secret() {")
    return text[start : text.index("\n}\n", start) + 3]


def test_own_secret_copies_one_line_private_and_fails_without_it(tmp_path: Path) -> None:
    text = slurm_text("docker")
    secrets = tmp_path / "secrets.env"
    secrets.write_text(
        "HF_TOKEN=hf_SENTINEL\nHUGGING_FACE_HUB_TOKEN=hf_SENTINEL\n"
        "VLLM_API_KEY=old\nVLLM_API_KEY=sk-key\nOPENAI_API_KEY=sk-key\nOTHER=x\n"
    )
    own = tmp_path / "own"
    own.mkdir()
    prog = "\n".join(
        [
            "set -uo pipefail",
            'die() { echo "$*" >&2; exit 1; }',
            _own_secret(text),
            "own_secret OPENAI_API_KEY router.env",
            "own_secret VLLM_API_KEY proxy.env",
        ]
    )
    env = {"PATH": "/usr/bin:/bin", "SECRETS_FILE": str(secrets), "OWN_SECRETS": str(own)}
    run = subprocess.run(["bash", "-c", prog], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert (own / "router.env").read_text() == "OPENAI_API_KEY=sk-key\n"
    assert (own / "proxy.env").read_text() == "VLLM_API_KEY=sk-key\n"  # the last, as sh's `.`
    assert all((own / f).stat().st_mode & 0o777 == 0o600 for f in ("router.env", "proxy.env"))
    assert "SENTINEL" not in run.stdout + run.stderr
    secrets.write_text("HF_TOKEN=hf_SENTINEL\n")
    run = subprocess.run(["bash", "-c", prog], env=env, capture_output=True, text=True)
    assert run.returncode == 1 and "has no OPENAI_API_KEY= line" in run.stderr
    assert "SENTINEL" not in run.stdout + run.stderr


def test_slurm_own_secrets_are_made_before_their_containers_and_removed_with_the_job() -> None:
    text = slurm_text("pyxis")
    assert text.index("own_secret OPENAI_API_KEY router.env") < text.index(
        "start_pyxis 2 0 router@"
    )
    assert text.index("own_secret VLLM_API_KEY proxy.env") < text.index("start_pyxis 3 0 proxy@")
    assert 'rm -rf "$PROXY_DIR" "$OWN_SECRETS"' in text
    inv = parse_inventory((INVENTORIES / "1p1d.yaml").read_text())  # no API key
    nokey = next(
        iter(render_slurm(inv, build_plan(inv), SlurmOptions(download_at_start=True)).values())
    )
    assert "own_secret()" not in nokey and "own_secret VLLM" not in nokey


def _containers(files: dict[str, str]) -> dict[str, dict[str, Any]]:
    out = {}
    for name, body in files.items():
        if not name.endswith(".yaml"):
            continue
        for doc in yaml.safe_load_all(body):
            if doc and doc.get("kind") == "Deployment":
                pod = doc["spec"]["template"]["spec"]
                for c in pod.get("initContainers", []) + pod["containers"]:
                    out[f"{doc['metadata']['name']}/{c['name']}"] = c
    return out


def test_k8s_router_and_proxy_take_the_key_alone_by_name() -> None:
    inv = keyed()
    containers = _containers(render_k8s(inv, build_plan(inv), "llm", download_at_start=True))
    edge = {k: c for k, c in containers.items() if k.endswith(("/router", "/proxy"))}
    assert {k.rsplit("/", 1)[1] for k in edge} == {"router", "proxy"}
    for key, c in edge.items():
        assert "envFrom" not in c, key  # the whole Secret (HF_TOKEN) would come with it
        refs = [e["valueFrom"]["secretKeyRef"]["key"] for e in c.get("env", []) if "valueFrom" in e]
        assert refs in (["OPENAI_API_KEY"], ["VLLM_API_KEY"]), key
        assert "HF_TOKEN" not in yaml.safe_dump(c), key
    # the engines do take the whole Secret (the test can tell the two apart)
    assert any("envFrom" in c for k, c in containers.items() if k not in edge)
