"""Plan -> the Prometheus scrape config for one deployment (pure): every engine that serves
HTTP (vLLM's /metrics on its own port), every engine's NIXL exporter (its own port,
plan/nixl_telemetry.py), the router's metrics port (``router.standby``'s router too: a
failover should not leave Prometheus blind), and the watch service when `up` runs one.
Targets carry the labels the shipped alert rules and dashboard read: ``role`` (prefill,
decode, router, watch), ``service`` (decode@gpu-b: vLLM's own ``engine`` label is the
engine index, so pdboot's name goes in another), ``host`` and ``deployment``."""

from __future__ import annotations

from typing import Any

import yaml

from pdboot.plan.model import Plan, Service, url_host

RULES_FILE = "pdboot-watch-rules.yml"


def _target(s: Service, port: int, address: str = "") -> dict[str, Any]:
    return {
        "targets": [f"{url_host(address or s.address)}:{port}"],
        "labels": {"role": s.role, "service": s.key, "host": s.host},
    }


def scrape_config(plan: Plan, interval: str = "15s") -> dict[str, Any]:
    """A whole prometheus.yml: the jobs, and the alert rules file beside it."""
    engines = [_target(s, s.port) for s in plan.engines if not s.headless]
    jobs: list[dict[str, Any]] = [
        {"job_name": f"{plan.deployment}-vllm", "static_configs": engines},
    ]
    # NIXL's own exporter, one port per engine container (every rank behind it; followers
    # of a data-parallel tier included: each host's ranks have their own)
    nixl = [_target(s, s.nixl_telemetry_port) for s in plan.engines if s.nixl_telemetry_port]
    if nixl:
        jobs.append({"job_name": f"{plan.deployment}-nixl", "static_configs": nixl})
    if plan.router.metrics_port is not None:
        # behind the proxy the router serves on loopback; its metrics port listens on
        # router.metrics_bind (the host's own address by default)
        routers = [
            _target(
                plan.router,
                plan.router.metrics_port,
                plan.router.metrics_address or (plan.proxy or plan.router).address,
            )
        ]
        standby = plan.standby_router  # router.standby: the same port on its own address
        if standby is not None and standby.metrics_port is not None:
            routers.append(
                _target(standby, standby.metrics_port, standby.metrics_address or standby.address)
            )
        jobs.append({"job_name": f"{plan.deployment}-router", "static_configs": routers})
    if plan.watch is not None:
        jobs.append(
            {
                "job_name": f"{plan.deployment}-watch",
                "static_configs": [_target(plan.watch, plan.watch.port)],
            }
        )
    for job in jobs:
        for group in job["static_configs"]:
            group["labels"]["deployment"] = plan.deployment
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [RULES_FILE],
        "scrape_configs": jobs,
    }


def scrape_config_text(plan: Plan) -> str:
    head = (
        f"# Prometheus for pdboot deployment {plan.deployment!r} (`pdboot observability`).\n"
        f"# {RULES_FILE} (pdboot's alert rules) goes beside this file; without a watch\n"
        "# service, add the host where `pdboot watch --listen ADDR:PORT` runs as a target.\n"
    )
    return head + yaml.safe_dump(scrape_config(plan), sort_keys=False)
