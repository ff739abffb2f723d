"""Inventory -> what runs where, in which order (pure; no I/O).

One compose project per host (``pdboot-<deployment>``) holding that host's services:
``decode``, ``prefill`` and/or ``router``. Start order: every decode engine, then every
prefill engine, then the router (decode must be serving before prefill hands it work,
and the router only starts once it has workers to register).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pdboot.inventory import (
    LOCAL,
    Inventory,
    Tier,
    advertised_address,
    deployment_hosts,
)

Role = Literal["decode", "prefill", "router"]
ROLES: tuple[Role, ...] = ("decode", "prefill", "router")  # start order; stop is reversed

LABEL_DEPLOYMENT = "io.pdboot.deployment"
LABEL_ROLE = "io.pdboot.role"
LABEL_HOST = "io.pdboot.host"
LABEL_CONFIG_HASH = "io.pdboot.config-hash"

HF_CACHE_IN_CONTAINER = "/root/.cache/huggingface"
SECRETS_FILE = "secrets.env"  # beside compose.yaml on the host, mode 0600, shipped by `up`

KV_ROLE: dict[str, str] = {"prefill": "kv_producer", "decode": "kv_consumer"}


@dataclass(frozen=True)
class Service:
    """One container: a vLLM engine (prefill or decode) or the router."""

    role: Role
    host: str  # inventory host name
    address: str  # the address peers and the router use for this host
    port: int  # HTTP port
    image: str
    command: tuple[str, ...]  # arguments after the image's entrypoint
    entrypoint: tuple[str, ...] | None  # None: the image's own (vLLM: `vllm serve`)
    environment: tuple[tuple[str, str], ...]
    gpus: Literal["all"] | tuple[int, ...] | None  # None: no GPU reservation (router)
    rdma: bool  # /dev/infiniband + IPC_LOCK
    side_channel_port: int | None = None
    metrics_port: int | None = None
    uses_secrets: bool = False
    config_hash: str = ""

    @property
    def name(self) -> str:
        """Compose service name; also the container name suffix."""
        return self.role

    @property
    def url(self) -> str:
        return f"http://{_url_host(self.address)}:{self.port}"

    @property
    def health_url(self) -> str:
        return f"{self.url}/health"

    @property
    def key(self) -> str:
        """Stable human id, e.g. ``decode@gpu-b``."""
        return f"{self.role}@{self.host}"


@dataclass(frozen=True)
class HostPlan:
    host: str
    address: str
    is_local: bool
    project: str  # compose project name
    services: tuple[Service, ...]


@dataclass(frozen=True)
class Plan:
    deployment: str
    model: str
    served_model_name: str
    hosts: dict[str, HostPlan]
    stages: tuple[tuple[Service, ...], ...]  # decode engines, prefill engines, router
    router: Service
    extras: dict[str, str] = field(default_factory=dict)

    @property
    def endpoint(self) -> str:
        return self.router.url

    def services(self) -> list[Service]:
        return [s for stage in self.stages for s in stage]

    def service(self, role: Role, host: str) -> Service | None:
        for s in self.services():
            if s.role == role and s.host == host:
                return s
        return None


def project_name(inv: Inventory) -> str:
    return f"pdboot-{inv.name}"


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def kv_transfer_config(inv: Inventory, role: Literal["prefill", "decode"]) -> dict[str, object]:
    """The --kv-transfer-config object: only fields vLLM 0.33's KVTransferConfig accepts."""
    kv = inv.kv_transfer
    cfg: dict[str, object] = {
        "kv_connector": kv.kv_connector,
        "kv_role": KV_ROLE[role],
        "kv_buffer_device": kv.kv_buffer_device,
        "kv_load_failure_policy": kv.kv_load_failure_policy,
    }
    if kv.kv_connector_extra_config:
        cfg["kv_connector_extra_config"] = dict(kv.kv_connector_extra_config)
    if kv.kv_connector_module_path is not None:
        cfg["kv_connector_module_path"] = kv.kv_connector_module_path
    if kv.enable_permute_local_kv is not None:
        cfg["enable_permute_local_kv"] = kv.enable_permute_local_kv
    if kv.kv_port is not None:
        cfg["kv_port"] = kv.kv_port
    return cfg


def rdma_enabled(inv: Inventory, host: str, rdma_present: Mapping[str, bool] | None) -> bool:
    """RDMA on for this host? `auto` follows what preflight saw, else the declared devices."""
    mode = inv.kv_transfer.rdma
    if mode == "on":
        return True
    if mode == "off":
        return False
    if rdma_present is not None and host in rdma_present:
        return rdma_present[host]
    return bool(inv.hosts[host].rdma_devices)


def _ucx_env(
    inv: Inventory,
    host: str,
    rdma: bool,
    found: Sequence[str] | None,
    tcp_ifaces: Sequence[str] | None = None,
) -> dict[str, str]:
    ucx = inv.kv_transfer.ucx
    env: dict[str, str] = {}
    # declared devices win; else the ports preflight found ACTIVE (UCX would otherwise
    # also try ports that are down)
    devices = list(inv.hosts[host].rdma_devices) or list(found or ())
    if ucx.net_devices:
        env["UCX_NET_DEVICES"] = ucx.net_devices
    elif rdma and devices:
        env["UCX_NET_DEVICES"] = ",".join(d if ":" in d else f"{d}:1" for d in devices)
    elif not rdma and tcp_ifaces:  # the interface preflight found reaching the peers
        env["UCX_NET_DEVICES"] = ",".join(tcp_ifaces)
    if ucx.tls:
        env["UCX_TLS"] = ucx.tls
    env.update(ucx.env)
    return env


def _engine(
    inv: Inventory,
    role: Literal["prefill", "decode"],
    tier: Tier,
    host: str,
    rdma_present: Mapping[str, bool] | None,
    rdma_ports: Mapping[str, Sequence[str]] | None,
    tcp_ifaces: Mapping[str, Sequence[str]] | None = None,
) -> Service:
    h = inv.hosts[host]
    address = advertised_address(h)
    served = inv.served_model_name or inv.model
    cmd: list[str] = [
        inv.model,
        "--port",
        str(tier.port),
        "--served-model-name",
        served,
        "--tensor-parallel-size",
        str(tier.tensor_parallel_size),
        "--kv-transfer-config",
        json.dumps(kv_transfer_config(inv, role), separators=(",", ":"), sort_keys=True),
        *tier.extra_args,
    ]
    rdma = rdma_enabled(inv, host, rdma_present)
    env: dict[str, str] = {
        # Both the bind address and what the peer is told to connect to (remote_host).
        "VLLM_NIXL_SIDE_CHANNEL_HOST": address,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(tier.side_channel_port),
        "HF_HOME": HF_CACHE_IN_CONTAINER,
    }
    env.update(
        _ucx_env(inv, host, rdma, (rdma_ports or {}).get(host), (tcp_ifaces or {}).get(host))
    )
    env.update(tier.env)
    gpus: Literal["all"] | tuple[int, ...] = "all" if tier.gpus == "all" else tuple(tier.gpus)
    svc = Service(
        role=role,
        host=host,
        address=address,
        port=tier.port,
        image=inv.image,
        command=tuple(cmd),
        entrypoint=None,
        environment=tuple(sorted(env.items())),
        gpus=gpus,
        rdma=rdma,
        side_channel_port=tier.side_channel_port,
        uses_secrets=inv.secrets.hf_token is not None,
    )
    return _with_hash(svc, inv)


def _router(inv: Inventory, prefills: list[Service], decodes: list[Service]) -> Service:
    r = inv.router
    h = inv.hosts[r.host]
    cmd: list[str] = ["--vllm-pd-disaggregation"]
    for p in prefills:
        cmd += ["--prefill", p.url]
    for d in decodes:
        cmd += ["--decode", d.url]
    cmd += [
        "--prefill-policy",
        r.prefill_policy,
        "--decode-policy",
        r.decode_policy,
        "--host",
        "0.0.0.0",  # noqa: S104 - the router is the deployment's ingress
        "--port",
        str(r.port),
        "--prometheus-host",
        "0.0.0.0",  # noqa: S104 - scraped from outside the host
        "--prometheus-port",
        str(r.metrics_port),
        "--request-timeout-secs",
        str(r.request_timeout_secs),
        *r.extra_args,
    ]
    svc = Service(
        role="router",
        host=r.host,
        address=advertised_address(h),
        port=r.port,
        image=inv.router_image,
        command=tuple(cmd),
        entrypoint=("vllm-router",),
        environment=(),
        gpus=None,
        rdma=False,
        metrics_port=r.metrics_port,
    )
    return _with_hash(svc, inv)


def _with_hash(svc: Service, inv: Inventory) -> Service:
    """Hash of everything that shapes the container, so `up` can tell what changed."""
    c = inv.container
    material = {
        "role": svc.role,
        "image": svc.image,
        "command": svc.command,
        "entrypoint": svc.entrypoint,
        "env": svc.environment,
        "gpus": svc.gpus,
        "rdma": svc.rdma,
        "secrets": svc.uses_secrets,
        # render.py also draws restart, ulimits, volumes and the healthcheck's start period
        # from these settings: a change there must change the hash too.
        "container": c.model_dump(),
        "ready_seconds": inv.timeouts.ready_seconds if svc.role != "router" else None,
    }
    digest = hashlib.sha256(json.dumps(material, sort_keys=True, default=list).encode())
    return Service(**{**svc.__dict__, "config_hash": digest.hexdigest()[:16]})


def build_plan(
    inv: Inventory,
    rdma_present: Mapping[str, bool] | None = None,
    rdma_ports: Mapping[str, Sequence[str]] | None = None,
    tcp_ifaces: Mapping[str, Sequence[str]] | None = None,
) -> Plan:
    """The deployment plan. ``rdma_present``: per host, whether preflight found RDMA
    devices (used when kv_transfer.rdma is `auto`); None for a dry run. ``rdma_ports``:
    per host, the ``device:port`` names it found ACTIVE (UCX_NET_DEVICES when the
    inventory declares no rdma_devices). ``tcp_ifaces``: per host, the interface(s) that
    reach the peer engine hosts (UCX_NET_DEVICES when RDMA is off)."""
    facts = (rdma_present, rdma_ports, tcp_ifaces)
    decodes = [_engine(inv, "decode", inv.decode, h, *facts) for h in inv.decode.hosts]
    prefills = [_engine(inv, "prefill", inv.prefill, h, *facts) for h in inv.prefill.hosts]
    router = _router(inv, prefills, decodes)
    every = decodes + prefills + [router]
    hosts: dict[str, HostPlan] = {}
    for name in deployment_hosts(inv):
        h = inv.hosts[name]
        hosts[name] = HostPlan(
            host=name,
            address=advertised_address(h),
            is_local=h.address == LOCAL,
            project=project_name(inv),
            services=tuple(s for s in every if s.host == name),
        )
    return Plan(
        deployment=inv.name,
        model=inv.model,
        served_model_name=inv.served_model_name or inv.model,
        hosts=hosts,
        stages=(tuple(decodes), tuple(prefills), (router,)),
        router=router,
    )
