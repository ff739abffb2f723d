"""The watch service's view of a standby ingress (deploy/watch/standby.py, ServiceIngress):
no SSH, so the standby's workers come from its router's metrics port and the virtual IP's
holder from this host's own addresses; the alerts are the foreground's (StandbyWatch). Fake
HTTP answers and a fake "is this address mine"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pdboot.deploy.watch.standby import ServiceIngress, StandbyWatch, metrics_workers
from pdboot.events import Event
from pdboot.inventory.load import load_inventory
from pdboot.plan.build import build_plan
from pdboot.plan.watch.events import WatchActionTaken
from pdboot.plan.watch.metrics import WatchMetrics
from pdboot.transport.http import HttpAnswer

PLAN = build_plan(load_inventory(Path(__file__).parents[1] / "inventories" / "standby.yaml"))
ENGINES = [s.url.rstrip("/") for s in PLAN.engines if not s.headless]


class World:
    def __init__(self) -> None:
        self.standby_lists = list(ENGINES)
        self.vip_answers = True

    def fetch(self, url: str, **_: Any) -> HttpAnswer:
        if url.endswith("/workers"):
            body = {"workers": [{"url": u, "worker_type": "decode"} for u in ENGINES]}
            return HttpAnswer(200, json.dumps(body))
        if url.endswith("/metrics"):
            lines = [f'vllm_router_worker_health{{worker="{u}"}} 1' for u in self.standby_lists]
            return HttpAnswer(200, "\n".join(lines) + "\n")
        if url.endswith("/health"):
            return HttpAnswer(200 if self.vip_answers else 0, "ok")
        return HttpAnswer(404, "")


def test_the_metrics_name_the_standby_routers_workers() -> None:
    text = 'vllm_router_worker_health{worker="http://10.0.0.2:8200/"} 1\nother 1\n'
    assert metrics_workers(text) == {"http://10.0.0.2:8200"}


def test_the_service_alerts_address_moved_and_standby_out_of_step() -> None:
    world = World()
    mine = {"yes": True}
    probe = ServiceIngress(PLAN, world.fetch, {}, own=lambda _a: mine["yes"])
    events: list[Event] = []
    watch = StandbyWatch(PLAN, probe, events.append, WatchMetrics())
    watch()
    assert events == [] and watch.holder == PLAN.router.host
    mine["yes"] = False  # keepalived moved it: the standby answers on it
    world.standby_lists = ENGINES[:-1]  # and its router missed a registration
    watch()
    faults = {e.fault: e.reason for e in events if isinstance(e, WatchActionTaken)}
    assert PLAN.standby_router is not None
    assert faults["address_moved"].endswith(f"to {PLAN.standby_router.host}")
    assert f"missing {ENGINES[-1]}" in faults["standby_out_of_step"]
    assert (
        watch.metrics.value(
            "pdboot_watch_alerts_total", PLAN.standby_router.key, "ingress", "address_moved"
        )
        == 1
    )
