"""`pdboot watch` in the foreground with a standby ingress (docs/ingress-standby.md): each
round, after watch made the router host's worker list true (evictions, re-admissions), the
standby router's list is made equal to it, and the holder of the virtual IP is read on both
ingress hosts; plan/watch/ingress.py says what to alert.

Over SSH (the worker APIs are on each ingress host's loopback, admin.py; the addresses are
read with ``ip``): the watch service beside the router has no SSH to the standby, so there
the standby is kept in step by `up` only, and neither alert is raised.
"""

from __future__ import annotations

import logging

from pdboot.deploy.admin import AdminFetch
from pdboot.deploy.ingress_status import ingress_state
from pdboot.deploy.router_api import RouterApiError, RouterWorkerApi
from pdboot.events import Emit
from pdboot.plan.model import Plan
from pdboot.plan.watch.events import WatchActionTaken
from pdboot.plan.watch.ingress import IngressRound, ingress_alerts
from pdboot.plan.watch.metrics import WatchMetrics
from pdboot.transport.hosts import Hosts
from pdboot.transport.http import HttpFn

log = logging.getLogger(__name__)


class StandbyWatch:
    def __init__(
        self,
        plan: Plan,
        hosts: Hosts,
        fetch: HttpFn,
        headers: dict[str, str],
        emit: Emit,
        metrics: WatchMetrics,
    ) -> None:
        """``hosts``: open connections to both ingress hosts; ``fetch``: plain HTTP."""
        router = plan.standby_router
        if router is None:
            raise ValueError("no router.standby in this plan")
        self.plan, self.hosts, self.fetch, self.emit, self.metrics = (
            plan,
            hosts,
            fetch,
            emit,
            metrics,
        )
        self.key = router.key
        self._admins = (
            AdminFetch(plan, hosts, fetch),
            AdminFetch(plan, hosts, fetch, router=router),
        )
        model = plan.served_model_name
        self.home = RouterWorkerApi(plan.router.url, self._admins[0], headers, model_id=model)
        self.standby = RouterWorkerApi(router.url, self._admins[1], headers, model_id=model)
        self.holder = ""

    def __call__(self) -> None:
        """One round (Watcher.round calls it last)."""
        changes: tuple[str, ...] = ()
        error = ""
        try:
            wanted: dict[str, str] | None = {w.url: w.worker_type for w in self.home.workers()}
        except (RouterApiError, OSError) as e:  # the router host's own trouble, not the standby's
            log.warning("cannot read the router host's workers to mirror them: %s", e)
            wanted = None
        if wanted is not None:
            try:
                changes = tuple(c.describe() for c in self.standby.sync(wanted))
            except (RouterApiError, OSError) as e:
                error = str(e)
        holders: tuple[str, ...] = ()
        if self.plan.keepalived:
            hosts = [s.host for s in self.plan.keepalived]
            holders = ingress_state(self.plan, self.hosts, self.fetch, hosts).holders
        seen = IngressRound(holders, changes, error)
        self.holder, alerts = ingress_alerts(self.holder, seen, self.plan.virtual_ip)
        for fault, reason in alerts:
            log.error("alert %s (%s): %s", self.key, fault, reason)
            self.metrics.inc("pdboot_watch_alerts_total", self.key, "ingress", fault)
            self.emit(WatchActionTaken("alert", self.key, "ingress", fault, reason, False))

    def close(self) -> None:
        for a in self._admins:
            a.close()
