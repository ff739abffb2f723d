"""Issue 45 on both targets: the weights staged at the pinned commit before any engine (the
staging program of `pdboot stage`, its file list from the hub on the node), a branch refused
unless vLLM's own download is asked for, pdboot's proxy (plan/proxy.py's nginx.conf) in front
of the router on its loopback, and the site's #SBATCH options."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from pdboot.cli.main import app
from pdboot.export.common import ExportError
from pdboot.export.k8s import render_k8s
from pdboot.export.k8s_readme import shell_value
from pdboot.export.slurm import SlurmOptions, render_slurm
from pdboot.export.weights import LISTING, STAGE_PROGRAM, export_weights
from pdboot.inventory.load import parse_inventory
from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.plan.model import PROXY_CONF_FILE
from pdboot.plan.proxy import MAX_API_KEY_CHARS, proxy_auth_text, proxy_files
from pdboot.plan.weights.programs import STAGE_SCRIPT
from tests.testbed import hub
from tests.unit.paths import INVENTORIES

COMMIT = "0123456789abcdef0123456789abcdef01234567"
K8S_VERSION = "1.37.0"


def inventory(revision: str = COMMIT, key: bool = True, extra: str = "") -> Inventory:
    text = (INVENTORIES / "1p1d.yaml").read_text()
    if key:
        text = text.replace(
            "  hf_token: env:HF_TOKEN", "  hf_token: env:HF_TOKEN\n  api_key: env:K"
        )
    return parse_inventory(text + f"model_revision: {revision}\n" + extra)


def slurm(inv: Inventory, **kw: Any) -> str:
    w = export_weights(inv, kw.get("download_at_start", False))
    files = render_slurm(w.inventory, build_plan(w.inventory), SlurmOptions(**kw))
    return next(iter(files.values()))


def heredoc(text: str, end: str) -> str:
    m = re.search(rf"<<'{end}'[^\n]*\n(.*?)\n{end}\n", text, re.S)
    assert m, end
    return m[1]


@pytest.mark.parametrize("runtime", ["docker", "pyxis"])
def test_slurm_stages_the_commit_on_each_engine_node_before_any_engine(runtime: str) -> None:
    text = slurm(inventory(), runtime=runtime)
    assert heredoc(text, "PDBOOT_STAGE_PY") == STAGE_PROGRAM.strip("\n")
    stages = re.findall(rf"^stage_{runtime} (\d+) (\S+) ", text, re.M)
    assert stages == [("0", "stage@gpu-a"), ("1", "stage@gpu-b")]  # once per node
    first_engine = text.index(f"start_{runtime} 0 ")
    assert text.index("wait_staged\n") < first_engine
    for n, _ in stages:
        body = re.search(rf"^STAGE_{n}=\(\n(.*?)\n\)$", text, re.M | re.S)
        assert body and f'-c "$STAGE_PY" meta-llama/Llama-3.1-8B-Instruct {COMMIT}' in body[1]
        assert "/var/lib/pdboot/hf-cache:/root/.cache/huggingface" in body[1]
    # the engines load that commit from the cache, offline
    assert text.count(f"--revision {COMMIT}") == 2
    assert text.count("HF_HUB_OFFLINE=1") == 2
    assert f"# weights: meta-llama/Llama-3.1-8B-Instruct@{COMMIT}, staged" in text


def test_a_branch_is_refused_with_the_fix_unless_asked_for(tmp_path: Path) -> None:
    inv = inventory("main")
    with pytest.raises(ExportError, match="--download-at-start") as e:
        export_weights(inv)
    assert "up --plan" in str(e.value)
    text = slurm(inv, download_at_start=True)
    assert "# weights: UNPINNED: meta-llama/Llama-3.1-8B-Instruct@main" in text
    assert "stage_docker" not in text and "HF_HUB_OFFLINE" not in text
    path = tmp_path / "inv.yaml"
    path.write_text((INVENTORIES / "1p1d.yaml").read_text())
    for target in ("slurm", "k8s"):
        res = CliRunner().invoke(app, ["export", target, str(path), "--out", str(tmp_path / "o")])
        assert res.exit_code == 2 and "pin a commit" in res.output.lower(), res.output
    assert not (tmp_path / "o").exists()
    # a local path: nothing to stage, nothing unpinned
    local = parse_inventory(
        (INVENTORIES / "1p1d.yaml")
        .read_text()
        .replace("model: meta-llama/Llama-3.1-8B-Instruct", "model: /srv/models/m")
    )
    assert "stage_" not in slurm(local) and "UNPINNED" not in slurm(local)


def test_the_listing_gives_the_staging_program_the_hubs_hashes(tmp_path: Path) -> None:
    """LISTING against the testbed's HF-compatible hub (tests/testbed/hub.py) on loopback."""
    from http.server import ThreadingHTTPServer

    repos = hub.default_repos(shard_bytes=4096)
    handler = type("Handler", (hub.Handler,), {"hub": hub.Hub(repos, tmp_path / "log")})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        commit = repos[hub.PUBLIC_REPO].resolve("main")
        assert commit is not None
        program = LISTING + "\nimport os\nprint(os.environ['PDBOOT_STAGE_FILES'])\n"
        env = {"HF_ENDPOINT": f"http://127.0.0.1:{server.server_port}", "PATH": "/usr/bin:/bin"}
        out = subprocess.run(
            [sys.executable, "-c", program, hub.PUBLIC_REPO, commit],
            capture_output=True,
            text=True,
            env=env,
            check=True,
            timeout=60,
        )
        files = {f: (n, h) for f, n, h in json.loads(out.stdout)}
        want = hub.model_files(1, 4096)
        assert set(files) == set(want)
        for name, data in want.items():
            n, h = files[name]
            assert n == len(data)
            assert h in (f"git:{hub.git_oid(data)}", f"sha256:{hashlib.sha256(data).hexdigest()}")
        bad = subprocess.run(
            [sys.executable, "-c", program, hub.PUBLIC_REPO, "f" * 40],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=60,
        )
        assert bad.returncode == 1 and '"kind": "error"' in bad.stdout
    finally:
        server.shutdown()
    assert STAGE_PROGRAM.endswith(STAGE_SCRIPT)


def test_slurm_puts_the_proxy_in_front_of_the_router_on_its_loopback() -> None:
    inv = inventory()
    text = slurm(inv)
    plan = build_plan(export_weights(inv).inventory)
    assert heredoc(text, "PDBOOT_NGINX_CONF") == proxy_files(inv, None)[PROXY_CONF_FILE].rstrip(
        "\n"
    )
    router = re.search(r"^CMD_2=\(\n(.*?)\n\)$", text, re.M | re.S)
    assert router and "--host 127.0.0.1\n  --port 8081" in router[1]
    assert "0.0.0.0\n  --port 8000" not in text
    assert "ROUTER_PORT=8081" in text and "ENDPOINT_PORT=8000" in text
    # the worker API on the loopback, the proxy last, and the key from the node's file
    assert text.index("wait_workers 2") < text.index("start_docker 3 0 proxy@gpu-a")
    assert '"$ROUTER_URL/workers"' in text
    proxy_sh = heredoc(text, "PDBOOT_PROXY_SH")
    assert "/run/pdboot/secrets.env" in proxy_sh and "auth.conf" in proxy_sh
    # its own file, the VLLM_API_KEY line alone (test_slurm.py's own-secrets test)
    assert '-v "$OWN_SECRETS"/proxy.env:/run/pdboot/secrets.env:ro' in text
    assert text.index("own_secret VLLM_API_KEY proxy.env") < text.index("proxy@gpu-a")
    assert plan.proxy is not None and plan.proxy.image in text
    nokey = slurm(inventory(key=False))
    assert "secrets.env" not in heredoc(nokey, "PDBOOT_PROXY_SH")


def test_the_proxy_program_writes_the_key_and_refuses_a_bad_one(tmp_path: Path) -> None:
    """The proxy's start program in a real sh, its paths moved under tmp_path."""
    sh = heredoc(slurm(inventory()), "PDBOOT_PROXY_SH")
    sh = sh.replace("/run/pdboot", str(tmp_path)).replace("/etc/pdboot-proxy", str(tmp_path))
    sh = sh.replace("exec nginx -c", "echo nginx")
    cases = [("sk-good.KEY_123", True), ("bad key", False), ('x"y', False), ("", False)]
    cases += [("k" * MAX_API_KEY_CHARS, True), ("k" * (MAX_API_KEY_CHARS + 1), False)]
    for key, ok in cases:
        (tmp_path / "secrets.env").write_text(f"HF_TOKEN=t\nVLLM_API_KEY={key}\n")
        res = subprocess.run(["sh", "-c", sh], capture_output=True, text=True, check=False)
        assert (res.returncode == 0) == ok, (key, res.stderr)
        if ok:
            auth = tmp_path / "auth.conf"
            # the include `up` ships, byte for byte (plan/proxy.py)
            assert auth.read_text() == proxy_auth_text(key)
            assert auth.stat().st_mode & 0o777 == 0o600
            auth.unlink()


@pytest.mark.parametrize("runtime", ["docker", "pyxis"])
def test_site_options_become_sbatch_lines(runtime: str, tmp_path: Path) -> None:
    text = slurm(inventory(), runtime=runtime, account="proj1", reservation="r1", qos="high")
    for line in ("--account=proj1", "--reservation=r1", "--qos=high"):
        assert f"#SBATCH {line}\n" in text
    path = tmp_path / "inv.yaml"
    path.write_text((INVENTORIES / "1p1d.yaml").read_text() + f"model_revision: {COMMIT}\n")
    bad = CliRunner().invoke(
        app, ["export", "slurm", str(path), "--out", str(tmp_path / "o"), "--account", "a b"]
    )
    assert bad.exit_code == 2 and not (tmp_path / "o").exists()


def test_pyxis_steps_skip_the_entrypoint_and_mount_the_hf_cache() -> None:
    text = slurm(inventory(), runtime="pyxis")
    arrays = re.findall(r"^(?:CMD|STAGE)_\d+=\(\n(.*?)\n\)$", text, re.M | re.S)
    assert len(arrays) == 6  # 2 stage, 2 engines, router, proxy
    for body in arrays:
        assert "--no-container-entrypoint" in body
    for body in arrays[:4]:
        assert "/var/lib/pdboot/hf-cache:/root/.cache/huggingface" in body


def k8s_docs(inv: Inventory) -> list[dict[str, Any]]:
    w = export_weights(inv)
    files = render_k8s(w.inventory, build_plan(w.inventory), "llm")
    return [d for n, t in files.items() if n.endswith(".yaml") for d in yaml.safe_load_all(t)]


def test_k8s_engines_stage_first_and_the_service_reaches_only_the_proxy() -> None:
    docs = k8s_docs(inventory())
    for d in docs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    stage = next(d for d in docs if d["kind"] == "ConfigMap" and "stage.py" in d["data"])
    assert stage["data"]["stage.py"] == STAGE_PROGRAM
    engines = [
        d["spec"]["template"]["spec"]
        for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["labels"]["pdboot.io/role"] != "router"
    ]
    for pod in engines:
        (init,) = pod["initContainers"]
        assert init["command"][-2:] == ["meta-llama/Llama-3.1-8B-Instruct", COMMIT]
        mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
        engine_mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert mounts["hf-cache"] == engine_mounts["hf-cache"]
    router = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "demo-router"
    )
    router_c, proxy_c = router["spec"]["template"]["spec"]["containers"]
    assert router_c["args"][router_c["args"].index("--host") + 1] == "127.0.0.1"
    assert all(p["name"] != "http" for p in router_c["ports"])
    assert proxy_c["ports"] == [{"name": "proxy", "containerPort": 8000}]
    assert proxy_c["env"][0]["valueFrom"]["secretKeyRef"]["key"] == "VLLM_API_KEY"
    service = next(d for d in docs if d["kind"] == "Service")
    assert service["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "proxy"}]
    conf = next(d for d in docs if d["kind"] == "ConfigMap" and "nginx.conf" in d["data"])
    assert conf["data"]["nginx.conf"] == proxy_files(inventory(), None)[PROXY_CONF_FILE]


def test_the_k8s_readme_reads_each_secret_where_the_inventory_says() -> None:
    inv = inventory(extra="")
    files = render_k8s(inv, build_plan(inv), "llm")
    readme = files["README.md"]
    assert '--from-literal=HUGGING_FACE_HUB_TOKEN="$HF_TOKEN"' in readme
    assert '--from-literal=OPENAI_API_KEY="$K"' in readme
    assert shell_value("file:/run/my secrets/key") == "\"$(cat '/run/my secrets/key')\""
    # what the README's line gives, as the operator's shell reads it
    line = next(ln for ln in readme.splitlines() if "HUGGING_FACE_HUB_TOKEN" in ln)
    word = line.strip().removesuffix(" \\").split("=", 2)[2]
    out = subprocess.run(
        ["bash", "-c", f"printf %s {word}"],
        capture_output=True,
        text=True,
        check=True,
        env={"HF_TOKEN": "hf_from_the_shell", "PATH": "/usr/bin:/bin"},
    )
    assert out.stdout == "hf_from_the_shell"
