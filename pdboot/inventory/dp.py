"""Data-parallel tiers: one vLLM engine whose ranks span the tier's hosts (pure).

The form is vLLM's internal-LB multi-node data parallelism (docs/data-parallel.md): the
tier's first host is the head (`vllm serve` with its API server, ranks 0..L-1, the RPC
handshake port); every other host runs `--headless` ranks K..K+L-1 that connect to the
head and serve no HTTP. Each rank's NIXL side channel is VLLM_NIXL_SIDE_CHANNEL_PORT + its
GLOBAL rank on its own host, so a tier's side channels span base .. base + size - 1.

This mode is for MoE models (`expert_parallel: true` shards the experts over DP x TP);
a dense model's DP ranks are independent replicas, which engines_per_host runs more simply.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdboot.inventory.schema import Inventory, Tier

# Distinct per tier so that prefill and decode heads may share a host (the NeMo-style
# defaults issue 10 names; vLLM's own default is 29550 for every engine).
DEFAULT_RPC_PORT = {"prefill": 13345, "decode": 13346}

Path = tuple[str | int, ...]


@dataclass(frozen=True)
class DPLayout:
    """One host's part of a data-parallel engine."""

    size: int  # ranks in all
    local: int  # ranks on this host
    start: int  # the first global rank on this host
    head: str  # the head's host name
    rpc_port: int
    expert_parallel: bool
    is_head: bool

    @property
    def ranks(self) -> range:
        return range(self.start, self.start + self.local)

    def describe(self) -> str:
        last = self.start + self.local - 1
        ranks = f"rank {self.start}" if self.local == 1 else f"ranks {self.start}-{last}"
        return f"{ranks} of {self.size}" + (" (head)" if self.is_head else " (headless)")


def rpc_port(role: str, tier: Tier) -> int:
    dp = tier.data_parallel
    if dp is not None and dp.rpc_port is not None:
        return dp.rpc_port
    return DEFAULT_RPC_PORT.get(role, DEFAULT_RPC_PORT["prefill"])


def local_sizes(tier: Tier) -> tuple[dict[str, int], str | None]:
    """Ranks per host (a best guess when the inventory is inconsistent) and what is wrong
    with it, if anything."""
    dp = tier.data_parallel
    hosts = list(dict.fromkeys(tier.hosts))
    if dp is None:
        return {h: 1 for h in hosts}, None
    n, tp, g = dp.size, tier.tensor_parallel_size, tier.gpus
    flat = isinstance(g, list) and all(isinstance(x, int) for x in g)
    if isinstance(dp.size_local, dict):
        sizes = {h: dp.size_local.get(h, 0) for h in hosts}
        extra = sorted(set(dp.size_local) - set(hosts))
        if extra or 0 in sizes.values():
            missing = [h for h, v in sizes.items() if v == 0]
            return {h: max(v, 1) for h, v in sizes.items()}, (
                "size_local must name exactly the tier's hosts"
                + (f"; missing {', '.join(missing)}" if missing else "")
                + (f"; not in the tier: {', '.join(extra)}" if extra else "")
            )
    elif dp.size_local is not None:
        sizes = {h: dp.size_local for h in hosts}
    elif flat and isinstance(g, list):
        per = max(len(g) // tp, 1)
        sizes = {h: per for h in hosts}
    else:
        per = max(n // len(hosts), 1)
        sizes = {h: per for h in hosts}
        if n % len(hosts):
            return sizes, (
                f"size {n} does not split evenly over {len(hosts)} host(s); "
                "give size_local per host"
            )
    total = sum(sizes.values())
    if total != n:
        shown = ", ".join(f"{h}: {v}" for h, v in sizes.items())
        return sizes, f"local sizes add up to {total} ({shown}), not size {n} (vLLM requires it)"
    return sizes, None


def layouts(role: str, tier: Tier) -> dict[str, DPLayout]:
    """Host -> its part of the tier's DP engine, hosts in the tier's order (head first)."""
    dp = tier.data_parallel
    if dp is None:
        return {}
    sizes, _ = local_sizes(tier)
    out: dict[str, DPLayout] = {}
    start = 0
    hosts = list(sizes)
    for h in hosts:
        out[h] = DPLayout(
            dp.size,
            sizes[h],
            start,
            hosts[0],
            rpc_port(role, tier),
            dp.expert_parallel,
            h == hosts[0],
        )
        start += sizes[h]
    return out


def side_channel_range(tier: Tier) -> range:
    """The ports a DP tier's side channels may use on any of its hosts (global ranks)."""
    n = tier.data_parallel.size if tier.data_parallel is not None else 1
    return range(tier.side_channel_port, tier.side_channel_port + n)


# --------------------------------------------------------------------------- rules


def _tier_rules(tname: str, tier: Tier) -> list[tuple[Path, str]]:
    out: list[tuple[Path, str]] = []
    if tier.data_parallel is None:
        return out
    here: Path = (tname, "data_parallel")
    if tier.engines_per_host is not None:
        out.append(
            (
                (tname, "engines_per_host"),
                "engines_per_host and data_parallel exclude each other: data_parallel runs ONE "
                "engine over the tier's hosts; for independent engines drop data_parallel",
            )
        )
    g = tier.gpus
    if isinstance(g, list) and g and isinstance(g[0], list):
        out.append(((tname, "gpus"), "a data_parallel tier takes 'all' or one flat GPU list"))
        return out
    sizes, problem = local_sizes(tier)
    if problem is not None:
        out.append(((*here, "size_local"), problem))
    tp = tier.tensor_parallel_size
    if isinstance(g, list):
        bad = sorted({v for v in sizes.values() if v * tp != len(g)})
        if bad:
            out.append(
                (
                    (tname, "gpus"),
                    f"{len(g)} GPU(s) listed but a host runs {bad[0]} rank(s) of "
                    f"tensor_parallel_size {tp}: list exactly {bad[0] * tp} (or use 'all')",
                )
            )
    return out


def dp_tier_rules(inv: Inventory) -> list[tuple[Path, str]]:
    """Load-time rules of each data-parallel tier (vLLM's: local sizes add up to the size;
    one RPC port per tier). Side-channel ranges on shared hosts: engines.engine_rules."""
    out: list[tuple[Path, str]] = []
    for tname, tier in inv.tiers():
        out += _tier_rules(tname, tier)
    return out


def dp_router_rules(inv: Inventory) -> list[tuple[Path, str]]:
    """DP-aware routing needs a data-parallel tier."""
    no_dp = inv.prefill.data_parallel is None and inv.decode.data_parallel is None
    if inv.router.dp_aware and no_dp:
        return [(("router", "dp_aware"), "DP-aware routing needs a tier with data_parallel")]
    return []


def router_dp_size(inv: Inventory) -> int:
    """--intra-node-data-parallel-size: one value for all workers; vllm-router 0.1.17 reads
    each head's real rank count from its /metrics engine labels and falls back to this."""
    return max(
        t.data_parallel.size for t in (inv.prefill, inv.decode) if t.data_parallel is not None
    )
