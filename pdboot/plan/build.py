"""Inventory -> what runs where, in which order (pure; no I/O).

One compose project per host (``pdboot-<deployment>``): ``decode``, ``prefill``, ``router``,
``proxy``. Start order: every engine of both tiers together (NIXL needs nothing from the other
tier at start-up), then the router once they answer /health, then the proxy in front."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace

from pdboot.inventory.cpu_layout import CPU_DTYPE, engine_cores, flag_value, threads_bind
from pdboot.inventory.dp import router_dp_size
from pdboot.inventory.engines import (
    EngineNic,
    EngineSpec,
    engines,
    nixl_telemetry_port,
    unresolved_on,
)
from pdboot.inventory.rules import (
    advertised_address,
    deployment_hosts,
    engine_uses_secrets,
    kv_buffer_device,
    live_workers,
    router_uses_secrets,
)
from pdboot.inventory.schema import LOCAL, Inventory, Tier, TierName, tier_policy
from pdboot.plan.facts import PlanFacts
from pdboot.plan.ingress import ingress_plan, keepalived_service
from pdboot.plan.model import (
    HF_CACHE_IN_CONTAINER,
    KV_ROLE,
    LABEL_DEPLOYMENT,
    LABEL_DP_RANKS,
    LABEL_ENGINE,
    LABEL_HOST,
    LABEL_ROLE,
    ROUTER_SECRETS_FILE,
    SECRETS_FILE,
    BindMount,
    Healthcheck,
    HostPlan,
    Plan,
    Role,
    Service,
    Ulimit,
    url_host,
)
from pdboot.plan.nixl_telemetry import telemetry_env
from pdboot.plan.privileges import ALL, ENGINE_DROPPED
from pdboot.plan.proxy import ROUTER_INTERNAL_ADDRESS, proxy_service
from pdboot.plan.render import service_definition
from pdboot.plan.router_flags import cache_aware_flags, without_workers
from pdboot.plan.vllm_args import nic_rank_env, stop_grace_s, version_args, without_shutdown_timeout
from pdboot.plan.watch.sidecar import watch_service
from pdboot.plan.weights.engine_args import engine_hub_env, revision_args, revision_of


def project_name(inv: Inventory) -> str:
    return f"pdboot-{inv.name}"


def kv_transfer_config(inv: Inventory, role: TierName) -> dict[str, object]:
    """The --kv-transfer-config object: only fields vLLM 0.33's KVTransferConfig accepts."""
    kv = inv.kv_transfer
    cfg: dict[str, object] = {
        "kv_connector": kv.kv_connector,
        "kv_role": KV_ROLE[role],
        "kv_buffer_device": kv_buffer_device(inv),
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
    nearest: EngineNic | None,
    tcp_ifaces: Sequence[str] | None = None,
) -> tuple[dict[str, str], str]:
    """The UCX_* variables of one engine, and where UCX_NET_DEVICES came from."""
    ucx = inv.kv_transfer.ucx
    env: dict[str, str] = {}
    # explicit wins; then the port(s) nearest the engine's GPUs (preflight's topo choice);
    # then the declared devices; else the ports preflight found ACTIVE (UCX would otherwise
    # also try ports that are down)
    devices = list(inv.hosts[host].rdma_devices) or list(found or ())
    why = ""
    if ucx.net_devices:
        env["UCX_NET_DEVICES"] = ucx.net_devices
        why = f"{ucx.net_devices} (kv_transfer.ucx.net_devices)"
    elif rdma and nearest is not None and nearest.ports:
        env["UCX_NET_DEVICES"] = ",".join(nearest.ports)
        why = nearest.describe()
    elif rdma and devices:
        env["UCX_NET_DEVICES"] = ",".join(d if ":" in d else f"{d}:1" for d in devices)
        why = env["UCX_NET_DEVICES"] + " (every port; the nearest needs preflight's facts)"
    elif rdma:
        why = "left to UCX (no device known; the nearest needs preflight's facts)"
    elif tcp_ifaces:  # the interface preflight found reaching the peers
        env["UCX_NET_DEVICES"] = ",".join(tcp_ifaces)
        why = f"{env['UCX_NET_DEVICES']} (TCP: the interface reaching the peers)"
    if ucx.tls:
        env["UCX_TLS"] = ucx.tls
    env.update(ucx.env)
    return env, why


# Docker only counts failed probes after start_period; model loads take minutes, so the
# engines get the whole ready timeout before they can turn "unhealthy".
HEALTH_INTERVAL = "10s"
HEALTH_TIMEOUT = "5s"
HEALTH_RETRIES = 3

# The probe runs inside the engine container, which shares the host's network; the vLLM
# image (and the stand-in) have python3, not curl.
_PROBE = (
    "import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/health', timeout=5)"
)


def _labels(
    inv: Inventory, role: Role, host: str, engine: EngineSpec | None = None
) -> tuple[tuple[str, str], ...]:
    out: tuple[tuple[str, str], ...] = (
        (LABEL_DEPLOYMENT, inv.name),
        (LABEL_ROLE, role),
        (LABEL_HOST, host),
    )
    if engine is not None and engine.index > 0:
        out += ((LABEL_ENGINE, str(engine.index)),)
    if engine is not None and engine.dp is not None:
        d = engine.dp
        out += ((LABEL_DP_RANKS, f"{d.start}-{d.start + d.local - 1}/{d.size}"),)
    return out


def _ulimits(inv: Inventory, *names: str) -> tuple[Ulimit, ...]:
    values = {"memlock": inv.container.ulimits.memlock, "nofile": inv.container.ulimits.nofile}
    return tuple(Ulimit(n, values[n], values[n]) for n in names)


def _mounts(inv: Inventory) -> tuple[BindMount, ...]:
    mounts = [BindMount(inv.container.hf_cache, HF_CACHE_IN_CONTAINER, create_host_path=True)]
    if inv.model.startswith("/"):
        # A model given as a path on the hosts must be visible at the same path inside,
        # so both tiers keep passing the same literal model string (NIXL compares it).
        mounts.append(BindMount(inv.model, inv.model, read_only=True))
    return tuple(mounts)


def _dp_args(inv: Inventory, e: EngineSpec) -> list[str]:
    """vLLM's multi-node DP options (serve-args.json of 0.33): the same size, address and
    RPC port on every host; followers add --headless and their first global rank."""
    d = e.dp
    if d is None:
        return []
    out = [
        "--data-parallel-size",
        str(d.size),
        "--data-parallel-size-local",
        str(d.local),
        "--data-parallel-address",
        advertised_address(inv.hosts[d.head]),
        "--data-parallel-rpc-port",
        str(d.rpc_port),
    ]
    if not d.is_head:
        out += ["--headless", "--data-parallel-start-rank", str(d.start)]
    if d.expert_parallel:
        out.append("--enable-expert-parallel")
    return out


def _engine_command(inv: Inventory, e: EngineSpec) -> list[str]:
    tier = inv.tier(e.role)
    # a headless follower serves no HTTP: no --port
    port = [] if e.dp is not None and not e.dp.is_head else ["--port", str(e.port)]
    return [
        inv.model,
        *port,
        "--served-model-name",
        inv.served_model_name or inv.model,
        "--tensor-parallel-size",
        str(tier.tensor_parallel_size),
        "--kv-transfer-config",
        json.dumps(kv_transfer_config(inv, e.role), separators=(",", ":"), sort_keys=True),
        *_dp_args(inv, e),
        *revision_args(inv.model, inv.model_revision),
        *_cpu_args(inv, tier.extra_args),
        *version_args(inv, tier),
        *tier.extra_args,
    ]


def _cpu_args(inv: Inventory, extra_args: list[str]) -> list[str]:
    """device: cpu: --dtype float32 unless the tier sets --dtype (the bf16 crash in
    pdboot/inventory/cpu_layout.py's CPU_DTYPE)."""
    if inv.device != "cpu" or flag_value(extra_args, "--dtype") is not None:
        return []
    return ["--dtype", CPU_DTYPE]


def _cpu_env(inv: Inventory, tier: Tier, cores: tuple[int, ...] | None) -> dict[str, str]:
    """device: cpu: the KV cache size and, where pdboot picked the cores, the threads'
    binding (vLLM reads both; pdboot/inventory/cpu_layout.py)."""
    if inv.device != "cpu":
        return {}
    env = {"VLLM_CPU_KVCACHE_SPACE": str(inv.cpu.kv_cache_gib)}
    if cores is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = threads_bind(cores, tier.tensor_parallel_size)
    return env


def _engine(
    inv: Inventory,
    e: EngineSpec,
    rdma_present: Mapping[str, bool] | None,
    rdma_ports: Mapping[str, Sequence[str]] | None,
    nearest: EngineNic | None,
    tcp_ifaces: Sequence[str] | None = None,
    cores: tuple[int, ...] | None = None,
) -> Service:
    host, role = e.host, e.role
    tier = inv.tier(role)
    address = advertised_address(inv.hosts[host])
    rdma = rdma_enabled(inv, host, rdma_present)
    env: dict[str, str] = {
        # Both the bind address and what the peer is told to connect to (remote_host).
        "VLLM_NIXL_SIDE_CHANNEL_HOST": address,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(e.side_channel_port),
        "HF_HOME": HF_CACHE_IN_CONTAINER,
        **_cpu_env(inv, tier, cores),
    }
    ucx, nic = _ucx_env(inv, host, rdma, (rdma_ports or {}).get(host), nearest, tcp_ifaces)
    if not rdma and inv.kv_transfer.rdma == "auto" and host not in (rdma_present or {}):
        nic = "RDMA auto: the nearest HCA port needs preflight's facts"
        if inv.device == "cpu":  # no GPUs to be near
            nic = "RDMA auto: needs preflight's facts"
    env.update(ucx)
    env.update(nic_rank_env(inv, tier, rdma, nearest))
    env.update(engine_hub_env(inv.model, inv.model_revision, inv.weights))
    telemetry = nixl_telemetry_port(inv, e.port)
    env.update(telemetry_env(telemetry))
    env.update(tier.env)
    dp = _dp_fields(inv, e)
    return Service(
        name=e.name,
        role=role,
        host=host,
        address=address,
        port=e.port,
        project=project_name(inv),
        image=inv.image,
        command=tuple(_engine_command(inv, e)),
        entrypoint=None,
        environment=tuple(sorted(env.items())),
        gpus=None if inv.device == "cpu" else e.gpus,  # cpu: no GPU reservation
        rdma=rdma,
        restart=inv.container.restart,
        labels=_labels(inv, role, host, e),
        env_file=SECRETS_FILE if engine_uses_secrets(inv) else None,
        ipc="host",
        shm_size=inv.container.shm_size,
        # memlock -1 = unlimited: RDMA memory registration fails under Docker's 8 MiB default.
        ulimits=_ulimits(inv, "memlock", "nofile"),
        mounts=_mounts(inv),
        devices=("/dev/infiniband:/dev/infiniband",) if rdma else (),
        cap_add=("IPC_LOCK",) if rdma else (),
        cap_drop=ENGINE_DROPPED,
        healthcheck=None if e.dp is not None and not e.dp.is_head else _healthcheck(inv, e),
        side_channel_port=e.side_channel_port,
        nixl_telemetry_port=telemetry,
        engine_index=e.index,
        nic=nic,
        dp_role=dp[0],
        dp_ranks=dp[1],
        head_url=dp[2],
        device=inv.device,
        cpus=cores,
        stop_grace_s=stop_grace_s(inv),
    )


def _healthcheck(inv: Inventory, e: EngineSpec) -> Healthcheck:
    return Healthcheck(
        test=("CMD", "python3", "-c", _PROBE.format(port=e.port)),
        interval=HEALTH_INTERVAL,
        timeout=HEALTH_TIMEOUT,
        retries=HEALTH_RETRIES,
        start_period=f"{int(inv.timeouts.ready_seconds)}s",
    )


def _dp_fields(inv: Inventory, e: EngineSpec) -> tuple[str, str, str]:
    """(dp_role, dp_ranks, head_url) of a DP engine; empty strings otherwise."""
    if e.dp is None:
        return "", "", ""
    head = advertised_address(inv.hosts[e.dp.head])
    role = "head" if e.dp.is_head else "follower"
    return role, e.dp.describe(), f"http://{url_host(head)}:{e.port}"


def _router_command(inv: Inventory, prefills: list[Service], decodes: list[Service]) -> list[str]:
    r = inv.router
    live = live_workers(inv)
    cmd: list[str] = ["--vllm-pd-disaggregation"] + (["--enable-igw"] if live else [])
    # a data-parallel tier is one worker: its head (followers serve no HTTP)
    for p in prefills:
        if not p.headless:
            cmd += ["--prefill", p.url]
    for d in decodes:
        if not d.headless:
            cmd += ["--decode", d.url]
    if r.dp_aware:
        # the key for the workers reaches the router as OPENAI_API_KEY (secrets.env),
        # never as --api-key on this command line
        cmd += ["--intra-node-data-parallel-size", str(router_dp_size(inv))]
    # router workers: a data-parallel tier counts once (its head)
    policies = (
        tier_policy(r.prefill_policy, "prefill", len([p for p in prefills if not p.headless])),
        tier_policy(r.decode_policy, "decode", len([d for d in decodes if not d.headless])),
    )
    if live:
        # vllm-router 0.1.17 in IGW mode routes every tier with --policy (tried: the per-tier
        # flags are ignored there); the decode tier's spreads the load that dominates
        policies = (policies[1], policies[1])
        chosen = ["--policy", policies[1]]
    else:
        chosen = ["--prefill-policy", policies[0], "--decode-policy", policies[1]]
    return [
        *cmd,
        *chosen,
        *cache_aware_flags(inv, policies),
        # loopback only: the proxy owns the public port (plan/proxy.py)
        "--host",
        ROUTER_INTERNAL_ADDRESS,
        "--port",
        str(r.internal_port),
        "--prometheus-host",
        metrics_bind(inv),  # where Prometheus scrapes it (router.metrics_bind)
        "--prometheus-port",
        str(r.metrics_port),
        "--request-timeout-secs",
        str(r.request_timeout_secs),
        *r.extra_args,
    ]


def metrics_bind(inv: Inventory) -> str:
    """Where the router's /metrics listens: router.metrics_bind, else the router host's
    advertised address (where the Prometheus config pdboot writes scrapes it)."""
    return inv.router.metrics_bind or advertised_address(inv.hosts[inv.router.host])


def _router(inv: Inventory, prefills: list[Service], decodes: list[Service]) -> Service:
    r = inv.router
    return Service(
        name="router",
        role="router",
        host=r.host,
        address=ROUTER_INTERNAL_ADDRESS,  # as its host sees it (deploy/router_admin.py)
        port=r.internal_port,
        project=project_name(inv),
        image=inv.router_image,
        command=tuple(_router_command(inv, prefills, decodes)),
        entrypoint=("vllm-router",),
        environment=(),
        gpus=None,
        rdma=False,
        restart=inv.container.restart,
        labels=_labels(inv, "router", r.host),
        ulimits=_ulimits(inv, "nofile"),
        metrics_port=r.metrics_port,
        metrics_address=metrics_bind(inv),
        # vllm-router 0.1.17 sends OPENAI_API_KEY from its environment to the workers: a
        # file of its own holding only that (the HF token stays with the engines)
        env_file=ROUTER_SECRETS_FILE if router_uses_secrets(inv) else None,
        cap_drop=(ALL,),  # it needs no capability (plan/privileges.py)
    )


def _with_hash(svc: Service) -> Service:
    """The hash of the service's rendered definition (less the hash label), as Compose v1
    hashed its config dict: any setting that reaches the container changes it."""
    definition = service_definition(svc, with_hash=False)
    if svc.role == "router" and "--enable-igw" in svc.command:
        definition["command"] = without_workers(svc.command)
    if svc.is_engine:  # how it stops, not what it serves: out (plan/vllm_args.py says why)
        definition["command"] = without_shutdown_timeout(definition["command"])
        definition.pop("stop_grace_period", None)
    material = json.dumps(definition, sort_keys=True)
    return replace(svc, config_hash=hashlib.sha256(material.encode()).hexdigest()[:16])


def _nic_for(e: EngineSpec, nics: Mapping[str, Mapping[str, EngineNic]]) -> EngineNic | None:
    """The recorded choice for this engine, only while it was made for the same GPUs (a
    group changed since the last preflight gets every port, not another group's NIC)."""
    nic = nics.get(e.host, {}).get(e.name)
    if nic is None or (e.gpus != "all" and nic.gpus and tuple(nic.gpus) != tuple(e.gpus)):
        return None
    return nic


def build_plan(inv: Inventory, facts: PlanFacts | None = None) -> Plan:
    """The deployment plan; ``facts``: what preflight found on the hosts (or recorded there),
    None for a dry run."""
    f = facts or PlanFacts()
    cores = engine_cores(inv) if inv.device == "cpu" else {}
    services = [
        _with_hash(
            _engine(
                inv,
                e,
                f.rdma_present,
                f.rdma_ports,
                _nic_for(e, f.engine_nics),
                f.tcp_ifaces.get(e.host),
                cores.get(e.host, {}).get((e.role, e.index)),
            )
        )
        for e in engines(inv, f.gpu_counts)
    ]
    decodes = [s for s in services if s.role == "decode"]
    prefills = [s for s in services if s.role == "prefill"]
    router = _with_hash(_router(inv, prefills, decodes))
    r_host = inv.router.host
    watch = watch_service(inv, project_name(inv), _labels(inv, "watch", r_host))
    watch = _with_hash(watch) if watch is not None else None
    proxy = _with_hash(proxy_service(inv, project_name(inv), _labels(inv, "proxy", r_host)))
    standby, ka_confs, ka_needs = ingress_plan(inv, router, proxy, f.tcp_ifaces)
    standby = tuple(_with_hash(s) for s in standby)
    keepalived = tuple(
        _with_hash(
            keepalived_service(inv, h, project_name(inv), _labels(inv, "keepalived", h), conf)
        )
        for h, conf in ka_confs.items()
    )
    every = decodes + prefills + [router, proxy] + ([watch] if watch is not None else [])
    every += [*standby, *keepalived]
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
    needs = unresolved_on(inv, f.gpu_counts) + ka_needs
    return Plan(
        deployment=inv.name,
        model=inv.model,
        served_model_name=inv.served_model_name or inv.model,
        hosts=hosts,
        stages=(tuple(decodes), tuple(prefills), (router,), (proxy,))
        + (((watch,),) if watch else ()),
        router=router,
        proxy=proxy,
        hf_token_ref=inv.secrets.hf_token,
        unresolved=tuple(line for _h, line in needs),
        unresolved_on=tuple(needs),
        device=inv.device,
        kv_cache_gib=inv.cpu.kv_cache_gib if inv.device == "cpu" else 0,
        watch=watch,
        revision=revision_of(inv.model, inv.model_revision),
        standby=standby,
        keepalived=keepalived,
        virtual_ip=inv.router.virtual_ip or "",
        keepalived_confs=ka_confs,
    )
