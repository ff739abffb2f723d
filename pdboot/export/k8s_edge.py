"""The edge on Kubernetes (pure): pdboot's proxy (export/edge.py, plan/proxy.py's nginx.conf)
as a sidecar in the router's pod. vllm-router serves its worker API on the port of /v1, so
the router listens on the pod's loopback (`render`'s address) and the Service targets the
proxy's port only; the proxy checks the API key, read from the Secret into its own
environment and written to its include (0600) in a memory emptyDir when it starts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pdboot.export.common import dns_label, endpoint_port
from pdboot.export.edge import (
    PROXY_CONF_IN_CONTAINER,
    PROXY_DIR_IN_CONTAINER,
    proxy_conf,
    proxy_start,
)
from pdboot.inventory.schema import Inventory
from pdboot.plan.model import Plan

CONF_KEY = "nginx.conf"
KEY_VAR = "PDBOOT_API_KEY"  # the proxy container's, from the Secret's VLLM_API_KEY

Meta = Callable[[str, str, dict[str, str]], dict[str, Any]]


def proxy_config_map(inv: Inventory, plan: Plan, namespace: str, meta: Meta) -> dict[str, Any]:
    name = dns_label(plan.deployment, "proxy-conf")
    labels = {"pdboot.io/role": "proxy"}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(name, namespace, labels),
        "data": {CONF_KEY: proxy_conf(inv)},
    }


def proxy_volumes(config_map: str) -> list[dict[str, Any]]:
    return [
        {"name": "proxy-run", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": "proxy-conf", "configMap": {"name": config_map}},
    ]


def proxy_container(inv: Inventory, plan: Plan, secret: str) -> dict[str, Any]:
    proxy = plan.proxy
    port = endpoint_port(plan)
    c: dict[str, Any] = {
        "name": "proxy",
        "image": proxy.image if proxy is not None else inv.router.proxy_image,
        "command": ["sh", "-c", proxy_start(inv, f'key="${KEY_VAR}"')],
        "ports": [{"name": "proxy", "containerPort": port}],
        # through the proxy to the router's /health: the pod is Ready when both answer
        "readinessProbe": {"httpGet": {"path": "/health", "port": port}, "periodSeconds": 5},
        "volumeMounts": [
            {"name": "proxy-run", "mountPath": PROXY_DIR_IN_CONTAINER},
            {
                "name": "proxy-conf",
                "mountPath": PROXY_CONF_IN_CONTAINER,
                "subPath": CONF_KEY,
                "readOnly": True,
            },
        ],
    }
    if inv.secrets.api_key is not None:
        ref = {"secretKeyRef": {"name": secret, "key": "VLLM_API_KEY"}}
        c["env"] = [{"name": KEY_VAR, "valueFrom": ref}]
    return c
