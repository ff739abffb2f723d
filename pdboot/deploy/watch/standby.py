"""`pdboot watch` with a standby ingress (docs/ingress-standby.md): each round, what the
standby needed and who holds the virtual IP, then the alerts plan/watch/ingress.py decides
("standby out of step", "address moved"), raised the same way by both ways watch runs:

- ``SshIngress``, the foreground command (SSH to both ingress hosts): after watch made the
  router host's worker list true, the standby router's list is made equal to it (the worker
  APIs are on each ingress host's loopback, router_admin.py), and the holder is read with ``ip``.
- ``ServiceIngress``, the watch service beside the router (no SSH): it cannot change the
  standby's list, so it compares it, as the standby router's metrics port lists its workers
  (``vllm_router_worker_health{worker=...}``), with the router host's list; the holder is
  this host when the virtual IP is one of its own addresses (host networking), else the
  standby when the address answers /health.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Protocol

from pdboot.deploy.ingress_status import vip_holders
from pdboot.deploy.router_api import RouterApiError, RouterWorkerApi
from pdboot.events import Emit
from pdboot.plan.degraded import engine_url
from pdboot.plan.model import Plan, url_host
from pdboot.plan.watch.events import WatchActionTaken
from pdboot.plan.watch.ingress import IngressRound, ingress_alerts
from pdboot.plan.watch.metrics import WatchMetrics
from pdboot.transport.hosts import Hosts
from pdboot.transport.http import HttpFn
from pdboot.verify.exposition import parse_exposition

log = logging.getLogger(__name__)


class IngressProbe(Protocol):
    def holders(self) -> tuple[str, ...]:
        """The ingress hosts that hold the virtual IP now."""
        ...

    def standby(self, act: bool) -> tuple[tuple[str, ...], str]:
        """(what the standby's list needed, why it could not be read or changed); ``act``
        False: another run holds the deployment, change nothing."""
        ...


class StandbyWatch:
    """One round's ingress alerts (Watcher.round calls it last), from either probe."""

    def __init__(self, plan: Plan, probe: IngressProbe, emit: Emit, metrics: WatchMetrics) -> None:
        router = plan.standby_router
        if router is None:
            raise ValueError("no router.standby in this plan")
        self.plan, self.probe, self.emit, self.metrics = plan, probe, emit, metrics
        self.key = router.key
        self.holder = ""

    def __call__(self, act: bool = True) -> None:
        changes, error = self.probe.standby(act)
        holders = self.probe.holders() if self.plan.keepalived else ()
        seen = IngressRound(holders, changes, error)
        self.holder, alerts = ingress_alerts(self.holder, seen, self.plan.virtual_ip)
        for fault, reason in alerts:
            log.error("alert %s (%s): %s", self.key, fault, reason)
            self.metrics.inc("pdboot_watch_alerts_total", self.key, "ingress", fault)
            self.emit(WatchActionTaken("alert", self.key, "ingress", fault, reason, False))


class SshIngress:
    """The foreground watch's probe: over the ingress hosts' SSH connections."""

    def __init__(
        self, plan: Plan, hosts: Hosts, admins: tuple[HttpFn, HttpFn], headers: dict[str, str]
    ) -> None:
        """``admins``: the admin channels (router_admin.AdminFetch) of the router host's router and
        of the standby's, which the watch run opens once and closes."""
        router = plan.standby_router
        assert router is not None
        self.plan, self.hosts = plan, hosts
        model = plan.served_model_name
        self.home = RouterWorkerApi(plan.router.url, admins[0], headers, model_id=model)
        self.spare = RouterWorkerApi(router.url, admins[1], headers, model_id=model)

    def standby(self, act: bool) -> tuple[tuple[str, ...], str]:
        if not act:
            return (), ""
        try:
            wanted = {w.url: w.worker_type for w in self.home.workers()}
        except (RouterApiError, OSError) as e:  # the router host's own trouble, not the standby's
            log.warning("cannot read the router host's workers to mirror them: %s", e)
            return (), ""
        try:
            return tuple(c.describe() for c in self.spare.sync(wanted)), ""
        except (RouterApiError, OSError) as e:
            return (), str(e)

    def holders(self) -> tuple[str, ...]:
        return vip_holders(self.plan, self.hosts, [s.host for s in self.plan.keepalived])[0]


def is_own_address(address: str) -> bool:
    """Can this machine bind ``address``, i.e. is it one of its own (with
    net.ipv4.ip_nonlocal_bind set, any address is: then it says True)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((address, 0))
        except OSError:
            return False
    return True


def metrics_workers(text: str) -> set[str]:
    """The workers a router's /metrics lists (vllm-router 0.1.17's worker health gauge)."""
    return {
        engine_url(s.labels["worker"])
        for s in parse_exposition(text)
        if s.name == "vllm_router_worker_health" and "worker" in s.labels
    }


class ServiceIngress:
    """The watch service's probe: plain HTTP from the router host (its host networking)."""

    def __init__(
        self,
        plan: Plan,
        fetch: HttpFn,
        headers: dict[str, str],
        own: Callable[[str], bool] = is_own_address,
    ) -> None:
        router = plan.standby_router
        assert router is not None
        self.plan, self.fetch, self.own = plan, fetch, own
        model = plan.served_model_name
        self.home = RouterWorkerApi(plan.router.url, fetch, headers, model_id=model)
        self.metrics_url = ""
        if router.metrics_port is not None:
            where = url_host(router.metrics_address or router.address)
            self.metrics_url = f"http://{where}:{router.metrics_port}/metrics"

    def standby(self, act: bool) -> tuple[tuple[str, ...], str]:
        if not self.metrics_url:
            return (), ""  # nothing lists the standby's workers to this host
        try:
            mine = {engine_url(w.url) for w in self.home.workers()}
        except (RouterApiError, OSError) as e:
            log.warning("cannot read the router's workers to compare the standby's: %s", e)
            return (), ""
        a = self.fetch(self.metrics_url, timeout=5.0)
        if not a.ok:
            return (), f"its metrics do not answer ({a.describe()})"
        theirs = metrics_workers(a.body)
        what = [f"missing {u}" for u in sorted(mine - theirs)]
        what += [f"not on the router host {u}" for u in sorted(theirs - mine)]
        if not what:
            return (), ""
        return (), (
            f"{'; '.join(what)} (the watch service cannot change the standby's list: "
            "`pdboot up` or a foreground `pdboot watch` brings it back in step)"
        )

    def holders(self) -> tuple[str, ...]:
        vip = self.plan.virtual_ip.split("/")[0]
        if self.own(vip):
            return (self.plan.router.host,)
        router = self.plan.standby_router
        front = self.plan.standby_proxy or router
        assert front is not None and router is not None
        a = self.fetch(f"{front.scheme}://{url_host(vip)}:{front.port}/health", timeout=2.0)
        return (router.host,) if a.ok else ()
