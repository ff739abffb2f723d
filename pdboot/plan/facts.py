"""What the plan takes from the hosts: the facts preflight found (or `up` recorded on each
host), as one typed value. ``PlanFacts()`` (no facts) is a dry run: `render`, `export`, the
tests. preflight/findings.py makes it from a preflight run or from the hosts' records."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pdboot.inventory.engines import EngineNic

# where the facts come from: this run's preflight, or the records an earlier `up` left on the
# hosts (only a preflight's facts are recorded again)
Source = Literal["preflight", "recorded"]


@dataclass(frozen=True)
class PlanFacts:
    """Per host (host name -> fact).

    ``rdma_present``: whether preflight found usable RDMA devices (read when
    kv_transfer.rdma is `auto`); None: not asked (a dry run). ``rdma_ports``: the
    ``device:port`` names found ACTIVE (UCX_NET_DEVICES when the inventory declares no
    rdma_devices). ``tcp_ifaces``: the interface(s) that reach the peer engine hosts
    (UCX_NET_DEVICES when RDMA is off). ``engine_nics``: per engine name, the port(s) nearest
    the engine's GPUs (preflight's topo choice, or its record). ``gpu_counts``: the GPUs
    preflight found (``engines_per_host: all``). ``rdma_gbps``: the fastest ACTIVE port's rate
    (`up`'s KV speed check reads it; the plan does not). ``source``: None for a dry run."""

    rdma_present: Mapping[str, bool] | None = None
    rdma_ports: Mapping[str, Sequence[str]] = field(default_factory=dict)
    tcp_ifaces: Mapping[str, Sequence[str]] = field(default_factory=dict)
    engine_nics: Mapping[str, Mapping[str, EngineNic]] = field(default_factory=dict)
    gpu_counts: Mapping[str, int] = field(default_factory=dict)
    rdma_gbps: Mapping[str, float] = field(default_factory=dict)
    source: Source | None = None
