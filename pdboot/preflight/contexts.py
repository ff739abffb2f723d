"""Inventory -> what preflight must check on each host (pure): its roles, the GPUs each tier
needs there (device: cpu: each engine's cores and dtype), the ports pdboot binds, the probes
it sends to its peers (NIXL side channels, DP RPC ports), the engine image and model.
"""

from __future__ import annotations

from collections.abc import Sequence

from pdboot.inventory.cpu_layout import engine_dtype
from pdboot.inventory.dp import layouts
from pdboot.inventory.engines import is_auto, tier_engines
from pdboot.inventory.ingress_rules import ingress_hosts, vrrp_router_id
from pdboot.inventory.rules import advertised_address, deployment_hosts, engine_hosts
from pdboot.inventory.schema import TIERS, Inventory
from pdboot.plan.build import build_plan
from pdboot.plan.model import Plan, Service
from pdboot.plan.weights.hub import WeightsAsk, hub_endpoint
from pdboot.preflight.checks import (
    CpuNeed,
    GpuNeed,
    HostContext,
    ParseError,
    Probe,
    VrrpAsk,
    size_bytes,
)


def _gpu_needs(inv: Inventory, host: str) -> tuple[GpuNeed, ...]:
    """One need per engine; an `engines_per_host: all` tier needs at least one TP group."""
    out: list[GpuNeed] = []
    for t, tier in inv.tiers():
        if host not in tier.hosts:
            continue
        tp = tier.tensor_parallel_size
        if is_auto(tier):
            out.append(GpuNeed(t, tp, "all"))
            continue
        for e in tier_engines(t, tier, host):
            if e.dp is not None:  # local size x TP GPUs; per rank: TP of them
                what = f"{t} ({e.dp.describe()}, TP {tp} each)"
                out.append(GpuNeed(t, tp, e.gpus, what, e.dp.size, e.dp.expert_parallel))
                continue
            out.append(GpuNeed(t, tp, e.gpus, e.name if e.count > 1 else ""))
    return tuple(out)


def _probes(inv: Inventory, plan: Plan, roles: tuple[str, ...]) -> list[Probe]:
    """From a decode host: every prefill engine's side channel; from the router's host:
    every engine's HTTP port."""
    probes: list[Probe] = []
    if "decode" in roles:
        # a DP prefill: every rank's side channel on its host (base + global rank)
        for s in plan.prefill_engines:
            for port, what in _side_ports(inv, s):
                probes.append(Probe("network.side_channel", s.host, s.address, port, what))
    if "router" in roles:
        for s in plan.services():
            if s.is_engine and not s.headless:
                probes.append(Probe("network.ingress", s.host, s.address, s.port, f"{s.name} HTTP"))
    return probes


def _side_ports(inv: Inventory, s: Service, whose: str = "'s") -> list[tuple[int, str]]:
    """The NIXL side-channel ports an engine listens on, with what they are."""
    if s.side_channel_port is None or s.role not in TIERS:
        return []
    if not s.dp_role:
        return [(s.side_channel_port, f"{s.name}{whose} NIXL side channel")]
    e = tier_engines(s.role, inv.tier(s.role), s.host)[0]
    return [
        (p, f"{s.name}'s NIXL side channel (DP rank {p - s.side_channel_port})")
        for p in e.side_channel_ports
    ]


def _dp_rpc(inv: Inventory, host: str) -> tuple[list[tuple[int, str]], list[Probe]]:
    """A DP head binds its RPC port; each follower must reach it (vLLM's handshake, then
    the head's other ZMQ ports, which it picks at start)."""
    ports: list[tuple[int, str]] = []
    probes: list[Probe] = []
    for t, tier in inv.tiers():
        lay = layouts(t, tier).get(host)
        if lay is None:
            continue
        if lay.is_head:
            ports.append((lay.rpc_port, f"{t} DP RPC (head)"))
        else:
            head = advertised_address(inv.hosts[lay.head])
            probes.append(
                Probe("network.dp_rpc", lay.head, head, lay.rpc_port, f"{t} DP head's RPC port")
            )
    return ports, probes


def contexts(inv: Inventory) -> dict[str, HostContext]:
    """What each host is checked for, from the inventory and the plan (pure). An
    `engines_per_host: all` tier is checked for the ports of AUTO_ASSUMED_GPUS' engines."""
    plan = build_plan(inv)
    kv = inv.kv_transfer
    out: dict[str, HostContext] = {}
    for name in deployment_hosts(inv):
        hp = plan.hosts[name]
        roles = tuple(dict.fromkeys(s.role for s in hp.services))
        ports: list[tuple[int, str]] = []
        for s in hp.services:
            if not s.headless and s.role != "keepalived":  # VRRP binds no port
                ports.append((s.port, f"{s.name} HTTP"))
            ports += _side_ports(inv, s, "")
            if s.metrics_port is not None:
                ports.append((s.metrics_port, f"{s.role} metrics"))
            if s.nixl_telemetry_port is not None:  # taken: the engine runs, unexported
                ports.append((s.nixl_telemetry_port, f"{s.name} NIXL telemetry"))
            if s.role == "router":  # a router change starts its successor there
                ports.append((inv.router.swap_port, "swap router HTTP (loopback)"))
                ports.append((inv.router.swap_metrics_port, "swap router metrics"))
        rpc_ports, rpc_probes = _dp_rpc(inv, name)
        ports += rpc_ports
        ports += seed_ports(inv, name)
        try:
            shm = size_bytes(inv.container.shm_size)
        except ParseError:
            shm = 0
        out[name] = HostContext(
            name=name,
            roles=roles,
            req=inv.requirements,
            gpu_needs=_gpu_needs(inv, name) if inv.device != "cpu" else (),
            ports=tuple(ports),
            shm_size_bytes=shm,
            memlock=inv.container.ulimits.memlock,
            nofile=inv.container.ulimits.nofile,
            hf_cache=inv.container.hf_cache,
            image=inv.image,
            model=inv.model,
            rdma_mode=kv.rdma,
            rdma_devices=tuple(inv.hosts[name].rdma_devices),
            ucx_net_devices=kv.ucx.net_devices,
            probes=tuple(_probes(inv, plan, roles) + rpc_probes + seed_probes(inv, name)),
            peers=tuple(_peer_addresses(inv, name)),
            tiers=tuple((t, tier) for t, tier in inv.tiers() if name in tier.hosts),
            device=inv.device,
            cpu_engines=_cpu_needs(inv, hp.services),
            cpu_kv_gib=inv.cpu.kv_cache_gib,
            ucx_tls=kv.ucx.tls,
            deployment=inv.name,
            weights=weights_ask(inv, name),
            vrrp=vrrp_ask(inv, name),
            address=inv.hosts[name].advertise_address or inv.hosts[name].address,
        )
    return out


def vrrp_ask(inv: Inventory, name: str) -> VrrpAsk | None:
    """An ingress host with router.virtual_ip: what checks/vrrp.py checks there."""
    r = inv.router
    if r.virtual_ip is None or name not in ingress_hosts(inv) or r.standby is None:
        return None
    peer = r.standby if name == r.host else r.host
    iface = r.vrrp_interface or inv.hosts[name].net_interface
    addr, other = advertised_address(inv.hosts[name]), advertised_address(inv.hosts[peer])
    return VrrpAsk(r.virtual_ip, iface, vrrp_router_id(inv), addr, other)


def _cpu_needs(inv: Inventory, services: Sequence[Service]) -> tuple[CpuNeed, ...]:
    """device: cpu: each engine on the host, with its cores and dtype."""
    if inv.device != "cpu":
        return ()
    out = []
    for s in services:
        if not s.is_engine:
            continue
        tier = inv.tier("prefill" if s.role == "prefill" else "decode")
        out.append(CpuNeed(s.key, s.cpus, tier.tensor_parallel_size, engine_dtype(tier)))
    return tuple(out)


def _peer_addresses(inv: Inventory, name: str) -> list[str]:
    """The other tier's engine hosts (not this one): where this host's UCX sends KV."""
    peers = (inv.prefill.hosts if name in inv.decode.hosts else []) + (
        inv.decode.hosts if name in inv.prefill.hosts else []
    )
    return [advertised_address(inv.hosts[p]) for p in dict.fromkeys(peers) if p != name]


def _seed_host(inv: Inventory) -> str | None:
    """weights.seed first_host: the engine host that serves the weights to the others."""
    hosts = engine_hosts(inv)  # the order deploy/weights/seed.py seeds in: its first is the server
    if inv.weights.seed != "first_host" or len(hosts) < 2:
        return None
    return hosts[0]


def seed_ports(inv: Inventory, host: str) -> list[tuple[int, str]]:
    """The first engine host serves the weights on seed_port: free there."""
    if host != _seed_host(inv):
        return []
    return [(inv.weights.seed_port, "weights seed server")]


def seed_probes(inv: Inventory, host: str) -> list[Probe]:
    """Every other engine host fetches the weights from the first one's seed_port."""
    first = _seed_host(inv)
    if first is None or host == first or host not in engine_hosts(inv):
        return []
    address = advertised_address(inv.hosts[first])
    return [Probe("network.seed", first, address, inv.weights.seed_port, "weights seed server")]


def weights_ask(inv: Inventory, host: str) -> WeightsAsk | None:
    """What an engine host's weights checks ask (the hub's answer is added later)."""
    if host not in engine_hosts(inv):
        return None
    return WeightsAsk(
        model=inv.model,
        revision=inv.model_revision,
        endpoint=hub_endpoint(inv.weights.endpoint),
        stage=inv.weights.stage,
        report_lookup=host == engine_hosts(inv)[0],
    )
