"""What preflight learned about one host, typed, one optional field per check area.

Each area's ``parse(ctx, sections)`` fills its field (None: the area does not apply to the
host, or its parser failed); each area's ``evaluate(ctx, facts)`` judges from these facts
only. They stay on the host's report, so whatever comes after preflight (the RDMA choice
of ``kv_transfer.rdma: auto``, a GPU-to-NIC choice) reads them, never check messages.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdboot.preflight.checks.cpu import CpuFacts
from pdboot.preflight.checks.docker import DockerFacts
from pdboot.preflight.checks.gdr import GdrFacts
from pdboot.preflight.checks.gpu import GpuFacts
from pdboot.preflight.checks.gpu_acs import AcsFacts
from pdboot.preflight.checks.gpu_settings import GpuSettingsFacts
from pdboot.preflight.checks.host import HostSysFacts
from pdboot.preflight.checks.model import ModelAreaFacts
from pdboot.preflight.checks.network import NetworkFacts
from pdboot.preflight.checks.owners import OwnerFacts
from pdboot.preflight.checks.rdma import RdmaFacts
from pdboot.preflight.checks.route import RouteFacts
from pdboot.preflight.checks.topo import TopoFacts
from pdboot.preflight.checks.vrrp import VrrpFacts
from pdboot.preflight.checks.weights import WeightsFacts


@dataclass(frozen=True)
class HostFacts:
    gpu: GpuFacts | None = None
    gpu_settings: GpuSettingsFacts | None = None  # peer-to-peer (ACS / IOMMU), HMM
    gpu_acs: AcsFacts | None = None  # the ACS bits and IOMMU domains behind blocked P2P
    docker: DockerFacts | None = None
    rdma: RdmaFacts | None = None
    gdr: GdrFacts | None = None  # GPUDirect RDMA (judged with the RDMA area)
    route: RouteFacts | None = None  # which interface reaches the peer engines (UCX over TCP)
    host: HostSysFacts | None = None
    network: NetworkFacts | None = None
    model: ModelAreaFacts | None = None
    topo: TopoFacts | None = None  # nvidia-smi topo -m (GPU <-> NIC distances)
    weights: WeightsFacts | None = None  # hub reach, a local model path's listing
    cpu: CpuFacts | None = None  # device: cpu hosts (lscpu, /proc/cpuinfo, free)
    owners: OwnerFacts | None = None  # this deployment's containers, and each pid's container
    vrrp: VrrpFacts | None = None  # an ingress host with router.virtual_ip
