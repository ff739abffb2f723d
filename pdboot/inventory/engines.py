"""Several engines per host: which GPUs each engine of a tier gets, and its ports (pure).

A tier's engines on one host come from three forms (see README "Several engines per host"):

- ``gpus: all`` or a flat ``gpus: [0, 1]`` without ``engines_per_host``: ONE engine (the
  inventories written before engines per host render exactly as they did);
- ``engines_per_host: N``: N engines, each taking the next ``tensor_parallel_size`` GPUs
  of the tier's pool (a flat ``gpus`` list, or the host's GPUs counted from 0);
- ``gpus: [[0, 1], [2, 3]]``: one engine per explicit group;
- ``engines_per_host: all``: as many engines as the GPUs preflight finds allow (``gpus``
  a flat pool, or every GPU of the host). Until preflight has counted them, a plan assumes
  ``AUTO_ASSUMED_GPUS`` and says so (``Plan.unresolved``).

Naming and ports, ONE scheme: engine ``i`` (0-based, in GPU order) of a tier on a host is
named ``<role>`` for i = 0 and ``<role>-<i>`` otherwise (``prefill``, ``prefill-1``, ...;
so adding engines never renames, re-ports or recreates engine 0), and listens on

    HTTP          tier.port              + i * ENGINE_PORT_STRIDE
    side channel  tier.side_channel_port + i * ENGINE_PORT_STRIDE

NIXL's own telemetry (its prometheus_mp exporter, on unless kv_transfer.nixl_telemetry is
false) listens on the engine's HTTP port + NIXL_TELEMETRY_OFFSET, one port
for all the engine's ranks (pdboot/plan/nixl_telemetry.py); never on 9090, NIXL's default and
Prometheus's own port.

An engine's NIXL side channel occupies ``VLLM_NIXL_SIDE_CHANNEL_PORT + data_parallel_index``
for each of its data-parallel ranks (one port for all its TP ranks), so the stride leaves
room for up to ENGINE_PORT_STRIDE data-parallel ranks; the load-time rules check the whole
span of every engine against every other port on the host.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pdboot.inventory.dp import (
    DPLayout,
    dp_router_rules,
    dp_tier_rules,
    layouts,
    side_channel_range,
)
from pdboot.inventory.schema import Inventory, Tier, TierName

ENGINE_PORT_STRIDE = 10
NIXL_TELEMETRY_OFFSET = 1000  # HTTP 8200 -> NIXL telemetry 9200
NIXL_DEFAULT_PORT = 9090  # NIXL's exporter default, and Prometheus's own port
AUTO_ASSUMED_GPUS = 8  # an `engines_per_host: all` host before preflight counted its GPUs

Gpus = Literal["all"] | tuple[int, ...]
Path = tuple[str | int, ...]


@dataclass(frozen=True)
class EngineSpec:
    """One engine of a tier on a host."""

    role: TierName
    host: str
    index: int  # 0-based on this host, in GPU order
    count: int  # engines of this tier on this host
    gpus: Gpus
    port: int
    side_channel_port: int
    side_channel_span: int = 1  # data-parallel ranks: side channel ports it occupies
    dp: DPLayout | None = None  # its part of a data-parallel tier (pdboot/inventory/dp.py)

    @property
    def side_channel_ports(self) -> range:
        """The ports its ranks listen on: base + global rank (VLLM_NIXL_SIDE_CHANNEL_PORT
        stays the base; vLLM adds the rank)."""
        first = self.side_channel_port + (self.dp.start if self.dp is not None else 0)
        return range(first, first + self.side_channel_span)

    @property
    def name(self) -> str:
        return engine_name(self.role, self.index)

    @property
    def key(self) -> str:
        return f"{self.name}@{self.host}"


@dataclass(frozen=True)
class EngineNic:
    """The HCA port(s) nearest an engine's GPUs, as preflight chose them."""

    ports: tuple[str, ...]  # device:port, UCX_NET_DEVICES' form
    link: str | None  # PIX .. SYS: the distance to the group's farthest GPU
    gpus: tuple[int, ...] = ()
    # (GPU PCI address, NIC PCI address) per TP rank: each rank's own nearest NIC
    # (preflight/checks/nic_ranks.py); () for TP 1 or when an address is unknown
    pcie_map: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        on = ",".join(map(str, self.gpus))
        return f"{','.join(self.ports)} ({self.link or '?'}, nearest GPUs {on})"


def engine_name(role: str, index: int) -> str:
    return role if index == 0 else f"{role}-{index}"


def engine_ports(tier: Tier, index: int) -> tuple[int, int]:
    """(HTTP port, NIXL side channel base) of engine ``index`` of the tier on a host."""
    off = index * ENGINE_PORT_STRIDE
    return tier.port + off, tier.side_channel_port + off


def nixl_telemetry_port(inv: Inventory, http_port: int) -> int | None:
    """Where an engine's NIXL exporter listens (None: kv_transfer.nixl_telemetry off). The
    stride (10) keeps engines apart; 9090 moves 5 up, inside the stride's gap."""
    if not inv.kv_transfer.nixl_telemetry:
        return None
    port = http_port + NIXL_TELEMETRY_OFFSET
    return port + 5 if port == NIXL_DEFAULT_PORT else port


def is_auto(tier: Tier) -> bool:
    """Does the tier's engine count follow the GPUs preflight finds?"""
    return tier.engines_per_host == "all" and not isinstance(tier.gpus, list)


def _chunks(pool: list[int], size: int) -> list[Gpus]:
    return [tuple(pool[i : i + size]) for i in range(0, len(pool) - size + 1, size)]


def tier_groups(tier: Tier, gpu_count: int | None = None) -> list[Gpus]:
    """The GPU group of each engine of the tier on one host. ``gpu_count``: how many GPUs
    preflight found there (used only by ``engines_per_host: all`` without a pool; None
    assumes AUTO_ASSUMED_GPUS)."""
    tp, g, n = tier.tensor_parallel_size, tier.gpus, tier.engines_per_host
    if isinstance(g, list) and g and isinstance(g[0], list):
        return [tuple(grp) for grp in g if isinstance(grp, list)]
    c = tier.cpus  # device: cpu; one engine per core list (pdboot/inventory/cpu_layout.py)
    if isinstance(c, list) and c and isinstance(c[0], list):
        return [() for _ in c]
    flat = [x for x in g if isinstance(x, int)] if isinstance(g, list) else None
    if n is None:
        return ["all"] if flat is None else [tuple(flat)]
    if flat is not None:
        return _chunks(flat, tp)
    if n == "all":
        count = AUTO_ASSUMED_GPUS if gpu_count is None else gpu_count
        return _chunks(list(range(count)), tp)
    return _chunks(list(range(n * tp)), tp)


def tier_engines(
    role: TierName, tier: Tier, host: str, gpu_count: int | None = None
) -> list[EngineSpec]:
    if tier.data_parallel is not None:
        return _dp_engines(role, tier, host)
    groups = tier_groups(tier, gpu_count)
    out = []
    for i, grp in enumerate(groups):
        port, side = engine_ports(tier, i)
        out.append(EngineSpec(role, host, i, len(groups), grp, port, side))
    return out


def _dp_engines(role: TierName, tier: Tier, host: str) -> list[EngineSpec]:
    """A DP tier: one engine per host (the head, or the host's headless ranks) on
    local size x TP GPUs."""
    lay = layouts(role, tier).get(host)
    if lay is None:
        return []
    g = tier.gpus
    need = lay.local * tier.tensor_parallel_size
    gpus: Gpus = (
        tuple(x for x in g if isinstance(x, int)) if isinstance(g, list) else tuple(range(need))
    )
    return [EngineSpec(role, host, 0, 1, gpus, tier.port, tier.side_channel_port, lay.local, lay)]


def engines(inv: Inventory, gpu_counts: Mapping[str, int] | None = None) -> list[EngineSpec]:
    """Every engine: the decode tier's, then the prefill tier's (the plan's grouping), host
    by host."""
    counts = gpu_counts or {}
    out: list[EngineSpec] = []
    for role, tier in inv.tiers()[::-1]:
        for h in tier.hosts:
            out += tier_engines(role, tier, h, counts.get(h))
    return out


def unresolved_on(
    inv: Inventory, gpu_counts: Mapping[str, int] | None = None
) -> list[tuple[str, str]]:
    """Hosts whose engine count needs preflight's GPU count: (host, the line in words);
    empty: none."""
    counts = gpu_counts or {}
    out = []
    for role, tier in inv.tiers():
        if is_auto(tier):
            out += [
                (
                    h,
                    f"{role} on {h}: engines_per_host: all needs preflight's GPU count "
                    f"(assumed {AUTO_ASSUMED_GPUS} GPUs here)",
                )
                for h in tier.hosts
                if h not in counts
            ]
    return out


# --------------------------------------------------------------------------- rules


def _group_rules(tname: str, tier: Tier) -> list[tuple[Path, str]]:
    out: list[tuple[Path, str]] = []
    tp, g, n = tier.tensor_parallel_size, tier.gpus, tier.engines_per_host
    if not isinstance(g, list):
        return out
    if g and isinstance(g[0], list):
        groups = [grp for grp in g if isinstance(grp, list)]
        for i, grp in enumerate(groups):
            if len(grp) != tp:
                out.append(
                    (
                        (tname, "gpus", i),
                        f"group {grp} has {len(grp)} GPU(s) but tensor_parallel_size is {tp}; "
                        "each engine takes exactly one GPU per rank",
                    )
                )
        seen: dict[int, int] = {}
        for i, grp in enumerate(groups):
            for x in grp:
                if x in seen and seen[x] != i:
                    out.append(((tname, "gpus", i), f"GPU {x} is also in group {seen[x]}"))
                seen.setdefault(x, i)
        if isinstance(n, int) and n != len(groups):
            out.append(
                (
                    (tname, "engines_per_host"),
                    f"{n} engine(s) per host but {len(groups)} GPU group(s) listed",
                )
            )
        return out
    if n is None and len(g) != tp:
        out.append(
            (
                (tname, "gpus"),
                f"{len(g)} GPU(s) listed but tensor_parallel_size is "
                f"{tp}; list exactly one GPU per rank",
            )
        )
    elif isinstance(n, int) and len(g) != n * tp:
        out.append(
            (
                (tname, "gpus"),
                f"{len(g)} GPU(s) listed for {n} engine(s) of tensor_parallel_size {tp}: "
                f"list exactly {n * tp}",
            )
        )
    elif n == "all" and len(g) % tp:
        out.append(
            (
                (tname, "gpus"),
                f"{len(g)} GPU(s) listed do not split into groups of tensor_parallel_size {tp}",
            )
        )
    return out


def _gpu_sets(inv: Inventory) -> dict[str, list[tuple[str, Literal["all"] | set[int]]]]:
    out: dict[str, list[tuple[str, Literal["all"] | set[int]]]] = {}
    for tname, tier in inv.tiers():
        for h in dict.fromkeys(tier.hosts):
            groups = [e.gpus for e in tier_engines(tname, tier, h)]
            used: Literal["all"] | set[int] = (
                "all"
                if any(grp == "all" for grp in groups) or is_auto(tier)
                else {x for grp in groups if grp != "all" for x in grp}
            )
            out.setdefault(h, []).append((tname, used))
    return out


def _shared_gpu_rules(inv: Inventory) -> list[tuple[Path, str]]:
    out: list[tuple[Path, str]] = []
    for h, claims in _gpu_sets(inv).items():
        if len(claims) < 2:
            continue
        (_, a), (_, b) = claims[0], claims[1]
        if a == "all" or b == "all":
            out.append(
                (
                    ("decode", "gpus"),
                    f"prefill and decode share host {h!r}: give each tier its own GPU "
                    "indices instead of 'all' (a flat gpus list is the pool engines_per_host "
                    "splits)",
                )
            )
        elif a & b:
            out.append(
                (
                    ("decode", "gpus"),
                    f"prefill and decode share host {h!r} and GPU(s) {sorted(a & b)}",
                )
            )
    return out


def _port_rules(inv: Inventory) -> list[tuple[Path, str]]:
    out: list[tuple[Path, str]] = []
    taken: dict[str, dict[int, str]] = {}

    def claim(host: str, port: int, what: str, path: Path) -> None:
        mine = taken.setdefault(host, {})
        if not 1 <= port <= 65535:
            out.append((path, f"{what} would listen on port {port}, past 65535"))
        elif port in mine:
            out.append((path, f"port {port} on host {host!r} is already used by {mine[port]}"))
        else:
            mine[port] = what

    for tname, tier in inv.tiers():
        for h in dict.fromkeys(tier.hosts):  # a host listed twice is reported elsewhere
            for e in tier_engines(tname, tier, h):
                before = len(out)
                if e.dp is None or e.dp.is_head:  # headless ranks serve no HTTP
                    claim(h, e.port, f"{e.name} HTTP", (tname, "port"))
                http_clash = len(out) > before
                if e.dp is not None and e.dp.is_head:
                    claim(h, e.dp.rpc_port, f"{e.name} DP RPC", (tname, "data_parallel"))
                for p in e.side_channel_ports:
                    claim(h, p, f"{e.name} NIXL side channel", (tname, "side_channel_port"))
                tel = nixl_telemetry_port(inv, e.port)
                if tel is not None and not http_clash:  # one message for one mistake
                    what = f"{e.name} NIXL telemetry (port + {NIXL_TELEMETRY_OFFSET})"
                    claim(h, tel, what, (tname, "port"))
    r = inv.router
    claim(r.host, r.port, "the proxy (public endpoint)", ("router", "port"))
    claim(r.host, r.internal_port, "router HTTP (loopback)", ("router", "internal_port"))
    claim(r.host, r.metrics_port, "router metrics", ("router", "metrics_port"))
    claim(r.host, r.swap_port, "the swap router's HTTP (loopback)", ("router", "swap_port"))
    claim(r.host, r.swap_metrics_port, "the swap router's metrics", ("router", "swap_metrics_port"))
    # The front-door proxy (the router's host) claims its port here, after the router's.
    for host, port, what, path in _service_listeners(inv):
        claim(host, port, what, path)
    return out


def _service_listeners(inv: Inventory) -> list[tuple[str, int, str, Path]]:
    """pdboot's listeners beside the engines and the router: the standby ingress (the
    router's ports on router.standby), the watch service (on the
    router host, when `up` runs it: watch.image) and the weights seed (the first engine
    host serves the others while engines of an earlier roll may still run there)."""
    out: list[tuple[str, int, str, Path]] = []
    if inv.watch is not None and inv.watch.image is not None:
        out.append((inv.router.host, inv.watch.port, "the watch service", ("watch", "port")))
    r = inv.router
    if r.standby is not None and r.standby != r.host:  # the standby ingress: the same ports
        for port, what, key in (
            (r.port, "the standby proxy (public endpoint)", "port"),
            (r.internal_port, "the standby router's HTTP (loopback)", "internal_port"),
            (r.metrics_port, "the standby router's metrics", "metrics_port"),
            (r.swap_port, "the standby's swap router HTTP (loopback)", "swap_port"),
            (r.swap_metrics_port, "the standby's swap router metrics", "swap_metrics_port"),
        ):
            out.append((r.standby, port, what, ("router", key)))
    w = inv.weights
    hosts = list(dict.fromkeys(inv.prefill.hosts + inv.decode.hosts))
    if w.stage and w.seed == "first_host" and len(hosts) > 1:
        out.append((hosts[0], w.seed_port, "the weights seed", ("weights", "seed_port")))
    return out


def _dp_range_rules(inv: Inventory) -> list[tuple[Path, str]]:
    """Tiers sharing a host: a DP tier's whole side-channel range (base .. base + size - 1,
    global ranks) must miss the other tier's side channels there."""
    out: list[tuple[Path, str]] = []
    tiers = inv.tiers()
    for (a, ta), (b, tb) in (tiers, tiers[::-1]):
        if ta.data_parallel is None:
            continue
        span = set(side_channel_range(ta))
        for h in dict.fromkeys(ta.hosts):
            if h not in tb.hosts:
                continue
            theirs = {p for e in tier_engines(b, tb, h) for p in e.side_channel_ports}
            if tb.data_parallel is not None:
                theirs |= set(side_channel_range(tb))
            both = sorted(span & theirs)
            if both and (a == "decode" or tb.data_parallel is None):
                out.append(
                    (
                        (a, "side_channel_port"),
                        f"{a} side channels {min(span)}-{max(span)} (one per DP rank) overlap "
                        f"{b}'s on shared host {h!r} at port(s) {both[:4]}",
                    )
                )
    return out


def engine_rules(inv: Inventory) -> list[tuple[Path, str]]:
    """Load-time rules of engines per host: groups TP-sized and disjoint, tiers sharing a
    host share no GPU, no two listeners on one port of a host (router included)."""
    if inv.device == "cpu":  # no GPUs: cores are cpu_layout.py's (which refuses DP)
        dp = inv.prefill.data_parallel or inv.decode.data_parallel
        return [] if dp is not None else _port_rules(inv)
    out: list[tuple[Path, str]] = []
    for tname, tier in inv.tiers():
        if tier.data_parallel is None:
            out += _group_rules(tname, tier)
    out += dp_tier_rules(inv) + _dp_range_rules(inv) + dp_router_rules(inv)
    return out + _shared_gpu_rules(inv) + _port_rules(inv)
