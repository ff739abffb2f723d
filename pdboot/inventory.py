"""The inventory: one YAML file describing hosts, tiers, router and settings.

Strict pydantic models (unknown keys are errors) plus a loader that maps every
validation error back to ``file:line: key.path: message``, all errors at once.
Cross-field rules that follow from how NIXL and vLLM really behave live in
``validate_rules`` so each can be tested on its own.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

DEFAULT_VLLM_IMAGE = "vllm/vllm-openai:v0.33.0"
DEFAULT_ROUTER_IMAGE = "vllm/vllm-router:v0.1.17"
LOCAL = "local"

_NAME_RE = r"^[a-z0-9][a-z0-9_-]{0,62}$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SSHSettings(Strict):
    """How to reach a host. Every field may be overridden per host."""

    user: str | None = None  # None: from ~/.ssh/config, then the local user
    port: int | None = Field(default=None, ge=1, le=65535)
    identity_file: str | None = None
    known_hosts: str | None = None  # None: ~/.ssh/known_hosts
    connect_timeout: float = Field(default=10.0, gt=0)
    command_timeout: float = Field(default=120.0, gt=0)
    use_ssh_config: bool = True


class SSHOverride(Strict):
    user: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    identity_file: str | None = None
    known_hosts: str | None = None
    connect_timeout: float | None = Field(default=None, gt=0)
    command_timeout: float | None = Field(default=None, gt=0)


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
    def _address_nonempty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v.strip()


class Tier(Strict):
    hosts: list[str] = Field(min_length=1)
    port: int = Field(ge=1, le=65535)
    side_channel_port: int = Field(ge=1, le=65535)
    tensor_parallel_size: int = Field(default=1, ge=1)
    # "all"; a flat list (one engine's GPUs, or the pool engines_per_host splits); or one
    # list per engine ([[0, 1], [2, 3]]). See pdboot/engines.py.
    gpus: Literal["all"] | list[int] | list[list[int]] = "all"
    # Engines of this tier per host (several independent engines, dense models): a count,
    # or "all" (as many as the GPUs preflight finds allow). None: one engine.
    engines_per_host: Annotated[int, Field(ge=1)] | Literal["all"] | None = None
    extra_args: list[str] = []
    env: dict[str, str] = {}

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
            if any(i < 0 for i in flat):
                raise ValueError("GPU indices must be >= 0")
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


class Router(Strict):
    host: str
    port: int = Field(default=8000, ge=1, le=65535)
    metrics_port: int = Field(default=29000, ge=1, le=65535)
    prefill_policy: RouterPolicy = "cache_aware"
    decode_policy: RouterPolicy = "cache_aware"
    request_timeout_secs: int = Field(default=86400, ge=1)
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
    net_devices: str | None = None  # UCX_NET_DEVICES, e.g. "mlx5_0:1" or "all"
    tls: str | None = None  # UCX_TLS, e.g. "rc,cuda_copy"
    env: dict[str, str] = {}  # any other UCX_* variable

    @field_validator("env")
    @classmethod
    def _ucx_prefix(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not k.startswith("UCX_")]
        if bad:
            raise ValueError(f"only UCX_* variables belong here, not {', '.join(sorted(bad))}")
        return v


class KVTransfer(Strict):
    kv_connector: Literal["NixlConnector", "NixlPushConnector"] = "NixlConnector"
    kv_buffer_device: Literal["cuda", "cpu"] = "cuda"
    kv_load_failure_policy: Literal["fail", "recompute"] = "fail"
    kv_connector_extra_config: dict[str, Any] = {}
    kv_connector_module_path: str | None = None
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
    memlock: int = -1  # -1 = unlimited; RDMA memory registration needs it
    nofile: int = Field(default=1048576, ge=1024)


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
        if not re.fullmatch(r"\d+(\.\d+)?[bkmgtBKMGT]?", v.strip()):
            raise ValueError(f"{v!r} is not a size like 16g or 512m")
        return v.strip().lower()


class Secrets(Strict):
    # A reference, never a value: "env:NAME" or "file:/path" (a bare path means file:).
    hf_token: str | None = None

    @field_validator("hf_token")
    @classmethod
    def _reference(cls, v: str | None) -> str | None:
        if v is None:
            return None
        if v.startswith("env:"):
            if not re.fullmatch(r"env:[A-Za-z_][A-Za-z0-9_]*", v):
                raise ValueError("env: reference must name an environment variable")
            return v
        if v.startswith("file:") or v.startswith(("/", "~", "./")):
            return v
        raise ValueError(
            "must be a reference (env:HF_TOKEN or file:/path/to/token), never the token itself"
        )


class Requirements(Strict):
    gpu_name: str = "RTX PRO 6000 Blackwell"  # substring of the nvidia-smi name
    compute_capability: str = "12.0"
    min_driver: str = "580.65.06"
    cuda: str = "13.0"
    rdma: Literal["required", "optional"] = "optional"
    min_free_disk_gb: float = Field(default=100.0, ge=0)
    clock_skew_seconds: float = Field(default=5.0, gt=0)
    link_gbps: float | None = Field(default=None, gt=0)  # declared rate for the KV estimate


class Timeouts(Strict):
    ready_seconds: float = Field(default=1200.0, gt=0)  # model loads take minutes
    router_ready_seconds: float = Field(default=120.0, gt=0)
    pull_seconds: float = Field(default=3600.0, gt=0)
    poll_interval_seconds: float = Field(default=0.5, gt=0)


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


def _pydantic_issues(exc: ValidationError, index: _LineIndex, file: str) -> list[InventoryIssue]:
    issues: list[InventoryIssue] = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
        # pydantic adds the union member name for `"all" | list[int]`; drop such tags
        loc = tuple(p for p in loc if p not in _UNION_TAGS)
        etype = err["type"]
        if etype == "extra_forbidden":
            key = str(loc[-1])
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
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise InventoryError([InventoryIssue((), _yaml_message(e), line, file)]) from None
    if data is None:
        raise InventoryError([InventoryIssue((), "the inventory is empty", 1, file)])
    if not isinstance(data, dict):
        raise InventoryError([InventoryIssue((), "the inventory must be a YAML mapping", 1, file)])
    dups = _duplicate_keys(root, (), file)
    if dups:
        raise InventoryError(dups)
    index = _LineIndex(root)
    try:
        inv = Inventory.model_validate(data)
    except ValidationError as e:
        raise InventoryError(_pydantic_issues(e, index, file)) from None
    issues = [InventoryIssue(p, m, index.line(p), file) for p, m in validate_rules(inv)]
    if issues:
        raise InventoryError(issues)
    return inv


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


def load_inventory(path: str | Path) -> Inventory:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise InventoryError(
            [InventoryIssue((), f"cannot read: {e.strerror}", None, str(p))]
        ) from None
    except UnicodeDecodeError as e:
        raise InventoryError(
            [InventoryIssue((), f"not UTF-8 text ({e.reason} at byte {e.start})", None, str(p))]
        ) from None
    return parse_inventory(text, file=str(path))


# --------------------------------------------------------------------------- rules


def is_loopback_or_unspecified(address: str) -> bool:
    if address.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified


def advertised_address(host: Host) -> str:
    """The address peers use for this host: NIXL side channel, engine URLs."""
    if host.address == LOCAL:
        return host.advertise_address or "127.0.0.1"
    return host.address


def engine_hosts(inv: Inventory) -> list[str]:
    return list(dict.fromkeys(inv.prefill.hosts + inv.decode.hosts))


def deployment_hosts(inv: Inventory) -> list[str]:
    """Every host that runs something, in a stable order."""
    return list(dict.fromkeys(inv.decode.hosts + inv.prefill.hosts + [inv.router.host]))


def validate_rules(inv: Inventory) -> list[tuple[tuple[str | int, ...], str]]:
    """Cross-field rules. Returns (key path, message) pairs; empty when all hold."""
    out: list[tuple[tuple[str | int, ...], str]] = []
    tiers = (("prefill", inv.prefill), ("decode", inv.decode))

    for tname, tier in tiers:
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

    # GPU groups, ports per engine, tiers sharing a host (engines per host)
    from pdboot.engines import engine_rules  # engines builds on the models above

    out += engine_rules(inv)

    for tname, tier in tiers:
        for key in tier.env:
            if key in ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT"):
                out.append(
                    (
                        (tname, "env", key),
                        f"{key} is set by pdboot from the host address and side_channel_port",
                    )
                )
            if key == "HF_TOKEN" or key == "HUGGING_FACE_HUB_TOKEN":
                out.append(
                    (
                        (tname, "env", key),
                        "secrets go under secrets.hf_token as a reference, never inline",
                    )
                )
        for i, arg in enumerate(tier.extra_args):
            flag = _flag_name(arg)
            if flag in _MANAGED_FLAGS:
                out.append(
                    ((tname, "extra_args", i), f"{flag} is set by pdboot ({_MANAGED_FLAGS[flag]})")
                )
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
}

_ROUTER_MANAGED_FLAGS = {
    "--vllm-pd-disaggregation": "pdboot always runs the router in P/D mode",
    "--prefill": "one per prefill engine, from the prefill tier",
    "--decode": "one per decode engine, from the decode tier",
    "--prefill-policy": "from router.prefill_policy",
    "--decode-policy": "from router.decode_policy",
    "--host": "the router listens on all interfaces",
    "--port": "from router.port",
    "--prometheus-host": "metrics listen on all interfaces",
    "--prometheus-port": "from router.metrics_port",
    "--request-timeout-secs": "from router.request_timeout_secs",
}
