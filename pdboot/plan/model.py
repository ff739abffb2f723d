"""What runs where, as plain frozen records: ``Service`` (every setting of one container, its
name and labels), ``HostPlan`` (one compose project), ``Plan`` (the whole truth), and the
labels pdboot recognises its own containers by.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from pdboot.inventory.schema import TIERS, TierName
from pdboot.plan.privileges import NO_NEW_PRIVILEGES

Role = Literal[TierName, "router", "proxy", "keepalived", "watch"]
# How plans and reports group services. `up` starts both engine tiers together, then the
# router, then the proxy in front of it (the public endpoint, plan/proxy.py), then keepalived
# on the ingress hosts (router.virtual_ip, plan/ingress.py), then watch (`pdboot watch` as a
# service, optional); `down` stops in the reverse order.
ENGINE_ROLES: tuple[TierName, ...] = TIERS[::-1]
STOP_GRACE_S = 30  # Docker's grace for containers with no longer one of their own
ROLES: tuple[Role, ...] = (*ENGINE_ROLES, "router", "proxy", "keepalived", "watch")

LABEL_DEPLOYMENT = "io.pdboot.deployment"
LABEL_ROLE = "io.pdboot.role"
LABEL_HOST = "io.pdboot.host"
# Engine index on its host within its tier, on engines 1, 2, ... Engine 0 carries none (as
# every engine did before engines per host), so single-engine deployments keep their labels
# and config hashes, and adding engines to a tier leaves its engine 0 running.
LABEL_ENGINE = "io.pdboot.engine"
LABEL_CONFIG_HASH = "io.pdboot.config-hash"
LABEL_ROUTER_SLOT = "io.pdboot.router-slot"  # "spare": a router swap's successor
# A data-parallel engine's ranks on that host, "<first>-<last>/<size>" (DP tiers only).
LABEL_DP_RANKS = "io.pdboot.dp-ranks"

HF_CACHE_IN_CONTAINER = "/root/.cache/huggingface"
SECRETS_FILE = "secrets.env"  # beside compose.yaml on the host, mode 0600, shipped by `up`
# What each inventory secret becomes in secrets.env: the variables the HF libraries read,
# vLLM's VLLM_API_KEY (the engines require it on /v1) and OPENAI_API_KEY, which
# vllm-router 0.1.17 sends as "Authorization: Bearer" to the prefill and decode workers.
HF_TOKEN_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
API_KEY_VARS = ("VLLM_API_KEY", "OPENAI_API_KEY")
# the proxy's nginx.conf (0644) and the API key's include (0600), beside compose.yaml
PROXY_CONF_FILE = "proxy-nginx.conf"
PROXY_AUTH_FILE = "proxy-auth.conf"
# the watch service's env file: the API key alone, not the HF token of secrets.env
WATCH_SECRETS_FILE = "watch-secrets.env"
# router.tls's pair, for the proxy
PROXY_TLS_CERT = "proxy-tls.crt"
PROXY_TLS_KEY = "proxy-tls.key"
# the router's env file: OPENAI_API_KEY alone (it sends it to the engines), never the HF token
ROUTER_SECRETS_FILE = "router-secrets.env"
# keepalived's configuration on each ingress host (router.virtual_ip), beside compose.yaml
KEEPALIVED_CONF_FILE = "keepalived.conf"
PRIVATE_FILES = frozenset(
    {PROXY_AUTH_FILE, WATCH_SECRETS_FILE, PROXY_TLS_CERT, PROXY_TLS_KEY, ROUTER_SECRETS_FILE}
)

KV_ROLE: dict[str, str] = {"prefill": "kv_producer", "decode": "kv_consumer"}


def url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


@dataclass(frozen=True)
class Ulimit:
    name: str  # memlock, nofile, ...
    soft: int  # -1 = unlimited
    hard: int


@dataclass(frozen=True)
class BindMount:
    source: str  # path on the host
    target: str  # path in the container
    read_only: bool = False
    create_host_path: bool = False


@dataclass(frozen=True)
class Healthcheck:
    test: tuple[str, ...]
    interval: str
    timeout: str
    retries: int
    start_period: str


@dataclass(frozen=True)
class Service:
    """One container, with every setting that reaches it: render only lays these out,
    and the config hash is taken over what it lays out."""

    name: str  # compose service name, unique on its host
    role: Role
    host: str  # inventory host name
    address: str  # the address peers and the router use for this host
    port: int  # HTTP port
    project: str  # compose project name
    image: str
    command: tuple[str, ...]  # arguments after the image's entrypoint
    entrypoint: tuple[str, ...] | None  # None: the image's own (vLLM: `vllm serve`)
    environment: tuple[tuple[str, str], ...]
    gpus: Literal["all"] | tuple[int, ...] | None  # None: no GPU reservation (router)
    rdma: bool  # /dev/infiniband + IPC_LOCK
    restart: str
    labels: tuple[tuple[str, str], ...]  # without the config hash (render adds it)
    env_file: str | None = None  # secrets reference: a file beside compose.yaml
    network_mode: str = "host"
    ipc: str | None = None
    shm_size: str | None = None
    ulimits: tuple[Ulimit, ...] = ()
    mounts: tuple[BindMount, ...] = ()
    devices: tuple[str, ...] = ()
    cap_add: tuple[str, ...] = ()
    cap_drop: tuple[str, ...] = ()  # plan/privileges.py: what each program runs without
    security_opt: tuple[str, ...] = (NO_NEW_PRIVILEGES,)
    healthcheck: Healthcheck | None = None
    side_channel_port: int | None = None
    metrics_port: int | None = None
    metrics_address: str = ""  # where metrics_port listens when not ``address`` (the router)
    nixl_telemetry_port: int | None = None  # engines: NIXL's exporter (plan/nixl_telemetry.py)
    config_hash: str = ""
    # Engines only (not rendered): its index on the host, and where its UCX_NET_DEVICES
    # came from, in words (e.g. "mlx5_0:1 (PIX, nearest GPUs 0,1)").
    engine_index: int = 0
    nic: str = ""
    # Data-parallel tiers only (not rendered): "head" or "follower", the ranks here in
    # words, and the head's URL (a headless follower has no HTTP; its readiness is the
    # head's /health, which answers only once every rank joined).
    dp_role: str = ""
    dp_ranks: str = ""
    head_url: str = ""
    # device: cpu engines (not rendered; their environment carries it): the cores its
    # threads are bound to, None where vLLM binds them itself (pdboot/inventory/cpu_layout.py)
    device: str = "cuda"
    cpus: tuple[int, ...] | None = None
    scheme: str = "http"  # the proxy with router.tls: https (not rendered; its conf says so)
    # engines: compose's stop_grace_period, beyond vLLM's --shutdown-timeout (plan/vllm_args.py)
    stop_grace_s: int | None = None

    @property
    def is_engine(self) -> bool:
        """A vLLM engine (prefill or decode), not the router or watch."""
        return self.role in ENGINE_ROLES

    @property
    def headless(self) -> bool:
        return self.dp_role == "follower"

    @property
    def ready_url(self) -> str:
        """Where its readiness is read: its own /health, a follower's head's."""
        return f"{self.head_url}/health" if self.headless else self.health_url

    @property
    def container_name(self) -> str:
        return f"{self.project}-{self.name}"

    @property
    def uses_secrets(self) -> bool:
        """It reads the shared secrets.env (the engines); the router and the watch service
        read env files of their own, holding only the API key."""
        return self.env_file == SECRETS_FILE

    @property
    def url(self) -> str:
        return f"{self.scheme}://{url_host(self.address)}:{self.port}"

    @property
    def health_url(self) -> str:
        return f"{self.url}/health"

    @property
    def key(self) -> str:
        """Stable human id, e.g. ``decode@gpu-b``."""
        return f"{self.name}@{self.host}"


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
    # (decode engines, prefill engines, (router,), (proxy,)[, (watch,)]): read by name below,
    # iterated in order
    stages: tuple[tuple[Service, ...], ...]
    router: Service
    hf_token_ref: str | None = None  # where `up` reads the token (env:NAME, file:PATH)
    # What this plan had to assume without preflight's facts, in words (render says so;
    # `up` must not deploy an `engines_per_host: all` tier from an assumed GPU count).
    unresolved: tuple[str, ...] = ()
    unresolved_on: tuple[tuple[str, str], ...] = ()  # the same lines as (host, line)
    device: str = "cuda"  # the inventory's: cuda, or cpu (render writes its notes)
    kv_cache_gib: int = 0  # device: cpu: VLLM_CPU_KVCACHE_SPACE of each engine
    watch: Service | None = None  # `pdboot watch` as a service beside the router (watch.image)
    revision: str = ""  # the --revision pdboot gives the engines ("": vLLM's default branch)
    # the public endpoint's nginx in front of the router (None only in hand-built test plans:
    # then the router's own URL is the endpoint)
    proxy: Service | None = None
    # router.standby (plan/ingress.py): its router and proxy, which `up` brings up after the
    # router host's and registers every worker on; keepalived on both ingress hosts with
    # router.virtual_ip (its address, without the prefix, is then the endpoint's)
    standby: tuple[Service, ...] = ()
    keepalived: tuple[Service, ...] = ()
    virtual_ip: str = ""
    keepalived_confs: Mapping[str, str] = field(default_factory=dict)  # host -> its conf

    @property
    def endpoint(self) -> str:
        """Where clients (and pdboot's own checks through the front door) send requests."""
        front = self.proxy or self.router
        if self.virtual_ip:
            return f"{front.scheme}://{url_host(self.virtual_ip.split('/')[0])}:{front.port}"
        return front.url

    @property
    def standby_router(self) -> Service | None:
        return next((s for s in self.standby if s.role == "router"), None)

    @property
    def standby_proxy(self) -> Service | None:
        return next((s for s in self.standby if s.role == "proxy"), None)

    def ingress_services(self) -> list[Service]:
        """What the standby ingress adds beside the stages: the standby's router and proxy,
        then keepalived (the order `up` starts them in)."""
        return [*self.standby, *self.keepalived]

    @property
    def stop_grace_s(self) -> int:
        """The longest SIGTERM-to-SIGKILL grace of its containers: what `down` and a roll's
        stop give Docker (an engine's exceeds its --shutdown-timeout; others exit in seconds)."""
        graces = [s.stop_grace_s for s in self.services() if s.stop_grace_s is not None]
        return max(graces, default=STOP_GRACE_S)

    def services(self) -> list[Service]:
        return [s for stage in self.stages for s in stage]

    @property
    def decode_engines(self) -> tuple[Service, ...]:
        return self.stages[0]

    @property
    def prefill_engines(self) -> tuple[Service, ...]:
        return self.stages[1]

    @property
    def engines(self) -> tuple[Service, ...]:
        """Every engine of both tiers: what `up` starts together."""
        return self.decode_engines + self.prefill_engines
