"""Weights checks, before anything is pulled: the hub knows the model and revision and
lets us in (asked once, from here: transport/hub.py), each engine host reaches the hub, its
HF cache's disk has room for the commit's files, and a local model path is complete on
every host (the same on every host is judged across hosts: `sameness`)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdboot.plan.weights.hub import HubProblem, Resolution, host_port
from pdboot.plan.weights.local import Listing, differing, listing_command, missing, parse_listing
from pdboot.preflight.checks import CheckResult, Command, HostContext, Section, gib, human_bytes

if TYPE_CHECKING:
    from pdboot.preflight.checks.facts import HostFacts

REACH_TIMEOUT_S = 5
DISK_MARGIN = 1.05  # the client's temporary files and the cache's own bookkeeping


def reach_command(endpoint: str) -> str:
    host, port = host_port(endpoint)
    probe = f"exec 3<>/dev/tcp/{host}/{port}"
    return f"timeout {REACH_TIMEOUT_S} bash -c {shlex.quote(probe)} && echo reachable"


def commands(ctx: HostContext) -> list[Command]:
    w = ctx.weights
    if not ctx.gpu_host or w is None:
        return []
    if w.local:
        return [Command("weights_local", listing_command(w.model), "weights")]
    if not w.stage:
        return []
    return [Command("hub_reach", reach_command(w.endpoint), "weights")]


@dataclass(frozen=True)
class WeightsFacts:
    reach: Section | None = None
    listing: Listing | None = None
    listing_section: Section | None = None


def parse(ctx: HostContext, s: Mapping[str, Section]) -> WeightsFacts | None:
    if ctx.weights is None or not ctx.gpu_host:
        return None
    local = s.get("weights_local")
    listing = parse_listing(local.output) if local is not None and local.rc == 0 else None
    return WeightsFacts(s.get("hub_reach"), listing, local)


def evaluate(ctx: HostContext, facts: HostFacts) -> list[CheckResult]:
    w, f = ctx.weights, facts.weights
    if w is None or f is None:
        return []
    if w.local:
        return [_local(w.model, f)]
    if not w.stage:
        return []
    out: list[CheckResult] = []
    if w.report_lookup:
        out.append(_lookup(w.lookup))
    out.append(_reach(w.endpoint, f.reach))
    if isinstance(w.lookup, Resolution):
        disk = facts.host.disk if facts.host is not None else None
        if disk is not None:
            out.append(_disk(ctx.hf_cache, disk.hf.avail_kib * 1024, disk.hf.mounted_on, w.lookup))
    return out


def _lookup(lookup: Resolution | HubProblem | None) -> CheckResult:
    if lookup is None:
        return CheckResult("weights.revision", "fail", "the hub was not asked", "a pdboot bug")
    if isinstance(lookup, HubProblem):
        return CheckResult("weights.revision", "fail", lookup.message, lookup.fix)
    return CheckResult(
        "weights.revision",
        "pass",
        f"{lookup.repo}@{lookup.revision} is commit {lookup.commit[:12]} "
        f"({len(lookup.files)} files, {human_bytes(lookup.size)})",
    )


def _reach(endpoint: str, s: Section | None) -> CheckResult:
    host, port = host_port(endpoint)
    if s is not None and s.rc == 0 and "reachable" in s.output:
        return CheckResult("weights.hub_reach", "pass", f"reaches the hub at {host}:{port}")
    return CheckResult(
        "weights.hub_reach",
        "fail",
        f"cannot open a TCP connection to the hub at {host}:{port} from this host "
        f"(within {REACH_TIMEOUT_S}s)",
        "allow this host out to the hub (proxy, firewall), or set weights.endpoint "
        "(HF_ENDPOINT) to a mirror it reaches, or weights.seed: first_host",
    )


def _disk(hf_cache: str, free: int, mount: str, res: Resolution) -> CheckResult:
    need = int(res.size * DISK_MARGIN)
    msg = f"HF cache {hf_cache}: {gib(free)} free on {mount}, {res.repo} needs {gib(need)}"
    if free < need:
        return CheckResult(
            "weights.disk",
            "fail",
            msg,
            f"free space on {mount}, or point container.hf_cache at a larger disk",
        )
    return CheckResult("weights.disk", "pass", msg)


def _local(path: str, f: WeightsFacts) -> CheckResult:
    if f.listing is None:
        s = f.listing_section
        why = s.first_lines() if s is not None else "not listed"
        return CheckResult(
            "weights.local",
            "fail",
            f"model path {path} is not readable here: {why}",
            "copy the model to the same absolute path on every engine host",
        )
    lacks = missing(f.listing)
    if lacks:
        return CheckResult(
            "weights.local",
            "fail",
            f"model path {path} is incomplete: missing {', '.join(lacks[:6])}",
            "copy the whole checkpoint (config, tokenizer, every shard) to this host",
        )
    total = sum(f.listing.sizes.get(s, 0) for s in f.listing.shards)
    return CheckResult(
        "weights.local",
        "pass",
        f"model path {path}: {len(f.listing.shards)} shard(s), {human_bytes(total)}",
    )


def sameness(listings: Mapping[str, Listing]) -> dict[str, CheckResult]:
    """Across engine hosts: a local model path must be the same checkpoint everywhere."""
    out: dict[str, CheckResult] = {}
    for host, why in differing(listings).items():
        out[host] = CheckResult(
            "weights.same",
            "fail",
            f"model path on {host} {why}",
            "copy the checkpoint from one host to the others (rsync -a --checksum)",
        )
    return out
