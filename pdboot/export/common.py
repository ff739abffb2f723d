"""What both export targets share: the engine's arguments and environment as `render` gives
them, secret variable names (never values), and names a scheduler accepts."""

from __future__ import annotations

import re
from collections.abc import Sequence

from pdboot.inventory.schema import Inventory
from pdboot.plan.model import LABEL_DP_RANKS, Plan, Service
from pdboot.transport.hosts import API_KEY_VARS, HF_TOKEN_VARS

SIDE_CHANNEL_HOST = "VLLM_NIXL_SIDE_CHANNEL_HOST"


class ExportError(ValueError):
    """The plan cannot be laid out for this target (said why, in words)."""


def secret_vars(inv: Inventory) -> list[str]:
    """The variables `up` writes into secrets.env for this inventory: names only."""
    s = inv.secrets
    names: list[str] = []
    if s.hf_token is not None:
        names += HF_TOKEN_VARS
    if s.api_key is not None:
        names += API_KEY_VARS
    names += list(s.env)
    return names


def with_flag(command: Sequence[str], flag: str, value: str) -> list[str]:
    """``command`` with the value after ``flag`` replaced (the flag must be there)."""
    out = list(command)
    i = out.index(flag)
    out[i + 1] = value
    return out


def dns_label(*parts: str, limit: int = 63) -> str:
    """A DNS-1123 label from parts (lower case, [a-z0-9-], at most ``limit`` characters)."""
    text = re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")
    return re.sub(r"-{2,}", "-", text)[:limit].rstrip("-") or "pdboot"


def label_value(text: str) -> str:
    """A Kubernetes label value ([A-Za-z0-9._-], at most 63, alphanumeric at both ends)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:63].strip("-._") or "x"


def engines(plan: Plan) -> list[Service]:
    """Every engine, prefill first (the order the exported files list them)."""
    return list(plan.prefill_engines) + list(plan.decode_engines)


def gpu_count(inv: Inventory, s: Service) -> int:
    """GPUs one engine needs: its group, or TP x local DP ranks where it takes `all`."""
    if isinstance(s.gpus, tuple):
        return len(s.gpus)
    tp = (inv.prefill if s.role == "prefill" else inv.decode).tensor_parallel_size
    local = 1
    if s.dp_ranks:  # the label carries "first-last/size"
        ranks = dict(s.labels).get(LABEL_DP_RANKS, "0-0/1").split("/")[0]
        first, last = ranks.split("-")
        local = int(last) - int(first) + 1
    return tp * local


def endpoint_router_command(plan: Plan) -> list[str]:
    """`render`'s router command as the exported endpoint: on a scheduler nothing runs
    pdboot's proxy (docs/export.md), so the router listens where clients reach it (all
    addresses, the endpoint's port) instead of its host's loopback behind the proxy."""
    # its metrics on every address of the scheduler's node or pod: the deployment's
    # router.metrics_bind names an address of the router host, which a job does not have
    command = list(with_flag(plan.router.command, "--prometheus-host", "0.0.0.0"))  # noqa: S104
    if plan.proxy is None:
        return command
    command = with_flag(command, "--host", "0.0.0.0")  # noqa: S104 - the exported endpoint
    return with_flag(command, "--port", str(plan.proxy.port))


def endpoint_port(plan: Plan) -> int:
    """The port clients use: the proxy's where `up` runs one (the router's own otherwise)."""
    return plan.proxy.port if plan.proxy is not None else plan.router.port
