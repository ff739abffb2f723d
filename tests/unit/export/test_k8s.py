"""`pdboot export k8s`: the manifests of every example validate strictly against the real
Kubernetes OpenAPI schemas (kubernetes-validate, offline), every engine runs `render`'s
arguments and environment, the router's discovery flags pass the real vllm-router parser,
and no secret value reaches a file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner
from vllm_router.launch_router import parse_router_args

from pdboot.cli.main import app
from pdboot.export.common import ExportError
from pdboot.export.k8s import (
    LABEL_ROLE,
    RDMA_RESOURCE,
    engine_port,
    manifests,
    render_k8s,
    router_args,
)
from pdboot.export.llmd import disaggregated_set
from pdboot.inventory.load import load_inventory, parse_inventory
from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.plan.model import Plan
from pdboot.plan.render import render_all
from tests.unit.builders import with_api_key
from tests.unit.paths import INVENTORIES, ROOT

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
K8S_VERSION = "1.37.0"


def _docs(inv: Inventory, plan: Plan, download_at_start: bool = True) -> list[dict[str, Any]]:
    # download_at_start: the examples name a branch (main); pinned ones are test_k8s_edge's
    files = render_k8s(inv, plan, "llm", download_at_start=download_at_start)
    return [d for n, t in files.items() if n.endswith(".yaml") for d in yaml.safe_load_all(t)]


def _compose_engines(plan: Plan) -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for host, text in render_all(plan).items():
        for name, svc in yaml.safe_load(text)["services"].items():
            out[(name, host)] = svc
    return out


def _engine_deployments(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for d in docs:
        labels = d["metadata"]["labels"]
        if d["kind"] == "Deployment" and labels[LABEL_ROLE] != "router":
            name, host = labels["pdboot.io/engine"].split(".", 1)
            out[(name, host)] = d["spec"]["template"]["spec"]
    return out


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_validates_strictly(path: Path) -> None:
    inv = load_inventory(path)
    docs = _docs(inv, build_plan(inv))
    kinds = {d["kind"] for d in docs}
    want = {"ServiceAccount", "Role", "RoleBinding", "Deployment", "Service", "ConfigMap"}
    assert kinds == want
    for d in docs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)


def test_strict_validation_can_fail() -> None:
    inv = load_inventory(EXAMPLES[0])
    deployment = next(d for d in _docs(inv, build_plan(inv)) if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["shm_size"] = "16g"  # a compose key, not a Kubernetes one
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    container.pop("shm_size")
    container["ports"][0]["containerPort"] = "8200"  # a string where the schema wants an int
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_engines_run_renders_arguments_and_environment(path: Path) -> None:
    inv = load_inventory(path)
    plan = build_plan(inv)
    compose = _compose_engines(plan)
    pods = _engine_deployments(_docs(inv, plan))
    assert set(pods) == {(s.name, s.host) for s in plan.engines}
    port = str(engine_port(plan))
    for key, pod in pods.items():
        c = pod["containers"][0]
        want = [str(a) for a in compose[key]["command"]]
        got = c["args"]
        assert len(got) == len(want)
        differ = [i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b]
        # only --port's value may differ: every pod serves the router's one discovery port
        assert all(got[i - 1] == "--port" and got[i] == port for i in differ), (key, differ)
        kv = got.index("--kv-transfer-config") + 1
        assert json.loads(got[kv]) == json.loads(want[kv])
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
        rendered_env = {k: str(v) for k, v in compose[key]["environment"].items()}
        assert set(env) == set(rendered_env)
        for name, value in rendered_env.items():
            if name == "VLLM_NIXL_SIDE_CHANNEL_HOST":
                assert env[name] == {"fieldRef": {"fieldPath": "status.podIP"}}
            else:
                assert env[name] == value, name
        assert c["image"] == compose[key]["image"]
        assert pod["nodeSelector"] == {"pdboot.io/host": key[1]}


def test_the_prefill_engine_args_are_renders_exactly() -> None:
    inv = load_inventory(INVENTORIES / "1p1d.yaml")
    plan = build_plan(inv)
    pods = _engine_deployments(_docs(inv, plan))
    assert pods[("prefill", "gpu-a")]["containers"][0]["args"] == list(
        plan.prefill_engines[0].command
    )
    decode_args = pods[("decode", "gpu-b")]["containers"][0]["args"]
    assert decode_args[decode_args.index("--port") + 1] == "8200"  # render's is 8201


def test_kubelet_waits_longer_than_the_engines_shutdown_timeout() -> None:
    """Kubernetes' default grace (30 s) would SIGKILL an engine still finishing its requests
    within --shutdown-timeout (drain_seconds, 120 s); each engine pod gets compose's grace."""
    inv = load_inventory(INVENTORIES / "1p1d.yaml")
    pods = _engine_deployments(_docs(inv, build_plan(inv)))
    assert len(pods) == 2
    for pod in pods.values():
        args = pod["containers"][0]["args"]
        timeout = int(args[args.index("--shutdown-timeout") + 1])
        assert timeout == inv.timeouts.drain_seconds
        assert pod["terminationGracePeriodSeconds"] == timeout + 30


def test_gpus_rdma_and_shm_as_the_inventory_says() -> None:
    inv = load_inventory(INVENTORIES / "1p1d.yaml")  # rdma_devices declared: rdma auto -> on
    pods = _engine_deployments(_docs(inv, build_plan(inv)))
    c = pods[("prefill", "gpu-a")]["containers"][0]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": 1, RDMA_RESOURCE: 1}
    assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    shm = next(v for v in pods[("prefill", "gpu-a")]["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    off = parse_inventory(
        (INVENTORIES / "1p1d.yaml").read_text() + "kv_transfer: {rdma: off}\n"
        "container: {shm_size: 2g}\n"
    )
    c = _engine_deployments(_docs(off, build_plan(off)))[("prefill", "gpu-a")]["containers"][0]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert "securityContext" not in c
    tp2 = load_inventory(ROOT / "examples" / "rtx6000-2x8-tp2-groups.yaml")
    pods = _engine_deployments(_docs(tp2, build_plan(tp2)))
    assert {p["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] for p in pods.values()} == {
        2
    }


def test_router_discovers_each_tier_by_label_and_the_real_parser_accepts_it() -> None:
    inv = load_inventory(EXAMPLES[0])
    plan = build_plan(inv)
    args = router_args(plan, "llm")
    parsed = parse_router_args(args)
    parsed._validate_router_args()
    assert parsed.service_discovery and parsed.vllm_pd_disaggregation
    assert parsed.service_discovery_namespace == "llm"
    assert parsed.service_discovery_port == engine_port(plan)
    sel = f"pdboot.io/deployment={plan.deployment}"
    assert parsed.prefill_selector == {
        "pdboot.io/deployment": plan.deployment,
        LABEL_ROLE: "prefill",
    }
    assert parsed.decode_selector == {"pdboot.io/deployment": plan.deployment, LABEL_ROLE: "decode"}
    assert sel in args and "--prefill" not in args and "--decode" not in args
    # every pod a selector matches serves on the discovery port
    docs = _docs(inv, plan)
    for d in docs:
        labels = d["metadata"]["labels"]
        if d["kind"] == "Deployment" and labels[LABEL_ROLE] in ("prefill", "decode"):
            ports = d["spec"]["template"]["spec"]["containers"][0]["ports"]
            assert {"name": "http", "containerPort": engine_port(plan)} in ports
    role = next(d for d in docs if d["kind"] == "Role")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]


def test_data_parallel_followers_are_not_discovered() -> None:
    inv = load_inventory(ROOT / "examples" / "rtx6000-2x8-moe-dp-ep.yaml")
    pods = _engine_deployments(_docs(inv, build_plan(inv)))
    follower = pods[("prefill", "gpu-b")]
    assert "--headless" in follower["containers"][0]["args"]
    assert follower["hostNetwork"] is True
    docs = _docs(inv, build_plan(inv))
    roles = {d["metadata"]["labels"][LABEL_ROLE] for d in docs if d["kind"] == "Deployment"}
    assert roles == {"prefill", "decode", "prefill-follower", "decode-follower", "router"}


def test_two_data_parallel_heads_on_one_host_are_refused() -> None:
    text = (ROOT / "examples" / "rtx6000-2x8-moe-dp-ep.yaml").read_text()
    inv = parse_inventory(text.replace("hosts: [gpu-b, gpu-a]", "hosts: [gpu-a, gpu-b]"))
    with pytest.raises(ExportError, match="two data-parallel heads on gpu-a"):
        manifests(inv, build_plan(inv))


def test_llm_d_shape_runs_the_same_arguments() -> None:
    inv = load_inventory(ROOT / "examples" / "rtx6000-2x8-tp2-groups.yaml")
    plan = build_plan(inv)
    ds = disaggregated_set(inv, plan, "llm", download_at_start=True)
    roles = {r["name"]: r["spec"] for r in ds["spec"]["roles"]}
    assert roles["prefill"]["replicas"] == len(plan.prefill_engines) == 4
    pod = roles["decode"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    want = list(plan.decode_engines[0].command)
    assert pod["containers"][0]["args"] == [
        str(engine_port(plan)) if a == want[want.index("--port") + 1] else a for a in want
    ]
    # the pod spec inside is a valid core/v1 PodSpec (the CRD itself has no built-in schema)
    kubernetes_validate.validate(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": pod},
        K8S_VERSION,
        strict=True,
    )
    dp = load_inventory(ROOT / "examples" / "rtx6000-2x8-moe-dp-ep.yaml")
    with pytest.raises(ExportError, match="data-parallel"):
        disaggregated_set(dp, build_plan(dp), "llm", download_at_start=True)


def test_cli_writes_files_without_secret_values(tmp_path: Path, monkeypatch: Any) -> None:
    token = "hf_SENTINEL_export_k8s_0123456789"
    monkeypatch.setenv("HF_TOKEN", token)
    monkeypatch.setenv("PD_API_KEY", "sk-SENTINEL-api-key")
    inv = with_api_key(INVENTORIES / "1p1d.yaml", tmp_path / "inv.yaml")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            *("export", "k8s", str(inv), "--out", str(out), "--namespace", "llm", "--llm-d"),
            "--download-at-start",
        ],
    )
    assert result.exit_code == 0, result.output
    files = sorted(p for p in out.rglob("*") if p.is_file())
    assert {p.name for p in files} == {
        "rbac.yaml",
        "engines.yaml",
        "router.yaml",
        "disaggregatedset.yaml",
        "README.md",
    }
    for p in files:
        text = p.read_text()
        assert token not in text and "SENTINEL" not in text, p
    router = list(yaml.safe_load_all((out / "router.yaml").read_text()))[1]
    env = router["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == [
        {
            "name": "OPENAI_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": "demo-secrets", "key": "OPENAI_API_KEY"}},
        }
    ]
    engines = list(yaml.safe_load_all((out / "engines.yaml").read_text()))
    assert "initContainers" not in str(engines)  # unpinned: nothing staged
    assert all(
        e["spec"]["template"]["spec"]["containers"][0]["envFrom"]
        == [{"secretRef": {"name": "demo-secrets"}}]
        for e in engines
    )
    readme = (out / "README.md").read_text()
    assert "create secret generic demo-secrets" in readme
    # both HF names from the inventory's env:HF_TOKEN (issue 45: it named a variable unset)
    assert '--from-literal=HUGGING_FACE_HUB_TOKEN="$HF_TOKEN"' in readme
    assert '--from-literal=VLLM_API_KEY="$PD_API_KEY"' in readme
    assert "$HUGGING_FACE_HUB_TOKEN" not in readme
    assert "UNPINNED" in readme


def test_cli_refuses_a_bad_namespace(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "export",
            "k8s",
            str(INVENTORIES / "1p1d.yaml"),
            "--out",
            str(tmp_path),
            "--namespace",
            "A_b",
            "--download-at-start",
        ],
    )
    assert result.exit_code == 2
    assert not list(tmp_path.iterdir())


def test_the_rdma_resource_is_the_operators_choice(tmp_path: Path) -> None:
    inv = str(INVENTORIES / "1p1d.yaml")
    result = CliRunner().invoke(
        app,
        [
            *("export", "k8s", inv, "--out", str(tmp_path)),
            *("--rdma-resource", "nvidia.com/hostdev", "--download-at-start"),
        ],
    )
    assert result.exit_code == 0, result.output
    engines = list(yaml.safe_load_all((tmp_path / "engines.yaml").read_text()))
    limits = engines[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": 1, "nvidia.com/hostdev": 1}
    for d in engines:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    bad = CliRunner().invoke(
        app,
        [
            *("export", "k8s", inv, "--out", str(tmp_path / "x")),
            *("--rdma-resource", "no slash", "--download-at-start"),
        ],
    )
    assert bad.exit_code == 2 and not (tmp_path / "x").exists()
