"""`pdboot watch`'s loop: every interval, a canary through every prefill->decode pair, then the
actions pdboot.plan.watch.policy decides, carried out through the router's worker API and a
restarter, each one an event, a log line and a metric.

The loop owns no decision: observations -> ``step`` -> actions. What it needs from outside
(HTTP, the router, restarts, the clock) comes in as small interfaces, so a unit test drives a
whole round with fakes and a fake clock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Literal, Protocol

from pdboot.deploy.drain import drain
from pdboot.deploy.router_api import RouterApiError, Worker, switch_router
from pdboot.deploy.watch.canary import CanaryContext, health, run_canary
from pdboot.deploy.watch.lease import Lease
from pdboot.events import Emit
from pdboot.plan.degraded import (
    ServingMode,
    engine_url,
    is_plain_url,
    lost_tier,
    serving_mode,
)
from pdboot.plan.watch.events import (
    WatchActionTaken,
    WatchHeldBack,
    WatchPairLine,
    WatchRound,
    WatchServingChanged,
)
from pdboot.plan.watch.metrics import WatchMetrics
from pdboot.plan.watch.policy import (
    Alert,
    Evict,
    PairCheck,
    Readmit,
    Restart,
    Round,
    WatchAction,
    WatchConfig,
    WatchedEngine,
    WatchState,
    initial_state,
    step,
)
from pdboot.transport.http import HttpFn
from pdboot.verify.metrics import EngineFacts, engine_facts, merged

log = logging.getLogger(__name__)
ActionName = Literal["evict", "readmit", "restart", "alert"]


class RouterWorkers(Protocol):
    """What watch needs of pdboot.deploy.router_api.RouterWorkerApi."""

    def workers(self) -> list[Worker]: ...

    def add(self, url: str, worker_type: str) -> None: ...

    def remove(self, url: str) -> bool: ...


class Restarter(Protocol):
    """Restart one engine's container and return once it was told to (raises OSError or
    RuntimeError with the reason); watch then waits for its /health itself."""

    def restart(self, engine: WatchedEngine) -> None: ...


@dataclass
class WatchDeps:
    fetch: HttpFn
    router: RouterWorkers
    emit: Emit
    metrics: WatchMetrics = field(default_factory=WatchMetrics)
    restarter: Restarter | None = None  # None: restarts are alerts
    headers: Mapping[str, str] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    drain_seconds: float = 30.0  # an evicted engine's in-flight requests finish within this
    ready_seconds: float = 600.0  # a restarted engine answers /health within this
    # router.standby (deploy/watch/standby.py): the standby's list after the router host's
    # (when the round acts), and the virtual IP's holder, once per round
    ingress: Callable[[bool], None] | None = None
    # the deployment lock, taken for each round that may act (lease.py); None: act freely
    # (the watch service, which `up` stops instead; unit tests of the policy's actions)
    lease: Lease | None = None


class Watcher:
    def __init__(
        self, engines: Sequence[WatchedEngine], model: str, cfg: WatchConfig, deps: WatchDeps
    ) -> None:
        self.engines = list(engines)
        self.by_key = {e.key: e for e in self.engines}
        self.model, self.cfg, self.deps = model, cfg, deps
        self.state: WatchState = initial_state(self.engines)
        self.rounds = 0
        self.held_rounds = 0  # rounds in a row an `up` or `down` held the deployment
        self.started = deps.clock()
        self.latest: dict[tuple[str, str], PairCheck] = {}  # the last verdict per pair
        self._facts: dict[str, EngineFacts] = {}
        self._lock = threading.Lock()  # the status endpoint reads `latest` from its thread
        self._health: Mapping[str, bool] = {}  # the latest round's /health per engine
        self.serving: ServingMode = serving_mode({e.url: e.tier for e in self.engines})
        self.serving_since = self.started
        for e in self.engines:
            deps.metrics.set("pdboot_watch_engine_in_rotation", 1, e.key, e.tier)
        deps.metrics.set("pdboot_watch_degraded", 0)

    # ------------------------------------------------------------ observe
    def pairs(self) -> list[tuple[WatchedEngine, WatchedEngine]]:
        pre = [e for e in self.engines if e.tier == "prefill"]
        dec = [e for e in self.engines if e.tier == "decode"]
        return [(p, d) for p in pre for d in dec]

    def observe(self) -> Round:
        d = self.deps
        up = {e.key: health(d.fetch, e, self.cfg.deadline_seconds) for e in self.engines}
        ctx = CanaryContext(d.fetch, d.headers, self.model, self.cfg.deadline_seconds, d.clock)
        checks = tuple(run_canary(ctx, p, q) for p, q in self.pairs())
        failed, expired = self._interval_counters()
        return Round(d.clock(), checks, up, failed, expired)

    def _interval_counters(self) -> tuple[dict[str, float], dict[str, float]]:
        """Whole-engine NIXL failure counters since the previous round (client traffic too)."""
        failed: dict[str, float] = {}
        expired: dict[str, float] = {}
        for e in self.engines:
            a = self.deps.fetch(f"{e.url}/metrics", timeout=self.cfg.deadline_seconds)
            if not a.ok:
                continue
            now = merged(engine_facts(a.body))
            before = self._facts.get(e.key)
            self._facts[e.key] = now
            if before is None:
                continue
            delta = now - before
            if e.tier == "decode" and delta.failed_transfers > 0:
                failed[e.key] = delta.failed_transfers
            if e.tier == "prefill" and delta.expired_leases > 0:
                expired[e.key] = delta.expired_leases
        return failed, expired

    # ------------------------------------------------------------ one round
    def round(self) -> list[WatchAction]:
        """One round: the lease, the canaries, the policy's actions, the worker list made
        true, the standby; or, while another run holds the deployment, /health alone."""
        lease = self.deps.lease
        holder = lease.take() if lease is not None else None
        try:
            if holder is not None:
                self._held_round(holder)
                return []
            self._resumed()
            return self._acting_round()
        finally:
            if lease is not None and holder is None:
                lease.release()

    def _acting_round(self) -> list[WatchAction]:
        t0 = self.deps.clock()
        obs = self.observe()
        self.state, actions = step(self.cfg, self.engines, self.state, obs)
        self.rounds += 1
        self._health = obs.health
        self._record(obs, self.deps.clock() - t0)
        for a in actions:
            if self._lease_lost():
                return actions
            self._act(a)
        if self._lease_lost():
            return actions
        self._reconcile_workers()
        if self.deps.ingress is not None:
            self.deps.ingress(True)
        return actions

    def _lease_lost(self) -> bool:
        """The lease's heartbeat failed mid-round: another run may own the deployment now,
        so the round's remaining actions wait for a round that holds the lease again."""
        why = self.deps.lease.lost() if self.deps.lease is not None else None
        if why is not None:
            log.warning("the deployment lock is no longer watch's (%s): not acting", why)
        return why is not None

    def _held_round(self, holder: str) -> None:
        """Another run holds the deployment: read /health and say so; decide nothing (the
        policy's counts stay as they were), change nothing."""
        d = self.deps
        up = {e.key: health(d.fetch, e, self.cfg.deadline_seconds) for e in self.engines}
        self._health = up
        self.rounds += 1
        self.held_rounds += 1
        d.metrics.set("pdboot_watch_held_back", 1)
        d.metrics.set("pdboot_watch_last_round_timestamp_seconds", d.wall())
        unhealthy = tuple(k for k, ok in up.items() if not ok)
        d.emit(WatchHeldBack(True, holder, self.held_rounds, unhealthy))
        if d.ingress is not None:
            d.ingress(False)

    def _resumed(self) -> None:
        if not self.held_rounds:
            return
        self.deps.emit(WatchHeldBack(False, "", self.held_rounds))
        self.deps.metrics.set("pdboot_watch_held_back", 0)
        self.held_rounds = 0
        # the NIXL counters start again from here: failures while `up` replaced engines
        # are not counted against the engines that came after
        self._facts.clear()

    def _record(self, obs: Round, seconds: float) -> None:
        m, now = self.deps.metrics, obs.now
        with self._lock:
            for p in obs.pairs:
                self.latest[(p.prefill, p.decode)] = p
        for p in obs.pairs:
            labels = (p.prefill, p.decode)
            m.set("pdboot_watch_canary_ok", 1.0 if p.ok else 0.0, *labels)
            m.inc("pdboot_watch_canaries_total", *labels, p.fault or "ok")
            m.set("pdboot_watch_canary_seconds", p.seconds, *labels)
            last = self.state.last_good.get(labels, self.started)
            m.set("pdboot_watch_seconds_since_good_canary", max(now - last, 0.0), *labels)
        m.inc("pdboot_watch_rounds_total")
        m.set("pdboot_watch_last_round_timestamp_seconds", self.deps.wall())
        lines = tuple(
            WatchPairLine(
                p.prefill,
                p.decode,
                p.result,
                p.fault,
                p.step,
                p.detail,
                round(p.seconds, 4),
                p.failed_transfers,
                p.pulled_tokens,
            )
            for p in obs.pairs
        )
        self.deps.emit(
            WatchRound(
                self.rounds,
                round(seconds, 3),
                lines,
                tuple(k for k, ok in obs.health.items() if not ok),
                tuple(sorted(obs.failed_transfers.items())),
                tuple(sorted(obs.expired_leases.items())),
            )
        )

    # ------------------------------------------------------------ act
    def _event(
        self, action: ActionName, engine: str, fault: str, reason: str, ok: bool, detail: str = ""
    ) -> None:
        # the event alone: its view prints the line (a log record beside it said it twice)
        tier = self.by_key[engine].tier
        self.deps.emit(WatchActionTaken(action, engine, tier, fault, reason, ok, detail))

    def _act(self, a: WatchAction) -> None:
        m = self.deps.metrics
        if isinstance(a, Evict):
            ok, detail = self._router_call(partial(self._switch, acting=a.engine))
            m.inc("pdboot_watch_evictions_total", a.engine, a.tier, a.fault)
            m.set("pdboot_watch_engine_in_rotation", 0, a.engine, a.tier)
            self._event("evict", a.engine, a.fault, a.reason, ok, detail)
        elif isinstance(a, Readmit):
            ok, detail = self._router_call(partial(self._switch, acting=a.engine))
            if ok:
                m.inc("pdboot_watch_readmissions_total", a.engine, a.tier)
                m.set("pdboot_watch_engine_in_rotation", 1, a.engine, a.tier)
            else:  # stays out; the next good round tries again
                self._set(a.engine, in_rotation=False, good_rounds=self.cfg.readmit_after - 1)
            self._event(
                "readmit", a.engine, "", f"{a.good_rounds} good rounds in a row", ok, detail
            )
        elif isinstance(a, Alert):
            m.inc("pdboot_watch_alerts_total", a.engine, a.tier, a.fault)
            self._event("alert", a.engine, a.fault, a.reason, False)
        elif isinstance(a, Restart):
            self._restart(a)

    def _set(self, key: str, *, in_rotation: bool, good_rounds: int) -> None:
        engines = dict(self.state.engines)
        engines[key] = replace(engines[key], in_rotation=in_rotation, good_rounds=good_rounds)
        self.state = WatchState(engines, self.state.last_good)

    def _router_call(self, call: Callable[[], object]) -> tuple[bool, str]:
        try:
            call()
        except (RouterApiError, OSError) as e:
            return False, str(e)
        return True, ""

    def _reconcile_workers(self) -> None:
        """The router's list made true each round: a worker that is no engine of the plan is
        removed (metric, alert rule PdbootForeignWorker); then the list is switched to what
        the engines in rotation serve (``_switch``): an engine watch holds out is removed
        again (a router restart or another tool may have registered it), a healthy engine in
        rotation that is missing is registered again (a router Docker restarted comes back
        empty: refilled within this round)."""
        try:
            listed = {w.url: w.worker_type for w in self.deps.router.workers()}
        except (RouterApiError, OSError) as e:
            log.warning("cannot check the router's workers: %s", e)
            return
        mine = {x.url.rstrip("/"): x for x in self.engines}
        m, router = self.deps.metrics, self.deps.router
        for url, kind in sorted(listed.items()):
            if engine_url(url) not in mine:
                _, detail = self._router_call(partial(router.remove, url))
                m.inc("pdboot_watch_foreign_workers_removed_total", url, kind)
                log.error("removed foreign worker %s (%s) %s", url, kind, detail)
        ok, detail = self._router_call(partial(self._switch, listed))
        if not ok:
            log.error("cannot make the router's workers match the rotation: %s", detail)

    def _switch(self, listed: Mapping[str, str] | None = None, *, acting: str = "") -> None:
        """Make the router's list serve the engines in rotation (plan/degraded.py: P/D, or
        one tier alone as plain engines), in the order that keeps a route for every request
        at every step; an engine whose /health failed this round is not registered. A change
        to an engine's own entry other than ``acting``'s (the engine evicted or readmitted)
        is a repair, logged and counted. Raises the router's error; a change of serving mode
        is an event and metrics."""
        router, m = self.deps.router, self.deps.metrics
        if listed is None:
            listed = {w.url: w.worker_type for w in router.workers()}
        mine = {x.url.rstrip("/"): x for x in self.engines}
        present = {u: k for u, k in listed.items() if engine_url(u) in mine}
        rotation = {e.url: e.tier for e in self.engines if self.state.engines[e.key].in_rotation}
        # entries a change of serving mode moves are the switch's, never repairs
        switching = serving_mode(rotation) != self.serving
        # not while its /health fails: a later round registers it
        health = {x.url.rstrip("/"): self._health.get(x.key, True) for x in self.engines}
        calls, mode = switch_router(router, present, rotation, lambda u: health.get(u, False))
        for c in calls:
            eng = mine[engine_url(c.url)]
            if switching or eng.key == acting or is_plain_url(c.url):
                continue
            if c.action == "add":
                m.inc("pdboot_watch_workers_reregistered_total", eng.key, eng.tier)
                log.warning("registered %s again: missing from the router's list", eng.key)
            elif not rotation.get(eng.url):
                log.warning("removed %s again: it was back in the router's list", c.url)
        self._note_serving(mode)

    def _note_serving(self, mode: ServingMode) -> None:
        """A switch into or out of degraded mode: an event, the gauge, the counter."""
        if mode == self.serving:
            return
        before, self.serving = self.serving, mode
        now = self.deps.clock()
        held, self.serving_since = now - self.serving_since, now
        m = self.deps.metrics
        lost = lost_tier(mode)
        m.set("pdboot_watch_degraded", 1 if lost is not None else 0)
        m.inc("pdboot_watch_serving_switches_total", mode)
        level = logging.INFO if mode == "pd" else logging.WARNING
        log.log(level, "serving %s (was %s for %.0f s)", mode, before, held)
        self.deps.emit(WatchServingChanged(before, mode, lost or "", round(held, 1)))

    # ------------------------------------------------------------ restarts
    def _restart(self, a: Restart) -> None:
        e = self.by_key[a.engine]
        ok, detail = self._restart_one(e)
        if ok:
            self.deps.metrics.inc("pdboot_watch_restarts_total", e.key, e.tier)
        self._event("restart", e.key, self.state.engines[e.key].fault, a.reason, ok, detail)
        for key in a.then_decodes if ok else ():
            self._restart_decode_after_prefill(self.by_key[key], a.engine)

    def _restart_one(self, e: WatchedEngine) -> tuple[bool, str]:
        if self.deps.restarter is None:
            return False, "no restarter (restarts are not enabled for this watch)"
        drained = self._drain(e)
        try:
            self.deps.restarter.restart(e)
        except (OSError, RuntimeError) as err:
            return False, f"{drained}; {err}"
        ok, detail = self._wait_healthy(e)
        return ok, f"{drained}; {detail}" if detail else drained

    def _restart_decode_after_prefill(self, d: WatchedEngine, prefill: str) -> None:
        """One decode at a time, out of the router while it restarts; never the last one."""
        s = self.state.engines[d.key]
        others = [
            k
            for k, x in self.state.engines.items()
            if x.in_rotation and k != d.key and self.by_key[k].tier == "decode"
        ]
        why = f"after the restart of {prefill} (its NIXL state for the old prefill)"
        if s.in_rotation and not others:
            self.deps.metrics.inc("pdboot_watch_alerts_total", d.key, d.tier, "restart")
            self._event(
                "alert",
                d.key,
                "restart",
                f"not restarted {why}: the last decode engine in rotation",
                False,
            )
            return
        if s.in_rotation:
            ok, detail = self._router_call(lambda: self.deps.router.remove(d.url))
            self._event("evict", d.key, "restart", f"drained for its restart {why}", ok, detail)
        ok, detail = self._restart_one(d)
        if ok:
            self.deps.metrics.inc("pdboot_watch_restarts_total", d.key, d.tier)
        self._event("restart", d.key, "", why, ok, detail)
        if s.in_rotation and ok:
            ok, detail = self._router_call(lambda: self.deps.router.add(d.url, d.tier))
            self._event("readmit", d.key, "", f"restarted {why}", ok, detail)
            if not ok:
                self._set(d.key, in_rotation=False, good_rounds=0)

    def _drain(self, e: WatchedEngine) -> str:
        """Out of the router already: until it is idle (rolling changes' drain, a prefill's
        KV pulls by the decodes included), at most ``drain_seconds``."""
        pullers = [x.url for x in self.engines if e.tier == "prefill" and x.tier == "decode"]
        clock = _DepsClock(self.deps.clock, self.deps.sleep)
        got = drain(
            e.url,
            self.deps.fetch,
            clock,
            timeout=self.deps.drain_seconds,
            interval=0.5,
            pullers=pullers,
        )
        return got.describe()

    def _wait_healthy(self, e: WatchedEngine) -> tuple[bool, str]:
        end = self.deps.clock() + self.deps.ready_seconds
        while True:
            if health(self.deps.fetch, e, self.cfg.deadline_seconds):
                return True, ""
            if self.deps.clock() >= end:
                return False, f"no /health within {self.deps.ready_seconds:.0f} s of the restart"
            self.deps.sleep(0.5)

    # ------------------------------------------------------------ run
    def run(self, stop: threading.Event, rounds: int | None = None) -> None:
        """Rounds every interval (measured from each round's start) until ``stop`` is set."""
        while not stop.is_set() and (rounds is None or self.rounds < rounds):
            t0 = self.deps.clock()
            self.round()
            wait = self.cfg.interval_seconds - (self.deps.clock() - t0)
            if wait > 0 and (rounds is None or self.rounds < rounds):
                stop.wait(wait)

    def serving_doc(self) -> dict[str, object]:
        """How the endpoint serves now (the status endpoint's ``serving``)."""
        return {
            "mode": self.serving,
            "lost_tier": lost_tier(self.serving) or "",
            "seconds": round(max(self.deps.clock() - self.serving_since, 0.0), 1),
        }

    def verdicts(self) -> list[dict[str, object]]:
        """The last verdict per pair and who is in rotation (the status endpoint's body)."""
        with self._lock:
            latest = dict(self.latest)
        return [
            {
                "prefill": p,
                "decode": d,
                "ok": c.ok,
                "result": c.result,
                "fault": c.fault,
                "reason": "" if c.ok else c.reason(),
                "seconds": round(c.seconds, 4),
            }
            for (p, d), c in sorted(latest.items())
        ]


class _DepsClock:
    """WatchDeps' clock and sleep as the Clock that drain() reads."""

    def __init__(self, now: Callable[[], float], sleep: Callable[[float], None]) -> None:
        self._now, self._sleep = now, sleep

    def now(self) -> float:
        return self._now()

    def sleep(self, seconds: float) -> None:
        self._sleep(seconds)
