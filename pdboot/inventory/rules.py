"""Cross-field rules that follow from how NIXL and vLLM really behave (``validate_rules``,
each rule testable on its own), and the queries on a valid inventory that other layers use.
"""

from __future__ import annotations

import difflib

from pdboot.inventory import flagnames
from pdboot.inventory.cpu_layout import cpu_rules
from pdboot.inventory.engines import engine_rules, is_auto, tier_groups
from pdboot.inventory.hostpaths import mount_conflicts
from pdboot.inventory.ingress_rules import ingress_hosts, ingress_rules
from pdboot.inventory.safety import (
    is_loopback_or_unspecified,
    looks_like_token,
    secret_env_name,
)
from pdboot.inventory.schema import LOCAL, SECRET_ENV_OWNED, TIERS, Host, Inventory
from pdboot.inventory.vllm_rules import vllm_rules


def advertised_address(host: Host) -> str:
    """The address peers use for this host: NIXL side channel, engine URLs."""
    if host.address == LOCAL:
        return host.advertise_address or "127.0.0.1"
    return host.address


def kv_buffer_device(inv: Inventory) -> str:
    """Where NIXL's KV buffers live: the inventory's, else the deployment's device (vLLM's
    NIXL utils accept only "cpu" on the CPU platform)."""
    return inv.kv_transfer.kv_buffer_device or inv.device


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
    return list(dict.fromkeys(inv.decode.hosts + inv.prefill.hosts + ingress_hosts(inv)))


def engine_hosts(inv: Inventory) -> list[str]:
    """The hosts that run engines, prefill first: the order the weights are seeded in (the
    first one serves the others)."""
    return list(dict.fromkeys(inv.prefill.hosts + inv.decode.hosts))


Rule = tuple[tuple[str | int, ...], str]


def suggest(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def validate_rules(inv: Inventory) -> list[Rule]:
    """Cross-field rules. Returns (key path, message) pairs; empty when all hold."""
    return (
        _topology_rules(inv)
        + _address_rules(inv)
        + _port_and_gpu_rules(inv)
        + _managed_rules(inv, TIERS)
        + secret_rules(inv)
        + _managed_rules(inv, ("router",))
        + _policy_rules(inv)
        + _mount_rules(inv)
        + vllm_rules(inv)
        + ingress_rules(inv)
    )


def _mount_rules(inv: Inventory) -> list[Rule]:
    """Host mounts that overlap pdboot's own directories (inventory/hostpaths.py)."""
    model = inv.model if inv.model.startswith("/") else None
    conflicts = mount_conflicts(inv.remote_dir, inv.name, inv.container.hf_cache, model)
    return [(tuple(key.split(".")), msg) for key, msg in conflicts]


def _policy_rules(inv: Inventory) -> list[Rule]:
    out: list[Rule] = []
    for tname, tier in inv.tiers():
        policy = getattr(inv.router, f"{tname}_policy")
        # engines, not hosts: one host may run several (engines_per_host: all is >= 1 until
        # preflight counts the GPUs, so it is not refused here)
        count = len(tier.hosts) * len(tier_groups(tier))
        if policy == "power_of_two" and count < 2 and not is_auto(tier):
            out.append(
                (
                    (("router", f"{tname}_policy")),
                    f"vllm-router 0.1.17 refuses power_of_two with fewer than 2 {tname} "
                    "engines; leave it unset (pdboot picks round_robin for one engine)",
                )
            )
    return out


def _topology_rules(inv: Inventory) -> list[Rule]:
    out: list[Rule] = []
    for tname, tier in inv.tiers():
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
                        f"host {h!r} is not defined under hosts" + suggest(h, list(inv.hosts)),
                    )
                )
    if inv.router.host not in inv.hosts:
        out.append(
            (
                ("router", "host"),
                f"host {inv.router.host!r} is not defined under hosts"
                + suggest(inv.router.host, list(inv.hosts)),
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
        elif host.advertise_address is not None and host.advertise_address != host.address:
            # for an SSH host the address is what peers (and the router) use; a second one
            # that pdboot ignored let the operator believe NIXL advertised it
            out.append(
                (
                    ("hosts", name, "advertise_address"),
                    "advertise_address is only for a `local` host; for this host peers use "
                    f"its address {host.address!r}: remove advertise_address or set address to it",
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
    return out + _duplicate_address_rules(inv)


def _duplicate_address_rules(inv: Inventory) -> list[Rule]:
    """Two inventory hosts with one address are one machine: their ports, GPUs and
    project directories would collide behind pdboot's back."""
    out: list[Rule] = []
    first: dict[str, str] = {}
    for name, host in inv.hosts.items():
        addr = host.address if host.address != LOCAL else f"local:{host.advertise_address}"
        port = host.ssh.port or inv.ssh.port or 22
        key = f"{addr}#{port}"
        if key in first:
            out.append(
                (
                    ("hosts", name, "address"),
                    f"host {name!r} has the same address as host {first[key]!r} "
                    f"({host.address}): one machine is one host; list it once and use "
                    "engines_per_host or both tiers on it",
                )
            )
        else:
            first[key] = name
    return out


def _port_and_gpu_rules(inv: Inventory) -> list[Rule]:
    """GPU groups (CPU cores for device: cpu), ports per engine, tiers sharing a host
    (engines per host)."""
    return cpu_rules(inv) + engine_rules(inv)


def _managed_rules(inv: Inventory, sections: tuple[str, ...]) -> list[Rule]:
    """What pdboot sets itself cannot be set by hand (flags, the NIXL variables)."""
    out: list[Rule] = []
    for tname, tier in inv.tiers():
        if tname not in sections:
            continue
        for key in tier.env:
            why = managed_env_reason(key)
            if why is not None:
                out.append(((tname, "env", key), f"{key} is set by pdboot ({why}); remove it"))
        for i, arg in enumerate(tier.extra_args):
            hit = flagnames.find(arg, flagnames.ENGINE, _MANAGED_FLAGS)
            if hit is not None:
                out.append(
                    (
                        (tname, "extra_args", i),
                        f"{hit.spelled(flagnames.ENGINE)} is set by pdboot "
                        f"({_MANAGED_FLAGS[hit.flag]}); remove it",
                    )
                )
    if "router" not in sections:
        return out
    for i, arg in enumerate(inv.router.extra_args):
        hit = flagnames.find(arg, flagnames.ROUTER, _ROUTER_MANAGED_FLAGS)
        if hit is not None:
            out.append(
                (
                    ("router", "extra_args", i),
                    f"{hit.spelled(flagnames.ROUTER)} is set by pdboot "
                    f"({_ROUTER_MANAGED_FLAGS[hit.flag]}); remove it",
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
    args: list[tuple[tuple[str | int, ...], str, str]] = []
    args += [
        ((t, "extra_args", i), a, flagnames.ENGINE)
        for t, tier in inv.tiers()
        for i, a in enumerate(tier.extra_args)
    ]
    args += [
        (("router", "extra_args", i), a, flagnames.ROUTER)
        for i, a in enumerate(inv.router.extra_args)
    ]
    for path, arg, program in args:
        hit = flagnames.find(arg, program, SECRET_FLAGS)
        if hit is not None:
            out.append(
                (
                    path,
                    f"{hit.spelled(program)} would put a secret on the command line "
                    f"(compose.yaml is 0644, and `ps` shows it); set "
                    f"{SECRET_FLAGS[hit.flag]} (a reference) instead",
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
    for t, tier in inv.tiers():
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


# Engine variables pdboot sets itself (plan._engine, plan._ucx_env) or that would undo
# what it chose: a tier's env is applied last, so it would silently win.
_MANAGED_ENV = {
    "VLLM_NIXL_SIDE_CHANNEL_HOST": "from the host's address",
    "VLLM_NIXL_SIDE_CHANNEL_PORT": "from the tier's side_channel_port",
    "HF_HOME": "the HF cache mount, from container.hf_cache",
    "CUDA_VISIBLE_DEVICES": "from the tier's gpus (the container sees only its GPUs)",
    "NVIDIA_VISIBLE_DEVICES": "from the tier's gpus (the GPU request)",
    "NIXL_TELEMETRY_ENABLE": "from kv_transfer.nixl_telemetry",
    "NIXL_TELEMETRY_EXPORTER": "pdboot runs NIXL's prometheus_mp exporter (all ranks, one port)",
    "NIXL_TELEMETRY_PROMETHEUS_PORT": "from the tier's port (+ 1000; preflight checks it free)",
    "NIXL_TELEMETRY_MULTIPROC_DIR": "a private directory in the engine's container",
}


def managed_env_reason(key: str) -> str | None:
    """Why a tier may not set ``key`` (None: it may)."""
    if key in _MANAGED_ENV:
        return _MANAGED_ENV[key]
    if key.startswith("UCX_"):
        return "UCX variables go under kv_transfer.ucx (net_devices, tls, env)"
    if key.startswith("VLLM_NIXL_SIDE_CHANNEL"):
        return "the NIXL side channel comes from the host and side_channel_port"
    return None


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
            "--data-parallel-size",
            "-dp",
            "--data-parallel-size-local",
            "-dpl",
            "--data-parallel-address",
            "-dpa",
            "--data-parallel-rpc-port",
            "-dpp",
            "--data-parallel-start-rank",
            "-dpr",
            "--headless",
            "--enable-expert-parallel",
            "-ep",
            "--disable-expert-parallel",
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
    "--host": "the router listens on its host's loopback (the proxy owns router.port)",
    "--port": "from router.internal_port",
    "--prometheus-host": "metrics listen on all interfaces",
    "--prometheus-port": "from router.metrics_port",
    "--request-timeout-secs": "from router.request_timeout_secs",
    "--intra-node-data-parallel-size": "from router.dp_aware and the tiers' data_parallel",
    "--enable-igw": "from router.live_workers",
    "--policy": "the decode tier's policy (router.live_workers routes both tiers with one)",
}


def live_workers(inv: Inventory) -> bool:
    """Does `up` register the workers at runtime (router.live_workers)? Not with DP-aware
    routing: its rank expansion was tried only with the static lists. With
    `secrets.api_key` too: the proxy checks the key, the router sends OPENAI_API_KEY to the
    engines on both legs, and every registration names the served model (the router could
    not read it from an engine that checks the key: deploy/router_api.py)."""
    return inv.router.live_workers and not inv.router.dp_aware
