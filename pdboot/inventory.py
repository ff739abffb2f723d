"""The inventory: one YAML file describing hosts, tiers, router and settings.

Strict pydantic models (unknown keys are errors) plus a loader that maps every
validation error back to ``file:line: key.path: message``, all errors at once.
Cross-field rules that follow from how NIXL and vLLM really behave live in
``validate_rules`` so each can be tested on its own.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pdboot import yamlsafe
from pdboot.safety import (
    check_abs_path,
    check_address,
    check_env_name,
    check_reference,
    check_safe_path,
    check_safe_token,
    is_loopback_or_unspecified,
    looks_like_token,
    secret_env_name,
)

DEFAULT_VLLM_IMAGE = "vllm/vllm-openai:v0.33.0"
DEFAULT_ROUTER_IMAGE = "vllm/vllm-router:v0.1.17"
LOCAL = "local"

_NAME_RE = r"^[a-z0-9][a-z0-9_-]{0,62}$"
_USER_RE = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}"
_IFACE_RE = r"[A-Za-z0-9_.:@-]{1,15}"  # IFNAMSIZ - 1
_DEVICE_RE = r"[A-Za-z0-9_.:-]{1,64}"
_IMAGE_RE = r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}"  # registry/repo:tag@digest
_VERSION_RE = r"\d{1,4}(\.\d{1,4}){0,2}"
MAX_TP = 64  # GPUs per engine: no node holds more; vLLM would hang waiting for the rest
MAX_GPU_INDEX = 63
DAY = 86400.0
# Compose parses durations as Go time.Duration (int64 ns, ~292 years), and a readiness
# wait longer than a week means a stuck load, not a slow one.
MAX_READY_SECONDS = 7 * DAY


def _safe_path_or_none(v: str | None, what: str) -> str | None:
    return None if v is None else check_safe_path(v, what)


class Strict(BaseModel):
    # strict: `port: yes` is a YAML bool, not the integer 1; no inf/nan for any number.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


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
    run headless ranks. Rules across fields: pdboot/dp.py."""

    size: DPCount
    # ranks per host: one count for every host, or per host name; None: GPUs / TP of a flat
    # gpus list, else size / number of hosts
    size_local: DPCount | dict[str, DPCount] | None = None
    expert_parallel: bool = False
    rpc_port: int | None = Field(default=None, ge=1, le=65535)  # None: the tier's default


class Tier(Strict):
    hosts: list[str] = Field(min_length=1)
    port: int = Field(ge=1, le=65535)
    side_channel_port: int = Field(ge=1, le=65535)
    tensor_parallel_size: int = Field(default=1, ge=1, le=MAX_TP)
    # "all"; a flat list (one engine's GPUs, or the pool engines_per_host splits); or one
    # list per engine ([[0, 1], [2, 3]]). See pdboot/engines.py.
    gpus: Literal["all"] | list[int] | list[list[int]] = "all"
    # Engines of this tier per host (several independent engines, dense models): a count,
    # or "all" (as many as the GPUs preflight finds allow). None: one engine.
    engines_per_host: EngineCount | Literal["all"] | None = None
    # One data-parallel engine over all the tier's hosts (MoE: with expert parallelism)
    data_parallel: DataParallel | None = None
    extra_args: list[str] = []
    env: dict[str, str] = {}

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            check_env_name(k)
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus_distinct(
        cls, v: Literal["all"] | list[int] | list[list[int]]
    ) -> Literal["all"] | list[int] | list[list[int]]:
        if isinstance(v, list):
            if not v:
                raise ValueError("list of GPU indices must not be empty (or use 'all')")
            groups = [g if isinstance(g, list) else [g] for g in v]
            if isinstance(v[0], list) and any(not g for g in groups):
                raise ValueError("a GPU group must not be empty")
            flat = [i for g in groups for i in g]
            if len(set(flat)) != len(flat):
                raise ValueError("GPU indices must be distinct")
            if any(i < 0 or i > MAX_GPU_INDEX for i in flat):
                raise ValueError(f"GPU indices must be 0..{MAX_GPU_INDEX}")
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


class Router(Strict):
    host: str
    port: int = Field(default=8000, ge=1, le=65535)
    metrics_port: int = Field(default=29000, ge=1, le=65535)
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


# The fields of vLLM 0.33's KVTransferConfig that an operator may set. kv_role is set per
# tier by pdboot; engine_id is left to vLLM (a fresh uuid per engine).
KV_TRANSFER_FIELDS = (
    "kv_connector",
    "kv_buffer_device",
    "kv_load_failure_policy",
    "kv_connector_extra_config",
    "kv_connector_module_path",
    "enable_permute_local_kv",
    "kv_port",
)
# pdboot's own keys in the same section (never passed to vLLM).
KV_TRANSFER_PDBOOT_KEYS = ("rdma", "ucx")


class UCXSettings(Strict):
    net_devices: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_:,.-]+$")
    tls: str | None = Field(default=None, pattern=r"^\^?[A-Za-z0-9_:,.-]+$")  # UCX_TLS
    env: dict[str, str] = {}  # any other UCX_* variable

    @field_validator("env")
    @classmethod
    def _ucx_prefix(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            check_env_name(k)
        bad = [k for k in v if not k.startswith("UCX_")]
        if bad:
            raise ValueError(f"only UCX_* variables belong here, not {', '.join(sorted(bad))}")
        return v


class KVTransfer(Strict):
    kv_connector: Literal["NixlConnector", "NixlPushConnector"] = "NixlConnector"
    kv_buffer_device: Literal["cuda", "cpu"] = "cuda"
    kv_load_failure_policy: Literal["fail", "recompute"] = "fail"
    kv_connector_extra_config: dict[str, Any] = {}
    kv_connector_module_path: str | None = Field(
        default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
    )
    enable_permute_local_kv: bool | None = None
    kv_port: int | None = Field(default=None, ge=1, le=65535)
    rdma: Literal["auto", "on", "off"] = "auto"
    ucx: UCXSettings = UCXSettings()

    @field_validator("rdma", mode="before")
    @classmethod
    def _yaml_on_off(cls, v: object) -> object:
        # YAML 1.1 reads an unquoted `on` / `off` as a boolean.
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v


class Ulimits(Strict):
    # -1 = unlimited (RDMA memory registration needs it); else bytes up to the int64 max
    memlock: int = Field(default=-1, ge=-1, le=2**63 - 1)
    # The kernel's ceiling for open files (fs.nr_open max) is 2**30 - 64.
    nofile: int = Field(default=1048576, ge=1024, le=2**30)


class Container(Strict):
    shm_size: str = "16g"
    ulimits: Ulimits = Ulimits()
    hf_cache: str = "/var/lib/pdboot/hf-cache"  # host path, mounted at /root/.cache/huggingface
    restart: Literal["no", "on-failure", "unless-stopped", "always"] = "unless-stopped"

    @field_validator("restart", mode="before")
    @classmethod
    def _yaml_no(cls, v: object) -> object:
        # YAML 1.1 reads an unquoted `no` as false.
        return "no" if v is False else v

    @field_validator("shm_size")
    @classmethod
    def _size(cls, v: str) -> str:
        if not re.fullmatch(r"\d{1,9}(\.\d{1,3})?[bkmgtBKMGT]?", v.strip()):
            raise ValueError(f"{v!r} is not a size like 16g or 512m")
        return v.strip().lower()

    @field_validator("hf_cache")
    @classmethod
    def _cache(cls, v: str) -> str:
        return check_abs_path(v, "hf_cache")


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

    @field_validator("compute_capability")
    @classmethod
    def _cc(cls, v: str) -> str:
        return check_safe_token(v, "compute capability (like 12.0)", r"\d{1,2}\.\d{1,2}")

    @field_validator("gpu_name")
    @classmethod
    def _gpu_name(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v


class Timeouts(Strict):
    ready_seconds: float = Field(default=1200.0, ge=1, le=MAX_READY_SECONDS)  # loads take minutes
    router_ready_seconds: float = Field(default=120.0, ge=1, le=DAY)
    pull_seconds: float = Field(default=3600.0, ge=1, le=MAX_READY_SECONDS)
    poll_interval_seconds: float = Field(default=0.5, ge=0.05, le=60)
    # an engine leaving service: deregistered, then stopped once vLLM's own
    # num_requests_running/waiting reach 0 (a prefill: also its decodes' KV pulls), or after this
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
    remote_dir: str = "/var/lib/pdboot"  # where compose projects are shipped on each host

    @field_validator("remote_dir")
    @classmethod
    def _remote_dir(cls, v: str) -> str:
        # `up` runs mkdir/chmod and `down --purge` rm -rf on remote_dir/name.
        return check_abs_path(v, "remote_dir")

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
        if v is not None and (not v.strip() or any(c.isspace() for c in v)):
            raise ValueError("must be a non-empty name without spaces")
        return v

    @field_validator("image", "router_image")
    @classmethod
    def _image(cls, v: str) -> str:
        return check_safe_token(v, "image reference (registry/repo:tag)", _IMAGE_RE)

    @field_validator("hosts")
    @classmethod
    def _host_names(cls, v: dict[str, Host]) -> dict[str, Host]:
        bad = [n for n in v if not re.fullmatch(_NAME_RE, n)]
        if bad:
            raise ValueError(
                f"host names must be lowercase letters, digits, - or _: {', '.join(bad)}"
            )
        return v


# --------------------------------------------------------------------------- errors


@dataclass(frozen=True)
class InventoryIssue:
    """One problem, located: rendered as ``file:line: key.path: message``."""

    path: tuple[str | int, ...]
    message: str
    line: int | None = None
    file: str = "inventory"

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        key = _dotted(self.path)
        return f"{where}: {key}: {self.message}" if key else f"{where}: {self.message}"


class InventoryError(Exception):
    """All problems found in an inventory. ``str()`` lists them one per line."""

    def __init__(self, issues: list[InventoryIssue]) -> None:
        self.issues = issues
        super().__init__("\n".join(str(i) for i in issues))


def _dotted(path: tuple[str | int, ...]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


# --------------------------------------------------------------------------- loading


class _LineIndex:
    """Maps a key path to the line of the YAML node that defines it (1-based)."""

    def __init__(self, root: yaml.Node | None) -> None:
        self.root = root

    def line(self, path: tuple[str | int, ...]) -> int | None:
        node = self.root
        best = node.start_mark.line + 1 if node is not None else None
        for part in path:
            if node is None:
                break
            nxt: yaml.Node | None = None
            if isinstance(node, yaml.MappingNode):
                for k, v in node.value:
                    if isinstance(k, yaml.ScalarNode) and k.value == str(part):
                        nxt = v
                        best = k.start_mark.line + 1
                        break
            elif (
                isinstance(node, yaml.SequenceNode)
                and isinstance(part, int)
                and 0 <= part < len(node.value)
            ):
                nxt = node.value[part]
                best = nxt.start_mark.line + 1
            node = nxt
        return best


def _known_fields(model: type[BaseModel], path: tuple[str | int, ...]) -> list[str]:
    """Field names valid at the parent of ``path``, for 'did you mean' suggestions."""
    current: Any = model
    for part in path[:-1]:
        if isinstance(part, int):
            continue
        if isinstance(current, tuple):  # a dict of models: this part is a key
            current = current[1]
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        field = current.model_fields.get(str(part))
        if field is None:
            return []
        ann = field.annotation
        if getattr(ann, "__origin__", None) is dict:
            current = ("dict", _unwrap_model(ann))
        else:
            current = _unwrap_model(ann)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _unwrap_model(ann: Any) -> Any:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for a in getattr(ann, "__args__", ()):
        m = _unwrap_model(a)
        if m is not None:
            return m
    return None


_TAG = re.compile(r"[a-z][a-z_-]*\[.*\]")


def _pydantic_issues(exc: ValidationError, index: _LineIndex, file: str) -> list[InventoryIssue]:
    issues: list[InventoryIssue] = []
    for err in exc.errors():
        # pydantic adds validator tags such as `list[int]` or `function-after[...]`
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and _TAG.fullmatch(p)))
        # pydantic adds the union member name for `"all" | list[int]`; drop such tags
        loc = tuple(p for p in loc if p not in _UNION_TAGS)
        etype = err["type"]
        if etype == "extra_forbidden":
            key = str(loc[-1]) if loc else "?"
            msg = _unknown_key_message(key, loc)
        elif etype == "missing":
            msg = "required key is missing"
        else:
            msg = err["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, ") :]
        issues.append(InventoryIssue(loc, msg, index.line(loc), file))
    # one message per key path (unions can report the same path twice)
    seen: set[tuple[tuple[str | int, ...], str]] = set()
    unique = []
    for i in issues:
        if (i.path, i.message) not in seen:
            seen.add((i.path, i.message))
            unique.append(i)
    return unique


_UNION_TAGS = ("literal['all']", "list[int]", "list[list[int]]", "int", "constrained-int")

_KV_REJECTED_BY_VLLM = {
    "kv_rank": "from the old P2P/PyNccl connectors",
    "kv_parallel_size": "from the old P2P/PyNccl connectors",
    "kv_ip": "from the old P2P/PyNccl connectors; NIXL uses VLLM_NIXL_SIDE_CHANNEL_HOST",
    "kv_buffer_size": "from the old P2P/PyNccl connectors",
}


def _unknown_key_message(key: str, loc: tuple[str | int, ...]) -> str:
    if len(loc) == 2 and loc[0] == "kv_transfer":
        if key == "kv_role":
            return (
                "kv_role is set by pdboot per tier (kv_producer for prefill, "
                "kv_consumer for decode) and cannot be set by hand"
            )
        if key == "engine_id":
            return "engine_id is left to vLLM, which gives every engine its own; remove it"
        why = _KV_REJECTED_BY_VLLM.get(key)
        known = list(KV_TRANSFER_FIELDS) + list(KV_TRANSFER_PDBOOT_KEYS)
        base = (
            f"unknown key {key!r}: not a field of vLLM's KVTransferConfig, "
            "which forbids extra fields (vLLM would refuse to start)"
        )
        if why:
            return f"{base}; {key} is {why}"
        return base + _suggest(key, known)
    return f"unknown key {key!r}" + _suggest(key, _known_fields(Inventory, loc))


def _suggest(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def parse_inventory(text: str, file: str = "inventory.yaml") -> Inventory:
    """Parse and validate inventory text. Raises InventoryError with every problem."""
    if len(text) > MAX_INVENTORY_BYTES:
        raise InventoryError([InventoryIssue((), _TOO_BIG, 1, file)])
    root, data = _load_yaml(text, file)
    if data is None:
        raise InventoryError([InventoryIssue((), "the inventory is empty", 1, file)])
    if not isinstance(data, dict):
        raise InventoryError([InventoryIssue((), "the inventory must be a YAML mapping", 1, file)])
    dups = _duplicate_keys(root, (), file)
    if dups:
        raise InventoryError(dups)
    index = _LineIndex(root)
    bad = [InventoryIssue(p, m, index.line(p), file) for p, m in yamlsafe.plain_values(data)]
    if bad:
        raise InventoryError(bad)
    try:
        inv = Inventory.model_validate(data)
    except ValidationError as e:
        raise InventoryError(_pydantic_issues(e, index, file)) from None
    issues = [InventoryIssue(p, m, index.line(p), file) for p, m in validate_rules(inv)]
    if issues:
        raise InventoryError(issues)
    return inv


def _load_yaml(text: str, file: str) -> tuple[yaml.Node | None, Any]:
    """The node tree (for lines) and the data, through the capped loader."""
    try:
        root, data = yamlsafe.load(text)
    except yaml.YAMLError as e:
        raise InventoryError(
            [InventoryIssue((), _yaml_message(e), yamlsafe.error_line(e, text), file)]
        ) from None
    return root, data


def _yaml_message(e: yaml.YAMLError) -> str:
    """One line (PyYAML's own text spans several and quotes the source)."""
    problem = getattr(e, "problem", None)
    context = getattr(e, "context", None)
    if problem is None:
        return f"not valid YAML: {' '.join(str(e).split())}"
    return f"not valid YAML: {problem}" + (f" ({context})" if context else "")


def _duplicate_keys(
    node: yaml.Node | None, path: tuple[str | int, ...], file: str
) -> list[InventoryIssue]:
    """PyYAML silently keeps the last of two equal keys; an inventory must not."""
    out: list[InventoryIssue] = []
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for k, v in node.value:
            key = str(k.value) if isinstance(k, yaml.ScalarNode) else None
            line = k.start_mark.line + 1
            if key is not None and key in first:
                out.append(
                    InventoryIssue(
                        (*path, key), f"duplicate key (first set on line {first[key]})", line, file
                    )
                )
            elif key is not None:
                first[key] = line
            out += _duplicate_keys(v, (*path, key if key is not None else "?"), file)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out += _duplicate_keys(item, (*path, i), file)
    return out


MAX_INVENTORY_BYTES = 1 << 20
_TOO_BIG = f"the inventory is larger than {MAX_INVENTORY_BYTES >> 20} MiB; is this the right file?"


def load_inventory(path: str | Path) -> Inventory:
    p = Path(path)
    try:
        with p.open("rb") as f:  # read with a limit: /dev/zero must not fill the memory
            raw = f.read(MAX_INVENTORY_BYTES + 1)
    except OSError as e:
        # no line: there is no text (a missing file, a directory, no permission)
        issue = InventoryIssue((), f"cannot read: {e.strerror}", None, str(p))
        raise InventoryError([issue]) from None
    if len(raw) > MAX_INVENTORY_BYTES:
        raise InventoryError([InventoryIssue((), _TOO_BIG, 1, str(p))])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise InventoryError(
            [InventoryIssue((), f"not UTF-8 text ({e.reason} at byte {e.start})", line, str(p))]
        ) from None
    return parse_inventory(text, file=str(path))


# --------------------------------------------------------------------------- rules


def advertised_address(host: Host) -> str:
    """The address peers use for this host: NIXL side channel, engine URLs."""
    if host.address == LOCAL:
        return host.advertise_address or "127.0.0.1"
    return host.address


def engine_uses_secrets(inv: Inventory) -> bool:
    """Engines get secrets.env as env_file when the inventory has any secret."""
    s = inv.secrets
    return s.hf_token is not None or s.api_key is not None or bool(s.env)


def router_uses_secrets(inv: Inventory) -> bool:
    """The router reads OPENAI_API_KEY from secrets.env: vllm-router 0.1.17 sends it to the
    workers as "Authorization: Bearer" (it has no env var for --api-key)."""
    return inv.secrets.api_key is not None


def deployment_hosts(inv: Inventory) -> list[str]:
    """Every host that runs something, in a stable order."""
    return list(dict.fromkeys(inv.decode.hosts + inv.prefill.hosts + [inv.router.host]))


Rule = tuple[tuple[str | int, ...], str]


def validate_rules(inv: Inventory) -> list[Rule]:
    """Cross-field rules. Returns (key path, message) pairs; empty when all hold."""
    return (
        _topology_rules(inv)
        + _address_rules(inv)
        + _port_and_gpu_rules(inv)
        + _managed_rules(inv, ("prefill", "decode"))
        + secret_rules(inv)
        + _managed_rules(inv, ("router",))
        + _policy_rules(inv)
    )


def _policy_rules(inv: Inventory) -> list[Rule]:
    from pdboot.engines import is_auto, tier_groups  # engines imports this module

    out: list[Rule] = []
    for tname, tier in _tiers(inv):
        policy = getattr(inv.router, f"{tname}_policy")
        # engines, not hosts: one host may run several (engines_per_host: all is >= 1 until
        # preflight counts the GPUs, so it is not refused here)
        count = len(tier.hosts) * len(tier_groups(tier))
        if policy == "power_of_two" and count < 2 and not is_auto(tier):
            out.append(((("router", f"{tname}_policy")),
                        f"vllm-router 0.1.17 refuses power_of_two with fewer than 2 {tname} "
                        "engines; leave it unset (pdboot picks round_robin for one engine)"))
    return out


def _tiers(inv: Inventory) -> tuple[tuple[str, Tier], tuple[str, Tier]]:
    return (("prefill", inv.prefill), ("decode", inv.decode))


def _topology_rules(inv: Inventory) -> list[Rule]:
    out: list[Rule] = []
    for tname, tier in _tiers(inv):
        if len(set(tier.hosts)) != len(tier.hosts):
            out.append(
                (
                    (tname, "hosts"),
                    "a host is listed twice; for several engines per host use engines_per_host",
                )
            )
        for i, h in enumerate(tier.hosts):
            if h not in inv.hosts:
                out.append(
                    (
                        (tname, "hosts", i),
                        f"host {h!r} is not defined under hosts" + _suggest(h, list(inv.hosts)),
                    )
                )
    if inv.router.host not in inv.hosts:
        out.append(
            (
                ("router", "host"),
                f"host {inv.router.host!r} is not defined under hosts"
                + _suggest(inv.router.host, list(inv.hosts)),
            )
        )

    p_tp, d_tp = inv.prefill.tensor_parallel_size, inv.decode.tensor_parallel_size
    if max(p_tp, d_tp) % min(p_tp, d_tp) != 0:
        out.append(
            (
                ("decode", "tensor_parallel_size"),
                f"prefill tensor_parallel_size {p_tp} and decode {d_tp} must divide one "
                "another (vLLM asserts it at the NIXL handshake)",
            )
        )
    return out


def _address_rules(inv: Inventory) -> list[Rule]:
    out: list[Rule] = []
    used = deployment_hosts(inv)
    multi_host = len([h for h in used if h in inv.hosts]) > 1
    for name in used:
        host = inv.hosts.get(name)
        if host is None:
            continue
        if host.address == LOCAL:
            if multi_host and (
                host.advertise_address is None or is_loopback_or_unspecified(host.advertise_address)
            ):
                out.append(
                    (
                        ("hosts", name, "advertise_address"),
                        "a `local` host in a multi-host deployment needs a routable "
                        "advertise_address: it is what NIXL advertises to the peer",
                    )
                )
        elif multi_host and is_loopback_or_unspecified(host.address):
            out.append(
                (
                    ("hosts", name, "address"),
                    f"{host.address!r} cannot be the address of a host in a multi-host "
                    "deployment: NIXL advertises it to the peer as VLLM_NIXL_SIDE_CHANNEL_HOST "
                    "and the other host would connect to itself",
                )
            )
    return out


def _port_and_gpu_rules(inv: Inventory) -> list[Rule]:
    """GPU groups, ports per engine, tiers sharing a host (engines per host)."""
    from pdboot.engines import engine_rules  # engines builds on the models above

    return engine_rules(inv)


def _managed_rules(inv: Inventory, sections: tuple[str, ...]) -> list[Rule]:
    """What pdboot sets itself cannot be set by hand (flags, the NIXL variables)."""
    out: list[Rule] = []
    for tname, tier in _tiers(inv):
        if tname not in sections:
            continue
        for key in tier.env:
            if key in ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT"):
                out.append(
                    (
                        (tname, "env", key),
                        f"{key} is set by pdboot from the host address and side_channel_port",
                    )
                )
        for i, arg in enumerate(tier.extra_args):
            flag = _flag_name(arg)
            if flag in _MANAGED_FLAGS:
                out.append(
                    ((tname, "extra_args", i), f"{flag} is set by pdboot ({_MANAGED_FLAGS[flag]})")
                )
    if "router" not in sections:
        return out
    for i, arg in enumerate(inv.router.extra_args):
        flag = _flag_name(arg)
        if flag in _ROUTER_MANAGED_FLAGS:
            out.append(
                (
                    ("router", "extra_args", i),
                    f"{flag} is set by pdboot ({_ROUTER_MANAGED_FLAGS[flag]})",
                )
            )
    return out


# Flags of `vllm serve` (serve-args.json of vLLM 0.33.0) and vllm-router whose value is a
# secret: on a command line it is in compose.yaml (0644) and in every `ps` on the host.
SECRET_FLAGS = {
    "--api-key": "secrets.api_key",
    "--hf-token": "secrets.hf_token",
}


def secret_rules(inv: Inventory) -> list[Rule]:
    """Secrets only through `secrets`: no secret flag, no secret-named variable and no
    token-looking value in extra_args or env."""
    out: list[tuple[tuple[str | int, ...], str]] = []
    args: list[tuple[tuple[str | int, ...], str]] = []
    args += [
        ((t, "extra_args", i), a)
        for t, tier in (("prefill", inv.prefill), ("decode", inv.decode))
        for i, a in enumerate(tier.extra_args)
    ]
    args += [(("router", "extra_args", i), a) for i, a in enumerate(inv.router.extra_args)]
    for path, arg in args:
        flag = _flag_name(arg)
        if flag in SECRET_FLAGS:
            out.append(
                (
                    path,
                    f"{flag} would put a secret on the command line; set "
                    f"{SECRET_FLAGS[flag]} (a reference) instead",
                )
            )
        elif looks_like_token(arg.split("=", 1)[-1]):
            out.append(
                (
                    path,
                    "this looks like a secret; secrets go under `secrets` as a "
                    "reference (env:NAME or file:PATH), never inline",
                )
            )
    for t, tier in (("prefill", inv.prefill), ("decode", inv.decode)):
        for key, value in tier.env.items():
            if key in SECRET_ENV_OWNED:
                out.append(
                    (
                        (t, "env", key),
                        f"set it through {SECRET_ENV_OWNED[key]} (a reference), never inline",
                    )
                )
            elif secret_env_name(key) or looks_like_token(value):
                out.append(
                    (
                        (t, "env", key),
                        "this looks like a secret; put it under "
                        f"secrets.env.{key} as env:NAME or file:PATH",
                    )
                )
            elif key in inv.secrets.env:
                out.append(((t, "env", key), f"also set by secrets.env.{key}"))
    return out


def _flag_name(arg: str) -> str:
    """``--kv_transfer_config=...`` -> ``--kv-transfer-config`` (vLLM accepts both)."""
    flag = arg.split("=", 1)[0]
    return "--" + flag[2:].replace("_", "-") if flag.startswith("--") else flag


_MANAGED_FLAGS = {
    "--kv-transfer-config": "from the kv_transfer section",
    "--port": "from the tier's port",
    "--host": "engines listen on all interfaces of the host network",
    "--tensor-parallel-size": "from tensor_parallel_size",
    "-tp": "from tensor_parallel_size",
    "--model": "from model (both tiers must use the same literal string)",
    "--served-model-name": "from served_model_name",
    # data parallelism: from the tier's data_parallel section (head and followers differ)
    **{
        f: "from the tier's data_parallel section"
        for f in (
            "--data-parallel-size", "-dp", "--data-parallel-size-local", "-dpl",
            "--data-parallel-address", "-dpa", "--data-parallel-rpc-port", "-dpp",
            "--data-parallel-start-rank", "-dpr", "--headless", "--enable-expert-parallel",
            "-ep", "--disable-expert-parallel",
        )
    },
}

_ROUTER_MANAGED_FLAGS = {
    "--vllm-pd-disaggregation": "pdboot always runs the router in P/D mode",
    "--prefill": "one per prefill engine, from the prefill tier",
    "--decode": "one per decode engine, from the decode tier",
    "--prefill-policy": "from router.prefill_policy",
    "--decode-policy": "from router.decode_policy",
    "--cache-threshold": "from router.cache_threshold",
    "--balance-abs-threshold": "from router.balance_abs_threshold",
    "--host": "the router listens on all interfaces",
    "--port": "from router.port",
    "--prometheus-host": "metrics listen on all interfaces",
    "--prometheus-port": "from router.metrics_port",
    "--request-timeout-secs": "from router.request_timeout_secs",
    "--intra-node-data-parallel-size": "from router.dp_aware and the tiers' data_parallel",
    "--enable-igw": "from router.live_workers",
    "--policy": "the decode tier's policy (router.live_workers routes both tiers with one)",
}
