"""NIXL's own telemetry on every engine (pure): the environment that turns on the
Prometheus exporter shipped in the NIXL wheel (nixl-cu12 / nixl-cu13 1.5.x), and its port.

Names are the wheel's (tests/unit/fixtures/nixl-1.5.1-telemetry/, where they were read
from libtelemetry_exporter_prometheus_mp.so and a live exposition of the same wheel):

- ``prometheus_mp``, not ``prometheus``: a vLLM engine runs one NIXL agent per worker
  process (each tensor-parallel rank, each data-parallel rank on the host). The single-
  process exporter binds one port per process, so with one port only the first rank would
  be exported. prometheus_mp has every rank write a small store into one directory
  (NIXL_TELEMETRY_MULTIPROC_DIR, required, private, local, shared by the ranks of one
  container), elects one rank by lock to serve the port and exports every rank as its own
  series (labels pid, agent_name, hostname, and local_rank where LOCAL_RANK is set).
- The port is NIXL_TELEMETRY_PROMETHEUS_PORT; unset, it binds 0.0.0.0:9090 (Prometheus's
  own port). A port held by another process leaves the engine running and its telemetry
  silently unexported (the exporter only logs a warning), hence preflight's host.ports
  check of it (pdboot/preflight/contexts.py).
- It binds every interface (NIXL_TELEMETRY_PROMETHEUS_LOCAL unset), as the engines'
  /metrics does, so the same Prometheus reaches both.
"""

from __future__ import annotations

EXPORTER = "prometheus_mp"
# In the engine container's own /tmp (pdboot mounts nothing there): private to the
# engine, and creatable by any user the image runs as. The first rank creates it (0755 from
# the umask, which the exporter accepts). A directory it cannot create fails the NIXL agent,
# and with it the engine's start ("Failed to create telemetry exporter: prometheus_mp").
MULTIPROC_DIR = "/tmp/nixl-telemetry"  # noqa: S108 - inside the container, see above
METRICS = (  # what alert rules and dashboards may use (the fixture's exposition has them)
    "agent_errors_total",
    "agent_tx_bytes_total",
    "agent_rx_bytes_total",
    "agent_xfer_time_us",
)


def telemetry_env(port: int | None) -> dict[str, str]:
    """The engine variables that turn NIXL's exporter on at ``port`` (None: off, nothing)."""
    if port is None:
        return {}
    return {
        "NIXL_TELEMETRY_ENABLE": "y",
        "NIXL_TELEMETRY_EXPORTER": EXPORTER,
        "NIXL_TELEMETRY_MULTIPROC_DIR": MULTIPROC_DIR,
        "NIXL_TELEMETRY_PROMETHEUS_PORT": str(port),
    }
