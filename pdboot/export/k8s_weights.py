"""The weights on Kubernetes (pure): an init container in every engine pod runs `pdboot
stage`'s program (export/weights.py) with the commit in its command, into the HF cache the
engine mounts (the node's hostPath), before the engine starts. Pods of one node share that
cache: the first stages, the next find every file there and only check the hashes. The
program itself is a ConfigMap, so the manifests stay readable."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pdboot.export.common import dns_label
from pdboot.export.weights import STAGE_PROGRAM, WeightsStep
from pdboot.inventory.schema import Inventory
from pdboot.plan.model import HF_CACHE_IN_CONTAINER, Plan

PROGRAM_KEY = "stage.py"
PROGRAM_DIR = "/etc/pdboot-stage"

Meta = Callable[[str, str, dict[str, str]], dict[str, Any]]


def stage_config_name(plan: Plan) -> str:
    return dns_label(plan.deployment, "stage")


def stage_config_map(plan: Plan, namespace: str, meta: Meta) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(stage_config_name(plan), namespace, {"pdboot.io/role": "stage"}),
        "data": {PROGRAM_KEY: STAGE_PROGRAM},
    }


def stage_init_container(
    inv: Inventory, plan: Plan, w: WeightsStep, secret: str, volumes: list[dict[str, Any]]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the init container, volumes the pod must add for it)."""
    extra: list[dict[str, Any]] = [
        {"name": "stage-program", "configMap": {"name": stage_config_name(plan)}}
    ]
    if not any(v["name"] == "hf-cache" for v in volumes):
        path = {"path": w.hf_cache, "type": "DirectoryOrCreate"}
        extra.append({"name": "hf-cache", "hostPath": path})
    c: dict[str, Any] = {
        "name": "stage-weights",
        "image": w.image,
        "command": ["python3", f"{PROGRAM_DIR}/{PROGRAM_KEY}", w.repo, w.commit],
        "env": [{"name": k, "value": v} for k, v in w.environment()],
        "volumeMounts": [
            {"name": "hf-cache", "mountPath": HF_CACHE_IN_CONTAINER},
            {"name": "stage-program", "mountPath": PROGRAM_DIR, "readOnly": True},
        ],
    }
    if inv.secrets.hf_token is not None:  # HF_TOKEN for a gated model, by name
        c["envFrom"] = [{"secretRef": {"name": secret}}]
    return c, extra
