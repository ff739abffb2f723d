"""Plan -> Kubernetes manifests (pure; no I/O): the same engines, arguments, environment and
KV transfer config that `render` writes into compose files, as workloads for a cluster.

Shape (docs/export.md says why, and what does not carry over):

- one Deployment per engine of the plan (replicas 1), pinned to the inventory host by the
  node label ``pdboot.io/host`` (the operator labels the nodes), GPUs as ``nvidia.com/gpu``,
  /dev/shm as a memory emptyDir of the inventory's ``shm_size``, RDMA as an extended
  resource plus IPC_LOCK, ``VLLM_NIXL_SIDE_CHANNEL_HOST`` from the pod's IP (downward API);
- the router as a Deployment using vllm-router's own Kubernetes discovery: one label
  selector per tier, in the manifests' namespace, with RBAC to list and watch pods there;
- a Service in front of the router (the deployment's endpoint);
- the secrets as a Secret referenced by name (``kubectl create secret``; never a value here).

vllm-router's discovery reaches every discovered pod on ONE port (``--service-discovery-
port``), so every engine pod serves HTTP on the prefill tier's port: the only argument that
differs from `render`'s. A data-parallel tier's followers reach their head by the address
`render` gives (the head host's), so its pods use the host's network, as compose does.
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml

from pdboot.export.common import (
    SIDE_CHANNEL_HOST,
    ExportError,
    dns_label,
    endpoint_port,
    engines,
    gpu_count,
    label_value,
    with_flag,
)
from pdboot.export.k8s_edge import proxy_config_map, proxy_container, proxy_volumes
from pdboot.export.k8s_readme import LABEL_HOST, readme  # LABEL_HOST: the node label
from pdboot.export.k8s_weights import stage_config_map, stage_init_container
from pdboot.export.weights import export_weights
from pdboot.inventory.schema import Inventory
from pdboot.plan.model import HF_CACHE_IN_CONTAINER, Plan, Service
from pdboot.plan.router_flags import without_workers

LABEL_DEPLOYMENT = "pdboot.io/deployment"
LABEL_ROLE = "pdboot.io/role"
LABEL_ENGINE = "pdboot.io/engine"
GPU_RESOURCE = "nvidia.com/gpu"
# The Mellanox/NVIDIA RDMA shared device plugin's default resource (k8s-rdma-shared-dev-plugin)
RDMA_RESOURCE = "rdma/rdma_shared_device_a"
PROBE_PERIOD_S = 10


def secret_name(plan: Plan) -> str:
    return dns_label(plan.deployment, "secrets", limit=253)


def router_port(plan: Plan) -> int:
    return endpoint_port(plan)


def engine_port(plan: Plan) -> int:
    """The one HTTP port of every engine pod (the router's discovery port)."""
    return plan.prefill_engines[0].port


def engine_args(plan: Plan, s: Service) -> list[str]:
    """`render`'s arguments of ``s``, with ``--port`` the discovery port (headless followers
    have none)."""
    if "--port" not in s.command:
        return list(s.command)
    return with_flag(s.command, "--port", str(engine_port(plan)))


def _host_network(s: Service) -> bool:
    return bool(s.dp_role)


def _tier_labels(plan: Plan, s: Service) -> dict[str, str]:
    # a headless follower serves no HTTP: it must not match the router's tier selector
    role = f"{s.role}-follower" if s.headless else s.role
    return {LABEL_DEPLOYMENT: label_value(plan.deployment), LABEL_ROLE: role}


def _selector_args(plan: Plan, role: str) -> list[str]:
    return [f"{LABEL_DEPLOYMENT}={label_value(plan.deployment)}", f"{LABEL_ROLE}={role}"]


def router_args(plan: Plan, namespace: str) -> list[str]:
    """`render`'s router arguments (the pod's loopback, behind the proxy sidecar) less its
    static worker lists, plus its discovery."""
    # its metrics on the pod's addresses: router.metrics_bind names an address of the
    # inventory's router host, which a pod does not have
    command = with_flag(without_workers(plan.router.command), "--prometheus-host", "0.0.0.0")  # noqa: S104
    return [
        *command,
        "--service-discovery",
        "--service-discovery-namespace",
        namespace,
        "--service-discovery-port",
        str(engine_port(plan)),
        "--prefill-selector",
        *_selector_args(plan, "prefill"),
        "--decode-selector",
        *_selector_args(plan, "decode"),
    ]


def quantity(size: str) -> str:
    """A Docker size (16g, 512m, 1.5g) as a Kubernetes quantity (16Gi, ...)."""
    unit = size[-1].lower() if size and size[-1].isalpha() else ""
    number = size[:-1] if unit else size
    suffix = {"": "", "b": "", "k": "Ki", "m": "Mi", "g": "Gi", "t": "Ti"}[unit]
    return f"{number}{suffix}"


def _env(s: Service) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name, value in s.environment:
        if name == SIDE_CHANNEL_HOST:
            # under pod networking the pod's own IP is both where NIXL binds and what the
            # peer is told (remote_host); under host networking it is the node's
            out.append({"name": name, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        else:
            out.append({"name": name, "value": value})
    return out


def _probe(port: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": "/health", "port": port},
        "periodSeconds": PROBE_PERIOD_S,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _volumes(inv: Inventory, s: Service) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    vols: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if s.shm_size is not None:
        vols.append(
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": quantity(s.shm_size)}}
        )
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})  # noqa: S108 - the pod's own
    for i, m in enumerate(s.mounts):
        name = "hf-cache" if m.target == HF_CACHE_IN_CONTAINER else f"data-{i}"
        kind = "DirectoryOrCreate" if m.create_host_path else "Directory"
        vols.append({"name": name, "hostPath": {"path": m.source, "type": kind}})
        mount: dict[str, Any] = {"name": name, "mountPath": m.target}
        if m.read_only:
            mount["readOnly"] = True
        mounts.append(mount)
    return vols, mounts


def _engine_container(inv: Inventory, plan: Plan, s: Service, rdma_resource: str) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "vllm", "image": s.image, "args": engine_args(plan, s)}
    c["env"] = _env(s)
    if s.env_file is not None:
        c["envFrom"] = [{"secretRef": {"name": secret_name(plan)}}]
    ports = []
    if not s.headless:
        ports.append({"name": "http", "containerPort": engine_port(plan)})
    if s.side_channel_port is not None:
        ports.append({"name": "nixl", "containerPort": s.side_channel_port})
    c["ports"] = ports
    limits: dict[str, Any] = {}
    if s.gpus is not None:
        limits[GPU_RESOURCE] = gpu_count(inv, s)
    if s.rdma:
        limits[rdma_resource] = 1
    if limits:
        c["resources"] = {"limits": limits}
    if s.cap_add:
        c["securityContext"] = {"capabilities": {"add": list(s.cap_add)}}
    if not s.headless:
        # the whole ready timeout to load the model, as `up` waits; then /health every 10 s
        start = max(1, math.ceil(inv.timeouts.ready_seconds / PROBE_PERIOD_S))
        c["startupProbe"] = _probe(engine_port(plan), start)
        c["readinessProbe"] = _probe(engine_port(plan), 3)
    _, mounts = _volumes(inv, s)
    if mounts:
        c["volumeMounts"] = mounts
    return c


def _meta(name: str, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": labels}


def engine_workload(
    inv: Inventory,
    plan: Plan,
    s: Service,
    namespace: str,
    rdma_resource: str = RDMA_RESOURCE,
    download_at_start: bool = False,
) -> dict[str, Any]:
    """The Deployment of one engine (its weights staged by an init container first)."""
    name = dns_label(plan.deployment, s.name, s.host)
    labels = {**_tier_labels(plan, s), LABEL_ENGINE: label_value(f"{s.name}.{s.host}")}
    vols, _ = _volumes(inv, s)
    pod: dict[str, Any] = {
        "nodeSelector": {LABEL_HOST: label_value(s.host)},
        "containers": [_engine_container(inv, plan, s, rdma_resource)],
    }
    if s.stop_grace_s is not None:  # beyond vLLM's --shutdown-timeout (Kubernetes' own: 30 s)
        pod["terminationGracePeriodSeconds"] = s.stop_grace_s
    step = export_weights(inv, download_at_start).step
    if step is not None:
        init, extra = stage_init_container(inv, plan, step, secret_name(plan), vols)
        pod["initContainers"] = [init]
        vols = [*vols, *extra]
    if _host_network(s):
        pod["hostNetwork"] = True
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"
    if vols:
        pod["volumes"] = vols
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(name, namespace, labels),
        "spec": {
            "replicas": 1,
            # one engine per GPU group: never two copies of it during a rollout
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {LABEL_ENGINE: labels[LABEL_ENGINE]}},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def _router_objects(inv: Inventory, plan: Plan, namespace: str) -> list[dict[str, Any]]:
    r = plan.router
    name = dns_label(plan.deployment, "router")
    labels = {LABEL_DEPLOYMENT: label_value(plan.deployment), LABEL_ROLE: "router"}
    container: dict[str, Any] = {
        "name": "router",
        "image": r.image,
        "command": list(r.entrypoint or ("vllm-router",)),
        "args": router_args(plan, namespace),
        # the router's own port is the pod's loopback: only the proxy beside it reaches it
        "ports": [{"name": "metrics", "containerPort": r.metrics_port or 29000}],
    }
    if r.env_file is not None:
        # vllm-router 0.1.17 sends OPENAI_API_KEY to the workers (the key only, by name)
        container["env"] = [
            {
                "name": "OPENAI_API_KEY",
                "valueFrom": {"secretKeyRef": {"name": secret_name(plan), "key": "OPENAI_API_KEY"}},
            }
        ]
    conf = proxy_config_map(inv, plan, namespace, _meta)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(name, namespace, labels),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": name,
                    "nodeSelector": {LABEL_HOST: label_value(r.host)},
                    "containers": [container, proxy_container(inv, plan, secret_name(plan))],
                    "volumes": proxy_volumes(conf["metadata"]["name"]),
                },
            },
        },
    }
    port = endpoint_port(plan)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name, namespace, labels),
        "spec": {
            "selector": labels,
            # the proxy's port only: the router's worker API is not behind the Service
            "ports": [{"name": "http", "port": port, "targetPort": "proxy"}],
        },
    }
    return [conf, deployment, service]


def _rbac(plan: Plan, namespace: str) -> list[dict[str, Any]]:
    name = dns_label(plan.deployment, "router")
    labels = {LABEL_DEPLOYMENT: label_value(plan.deployment), LABEL_ROLE: "router"}
    subject = {"kind": "ServiceAccount", "name": name, "namespace": namespace}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(name, namespace, labels)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(name, namespace, labels),
            # the router's discovery watches pods in this namespace only (read-only)
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(name, namespace, labels),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [subject],
        },
    ]


def _check(plan: Plan) -> None:
    heads = [s for s in engines(plan) if _host_network(s) and not s.headless]
    hosts = [s.host for s in heads]
    for host in set(hosts):
        if hosts.count(host) > 1:
            raise ExportError(
                f"two data-parallel heads on {host} would both serve HTTP on port "
                f"{engine_port(plan)} of the host (vllm-router's discovery reaches every pod "
                "on one port); put the tiers' heads on different hosts"
            )


def manifests(
    inv: Inventory,
    plan: Plan,
    namespace: str = "default",
    rdma_resource: str = RDMA_RESOURCE,
    download_at_start: bool = False,
) -> dict[str, list[Any]]:
    """File name -> its objects, in apply order."""
    _check(plan)
    step = export_weights(inv, download_at_start).step
    stage = [] if step is None else [stage_config_map(plan, namespace, _meta)]
    return {
        "rbac.yaml": _rbac(plan, namespace),
        "engines.yaml": [
            *stage,
            *(
                engine_workload(inv, plan, s, namespace, rdma_resource, download_at_start)
                for s in engines(plan)
            ),
        ],
        "router.yaml": _router_objects(inv, plan, namespace),
    }


class _Dumper(yaml.SafeDumper):
    """No anchors: objects share label dicts, and kubectl readers expect them spelt out."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _text(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    """A multi-line value (a program, nginx.conf) as a literal block, readable as written."""
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _text)


def dump(objects: list[Any]) -> str:
    # width: never fold the --kv-transfer-config JSON
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, width=10_000)


# an extended resource name: a domain prefix, '/', a name (e.g. rdma/rdma_shared_device_a)
_RESOURCE = re.compile(
    r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)


def render_k8s(
    inv: Inventory,
    plan: Plan,
    namespace: str = "default",
    rdma_resource: str = RDMA_RESOURCE,
    download_at_start: bool = False,
) -> dict[str, str]:
    """File name -> text: the manifests, and a README of the steps they need (llm-d's shape
    is pdboot/export/llmd.py's). Raises ExportError (an unpinned revision: export/weights.py)."""
    weights = export_weights(inv, download_at_start)
    if dns_label(namespace) != namespace:
        raise ExportError(f"namespace {namespace!r} is not a DNS label ([a-z0-9-], 63 at most)")
    if not _RESOURCE.fullmatch(rdma_resource):
        raise ExportError(f"{rdma_resource!r} is not a resource name like {RDMA_RESOURCE}")
    head = f"# Generated by `pdboot export k8s` from deployment {plan.deployment!r}.\n"
    head += f"# {weights.summary}\n"
    objects = manifests(inv, plan, namespace, rdma_resource, download_at_start)
    files = {name: head + dump(objs) for name, objs in objects.items()}
    files["README.md"] = readme(inv, plan, namespace, secret_name(plan), weights.summary)
    return files
