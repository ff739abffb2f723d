"""Cross-field rules that follow from how NIXL and vLLM really behave (``validate_rules``,
each rule testable on its own), and the queries on a valid inventory that other layers use.
"""

from __future__ import annotations

import difflib

from pdboot.inventory.safety import (
    is_loopback_or_unspecified,
    looks_like_token,
    secret_env_name,
)
from pdboot.inventory.schema import LOCAL, SECRET_ENV_OWNED, Host, Inventory


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


def suggest(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


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
    from pdboot.inventory.engines import is_auto, tier_groups  # engines imports this module

    out: list[Rule] = []
    for tname, tier in inv.tiers():
        policy = getattr(inv.router, f"{tname}_policy")
        # engines, not hosts: one host may run several (engines_per_host: all is >= 1 until
        # preflight counts the GPUs, so it is not refused here)
        count = len(tier.hosts) * len(tier_groups(tier))
        if policy == "power_of_two" and count < 2 and not is_auto(tier):
            out.append(((("router", f"{tname}_policy")),
                        f"vllm-router 0.1.17 refuses power_of_two with fewer than 2 {tname} "
                        "engines; leave it unset (pdboot picks round_robin for one engine)"))
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
    from pdboot.inventory.engines import engine_rules  # engines builds on the models above

    return engine_rules(inv)


def _managed_rules(inv: Inventory, sections: tuple[str, ...]) -> list[Rule]:
    """What pdboot sets itself cannot be set by hand (flags, the NIXL variables)."""
    out: list[Rule] = []
    for tname, tier in inv.tiers():
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
        for t, tier in inv.tiers()
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
}
