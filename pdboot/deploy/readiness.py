"""Readiness probes for `up`: an engine is ready when /health answers 200; the router when
/health answers and every engine of the plan is registered healthy in /workers. While a
service is not ready its container is inspected (an exit stops the wait at once) and its
latest log line kept for the views. Containers are found by label, never by name."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pdboot.ansi import strip_ansi
from pdboot.deploy.router_api import RouterApiError
from pdboot.deploy.waits import READY, Clock, Probe, failed, waiting
from pdboot.events import ServiceWait
from pdboot.plan.converge import Observed, owned
from pdboot.plan.model import LABEL_HOST, Plan, Service
from pdboot.transport.connection import HostLost
from pdboot.transport.http import HttpFn
from pdboot.verify.loadphase import LoadPhase, load_phase
from pdboot.verify.probes import RouterWorkers

LOG_REFRESH_SECONDS = 1.0
LOG_TAIL = 20  # enough to find the latest start-up phase line among access-log lines


def find_container(observed: Iterable[Observed], deployment: str, svc: Service) -> Observed | None:
    """This service's container among what a host reported: by the deployment, role,
    engine index and host labels."""
    for o in owned(observed, deployment):
        if o.service_name == svc.name and o.labels.get(LABEL_HOST, o.host) == svc.host:
            return o
    return None


class ContainerWatch(Protocol):
    """What a probe reads of a host's engine while it waits (a hosts.EngineOps has it)."""

    def inspect(self, container_id: str) -> Observed: ...

    def logs(self, container_id: str, tail: int = 50) -> list[str]: ...


@dataclass
class Prober:
    """Builds one probe per service; remembers each container's latest log line."""

    plan: Plan
    engines: Mapping[str, ContainerWatch]  # host -> engine
    container_ids: dict[str, str]  # service key -> container id
    fetch: HttpFn
    clock: Clock
    latest_line: dict[str, str] = field(default_factory=dict)
    latest_phase: dict[str, LoadPhase] = field(default_factory=dict)
    _last_fetch: dict[str, float] = field(default_factory=dict)
    # reconnects a host the SSH watchdog cut off when it answers again (Hosts.relink)
    relink: Callable[[str], bool] | None = None

    def service_wait(self, key: str, state: str, detail: str) -> ServiceWait:
        """A waiting service's row, with its latest log line and load phase."""
        phase = self.latest_phase.get(key)
        line = self.latest_line.get(key, "")
        if phase is None:
            return ServiceWait(key, state, detail, line)
        return ServiceWait(key, state, detail, line, phase.text(), phase.done, phase.total)

    def check_container(self, svc: Service, detail: str) -> Probe:
        cid = self.container_ids.get(svc.key)
        if cid is None:
            return waiting(f"{detail}; no container labelled {svc.key} found")
        try:
            return self._inspect(svc, cid, detail)
        except HostLost as e:  # not a slow engine: waiting longer cannot help ...
            if self.relink is not None and self.relink(svc.host):
                # ... unless the watchdog fired on a live host (a starved machine)
                return waiting(f"{detail}; reconnected")  # the frame's note tells why
            return failed(e.message, host_lost=True)

    def _inspect(self, svc: Service, cid: str, detail: str) -> Probe:
        engine = self.engines[svc.host]
        obs = engine.inspect(cid)
        if obs.restart_count > 0:
            # the restart policy brought it back; it crashed all the same
            return failed(f"container exited and was restarted {obs.restart_count}x")
        if obs.state in ("exited", "dead"):
            code = f" (exit code {obs.exit_code})" if obs.exit_code is not None else ""
            return failed(f"container {obs.state}{code}")
        now = self.clock.now()
        if now - self._last_fetch.get(svc.key, -1e9) >= LOG_REFRESH_SECONDS:
            self._last_fetch[svc.key] = now
            lines = [strip_ansi(x) for x in engine.logs(cid, tail=LOG_TAIL)]
            phase = load_phase(lines, self.latest_phase.get(svc.key))
            if phase is not None:
                self.latest_phase[svc.key] = phase
            if lines:
                self.latest_line[svc.key] = lines[-1]
        return waiting(detail)

    def engine(self, svc: Service) -> Callable[[], Probe]:
        if svc.headless:
            return self.follower(svc)

        def probe() -> Probe:
            a = self.fetch(svc.health_url, timeout=2.0)
            return READY if a.ok else self.check_container(svc, a.describe())

        return probe

    def follower(self, svc: Service) -> Callable[[], Probe]:
        """A headless DP follower serves no HTTP: it is ready when its container runs and
        the head's /health answers (vLLM's head answers only once every rank joined); a
        follower that exits fails the wait (vLLM's exits 0 after 5 min without a head)."""

        def probe() -> Probe:
            a = self.fetch(svc.ready_url, timeout=2.0)
            mine = self.check_container(svc, f"headless; head {a.describe()}")
            if mine.state == "failed" or not a.ok:
                return mine
            return READY

        return probe

    def router(
        self,
        svc: Service,
        engines: Sequence[Service],
        register: Callable[[], None] | None = None,
    ) -> Callable[[], Probe]:
        """``register``: with live workers, what posts the missing engines to a router that
        answers /health (it starts knowing none); called again while any is missing."""
        # a data-parallel tier registers as its head only
        prefills = [s.url for s in engines if s.role == "prefill" and not s.headless]
        decodes = [s.url for s in engines if s.role == "decode" and not s.headless]

        def probe() -> Probe:
            a = self.fetch(svc.health_url, timeout=2.0)
            if not a.ok:
                return self.check_container(svc, a.describe())
            w = self.fetch(f"{svc.url}/workers", timeout=2.0)
            if not w.ok:
                return waiting(f"/workers: {w.describe()}")
            missing = RouterWorkers.parse(w.body).missing(prefills, decodes)
            if missing and register is not None:
                try:
                    register()
                except RouterApiError as e:
                    return waiting(f"registering: {e}")
                w = self.fetch(f"{svc.url}/workers", timeout=2.0)
                missing = RouterWorkers.parse(w.body).missing(prefills, decodes) if w.ok else []
            return waiting("not registered: " + ", ".join(missing)) if missing else READY

        return probe
