"""`pdboot export slurm`: the batch script runs every engine with `render`'s arguments and
environment (addresses become the nodes'), the router with its workers on their nodes, as
real bash reads it (`bash -n`), under Docker and pyxis, with no secret value in it."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from pdboot.cli.main import app
from pdboot.export.slurm import SlurmOptions, node_hosts, render_slurm
from pdboot.inventory.load import load_inventory, parse_inventory
from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.plan.model import Plan
from pdboot.plan.render import render_all
from tests.unit.builders import with_api_key
from tests.unit.paths import INVENTORIES, ROOT

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
_ARRAY = re.compile(r"^CMD_(\d+)=\(\n(.*?)\n\)$", re.M | re.S)


def script(inv: Inventory, plan: Plan, **kw: Any) -> str:
    kw.setdefault("download_at_start", True)  # the examples name a branch (main)
    files = render_slurm(inv, plan, SlurmOptions(**kw))
    assert list(files) == [f"pdboot-{inv.name}.sbatch"]
    return next(iter(files.values()))


def arrays(text: str) -> dict[int, list[str]]:
    """CMD_n as bash would split it (shlex: POSIX quoting; "${ADDR[i]}" stays literal)."""
    return {int(n): shlex.split(body) for n, body in _ARRAY.findall(text)}


def addr_of(plan: Plan) -> dict[str, str]:
    """Inventory address -> the script's word for its node's address."""
    hosts = node_hosts(plan)
    return {plan.hosts[h].address: f"${{ADDR[{hosts.index(h)}]}}" for h in hosts}


def compose_services(plan: Plan) -> dict[str, dict[str, Any]]:
    out = {}
    for host, text in render_all(plan).items():
        for name, svc in yaml.safe_load(text)["services"].items():
            out[f"{name}@{host}"] = svc
    return out


def split_docker(argv: list[str], image: str) -> tuple[dict[str, str], list[str]]:
    """(-e environment, arguments after the image) of a `docker run` argv."""
    env = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-e")
    return env, argv[argv.index(image) + 1 :]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
@pytest.mark.parametrize("runtime", ["docker", "pyxis"])
def test_every_example_is_a_bash_script(path: Path, runtime: str) -> None:
    inv = load_inventory(path)
    text = script(inv, build_plan(inv), runtime=runtime)
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    assert text.startswith("#!/bin/bash\n")


def test_bash_n_can_fail() -> None:
    bad = subprocess.run(["bash", "-n"], input="CMD_0=(\n  a 'b\n)\n", text=True, check=False)
    assert bad.returncode != 0


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_engines_run_renders_arguments_and_environment(path: Path) -> None:
    inv = load_inventory(path)
    plan = build_plan(inv)
    text = script(inv, plan)
    cmds = arrays(text)
    compose = compose_services(plan)
    addr = addr_of(plan)
    urlhost = {a: w.replace("ADDR", "URLHOST") for a, w in addr.items()}
    keys = re.findall(r"^start_docker (\d+) (\d+) (\S+) ", text, re.M)
    # the proxy too (its own test below); not the watch service
    assert {k for _, _, k in keys} == {s.key for s in plan.services() if s.role != "watch"}
    for n, node, key in keys:
        if key.startswith("proxy@"):
            continue
        svc = compose[key]
        env, args = split_docker(cmds[int(n)], svc["image"])
        want_env = {k: str(v) for k, v in svc.get("environment", {}).items()}
        if "VLLM_NIXL_SIDE_CHANNEL_HOST" in want_env:
            # the side channel binds (and is advertised) on the node the engine lands on
            assert env.pop("VLLM_NIXL_SIDE_CHANNEL_HOST") == f"${{ADDR[{node}]}}"
            want_env.pop("VLLM_NIXL_SIDE_CHANNEL_HOST")
        assert env == want_env, key
        # render's arguments exactly, each inventory address its node's
        want = [addr.get(str(a), str(a)) for a in svc["command"]]
        want = [re.sub(r"http://([^:/]+):", lambda m: f"http://{urlhost[m[1]]}:", a) for a in want]
        assert args == want, key
        if svc.get("env_file"):
            assert cmds[int(n)][cmds[int(n)].index("--env-file") + 1] == "$SECRETS_FILE"


def test_the_router_host_takes_the_first_node() -> None:
    inv = load_inventory(INVENTORIES / "1p1d.yaml")  # deployment order: decode host first
    plan = build_plan(inv)
    assert node_hosts(plan)[0] == plan.router.host == "gpu-a"
    text = script(inv, plan)
    assert "HOSTS=(gpu-a gpu-b)" in text
    assert re.search(r"^start_docker 2 0 router@gpu-a ", text, re.M)
    assert "#SBATCH --nodes=2" in text and "#SBATCH --exclusive" in text
    # IGW mode: the router takes its workers at runtime, as `up` posts them
    assert 'add_worker "http://${URLHOST[0]}:8200" prefill' in text
    assert 'add_worker "http://${URLHOST[1]}:8201" decode' in text


def test_data_parallel_followers_find_their_head_on_its_node() -> None:
    inv = load_inventory(ROOT / "examples" / "rtx6000-2x8-moe-dp-ep.yaml")
    plan = build_plan(inv)
    text = script(inv, plan)
    hosts = node_hosts(plan)
    assert hosts == ["gpu-a", "gpu-b"]
    # prefill's head is gpu-a (node 0), decode's gpu-b (node 1); a follower waits for its head
    assert 'wait_engine 1 prefill@gpu-b "http://${URLHOST[0]}:8200/health"' in text
    assert 'wait_engine 3 decode@gpu-a "http://${URLHOST[1]}:8201/health"' in text
    cmds = arrays(text)
    follower = cmds[1]
    assert follower[follower.index("--data-parallel-address") + 1] == "${ADDR[0]}"
    assert "--headless" in follower
    assert "WORKERS=2" in text  # a data-parallel tier is one worker: its head


def test_gpus_and_gres_from_the_plan() -> None:
    inv = load_inventory(ROOT / "examples" / "rtx6000-2x8-tp2-groups.yaml")
    text = script(inv, build_plan(inv))
    assert "#SBATCH --gres=gpu:8" in text
    assert "--gpus '\"device=4,5\"'" in text  # docker's own quoting of a list of ids
    cpu = load_inventory(ROOT / "examples" / "cpu-rehearsal-1p1d.yaml")
    text = script(cpu, build_plan(cpu))
    assert "--gres" not in text and "--gpus" not in text
    assert "#SBATCH --partition=gpu" in script(cpu, build_plan(cpu), partition="gpu")


def test_pyxis_runs_vllm_serve_with_renders_arguments() -> None:
    inv = load_inventory(ROOT / "examples" / "rtx6000-2x8-tp2-groups.yaml")
    plan = build_plan(inv)
    text = script(inv, plan, runtime="pyxis")
    cmds = arrays(text)
    compose = compose_services(plan)
    addr = addr_of(plan)
    assert "docker run" not in text
    for n, _, key in re.findall(r"^start_pyxis (\d+) (\d+) (\S+)", text, re.M):
        argv = cmds[int(n)]
        svc = compose[key]
        assert argv[0] == f"--container-image={svc['image']}"
        inner = argv[argv.index("--") + 1 :]
        assert "--no-container-entrypoint" in argv[: argv.index("--")]
        if key.startswith("proxy"):  # test_the_proxy_is_the_only_public_port
            continue
        # the environment exported by the container's own sh (no `env` binary), then --
        assert inner[:2] == ["sh", "-c"] and inner[3] == "pdboot"
        cut = inner.index("--")
        env = dict(w.split("=", 1) for w in inner[4:cut])
        if key.startswith("router"):  # no secret for the router without an API key
            assert inner[2] == "$PYXIS_ENV" and inner[cut + 1] == "vllm-router"
            urls = [a for a in inner if a.startswith("http://")]
            assert urls and all(u.startswith("http://${URLHOST[") for u in urls)
            continue
        # secrets: the file on the node, mounted and read inside the container
        assert inner[2] == "$PYXIS_SECRETS_ENV"
        assert any(a.endswith(":/run/pdboot/secrets.env:ro") for a in argv[: argv.index("--")])
        assert inner[cut + 1 : cut + 3] == ["vllm", "serve"]
        serve = cut + 1
        assert inner[serve + 2 :] == [addr.get(str(a), str(a)) for a in svc["command"]]
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(
            svc["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
        )


def test_cli_writes_an_executable_script_without_secret_values(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_SENTINEL_slurm_0123456789")
    monkeypatch.setenv("PD_API_KEY", "sk-SENTINEL-slurm")
    inv = with_api_key(INVENTORIES / "1p1d.yaml", tmp_path / "inv.yaml")
    out = tmp_path / "out"
    for extra in ([], ["--pyxis"]):
        result = CliRunner().invoke(
            app,
            [
                *("export", "slurm", str(inv), "--out", str(out), "--time", "01:00:00"),
                *("--download-at-start", *extra),
            ],
        )
        assert result.exit_code == 0, result.output
        path = out / "pdboot-demo.sbatch"
        assert path.stat().st_mode & 0o777 == 0o755
        text = path.read_text()
        assert "SENTINEL" not in text
        assert "SECRETS_FILE=${PDBOOT_SECRETS_FILE:-/var/lib/pdboot/demo/secrets.env}" in text
        assert "#SBATCH --time=01:00:00" in text


def test_cli_refuses_values_sbatch_would_misread(tmp_path: Path) -> None:
    inv = str(INVENTORIES / "1p1d.yaml")
    for bad in (["--partition", "gpu; rm -rf /"], ["--time", "1 day"], ["--secrets-file", "x"]):
        result = CliRunner().invoke(app, ["export", "slurm", inv, "--out", str(tmp_path), *bad])
        assert result.exit_code == 2, bad
    assert not list(tmp_path.iterdir())


def test_a_secrets_path_with_spaces_stays_one_word() -> None:
    inv = parse_inventory((INVENTORIES / "1p1d.yaml").read_text())
    text = script(inv, build_plan(inv), secrets_file="/etc/pd boot/s.env")
    out = subprocess.run(
        ["bash", "-c", text.split("\nset -uo pipefail")[0] + '\nprintf "%s|" "$SECRETS_FILE"'],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.stdout == "/etc/pd boot/s.env|"
