"""Least privilege in the rendered projects (plan/privileges.py): no-new-privileges on every
container, the capabilities each program keeps, and where the router's metrics listen."""

from __future__ import annotations

from typing import Any

import yaml

from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.plan.privileges import ENGINE_DROPPED, PROXY_CAPS
from pdboot.plan.prometheus import scrape_config
from pdboot.plan.render import render_all
from tests.unit.builders import inventory

HOSTS = {"a": "192.0.2.10", "b": "192.0.2.11"}


def _inv(**overrides: Any) -> Inventory:
    return inventory(HOSTS, ["a"], ["b"], "a", overrides=overrides)


def _services(inv: Inventory) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for text in render_all(build_plan(inv)).values():
        out.update(yaml.safe_load(text)["services"])
    return out


def test_every_container_runs_with_no_new_privileges() -> None:
    services = _services(_inv(**{"secrets.api_key": "env:K"}))
    assert set(services) == {"prefill", "decode", "router", "proxy"}
    for name, svc in services.items():
        assert svc["security_opt"] == ["no-new-privileges:true"], name


def test_each_program_keeps_only_the_capabilities_it_uses() -> None:
    services = _services(_inv())
    router, proxy = services["router"], services["proxy"]
    assert router["cap_drop"] == ["ALL"] and "cap_add" not in router
    assert proxy["cap_drop"] == ["ALL"] and proxy["cap_add"] == list(PROXY_CAPS)
    assert "NET_BIND_SERVICE" not in proxy["cap_add"]  # port 8000
    for name in ("prefill", "decode"):
        assert services[name]["cap_drop"] == list(ENGINE_DROPPED)
        assert not {"CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL"} & set(ENGINE_DROPPED)
    # a privileged public port: the proxy binds it with the one more capability
    proxy443 = _services(_inv(**{"router.port": 443}))["proxy"]
    assert "NET_BIND_SERVICE" in proxy443["cap_add"]
    # RDMA's pinned memory still has IPC_LOCK
    rdma = _services(_inv(**{"hosts.a.rdma_devices": ["mlx5_0"]}))["prefill"]
    assert rdma["cap_add"] == ["IPC_LOCK"] and "IPC_LOCK" not in rdma["cap_drop"]


def test_router_metrics_listen_where_prometheus_scrapes() -> None:
    def bind(inv: Inventory) -> tuple[str, list[str]]:
        plan = build_plan(inv)
        cmd = list(plan.router.command)
        router_job = next(
            j for j in scrape_config(plan)["scrape_configs"] if "router" in j["job_name"]
        )
        return cmd[cmd.index("--prometheus-host") + 1], router_job["static_configs"][0]["targets"]

    assert bind(_inv()) == ("192.0.2.10", ["192.0.2.10:29000"])  # the host's own address
    chosen = _inv(**{"router.metrics_bind": "10.9.0.1"})
    assert bind(chosen) == ("10.9.0.1", ["10.9.0.1:29000"])
