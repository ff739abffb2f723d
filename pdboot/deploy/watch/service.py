"""`pdboot watch INVENTORY`: the deployment's engines and router from the plan, the loop of
pdboot.deploy.watch.run, and a small HTTP server beside it (``/metrics`` in Prometheus text,
``/verdicts`` the last verdict per pair as JSON, which `status` reads).

The same entry point runs in the foreground (restarts through SSH and Docker on the engine
hosts, like `up`) and as the service `up` starts beside the router (``watch.image``), where it
has no SSH access to the other hosts: there a restart is an alert.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from contextlib import ExitStack
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pdboot.deploy.readiness import find_container
from pdboot.deploy.router_admin import AdminFetch
from pdboot.deploy.router_api import RouterWorkerApi
from pdboot.deploy.watch.lease import LockLease, ssh_lease
from pdboot.deploy.watch.run import Restarter, WatchDeps, Watcher
from pdboot.deploy.watch.standby import IngressProbe, ServiceIngress, SshIngress, StandbyWatch
from pdboot.events import Done, Emit, Note
from pdboot.exitcodes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from pdboot.inventory.ingress_rules import ingress_hosts
from pdboot.inventory.schema import TIERS, Inventory
from pdboot.inventory.watch_schema import Watch
from pdboot.plan.build import build_plan
from pdboot.plan.model import Plan
from pdboot.plan.watch.metrics import WatchMetrics
from pdboot.plan.watch.policy import WatchConfig, WatchedEngine
from pdboot.transport import docker_cli
from pdboot.transport.docker_parse import EngineError
from pdboot.transport.hosts import (
    SecretError,
    api_key_headers,
    open_hosts,
    read_secret,
    register_inventory_secrets,
)
from pdboot.transport.http import HttpFn, http

log = logging.getLogger(__name__)
RESTART_TIMEOUT = 180.0  # `docker restart` of one engine (its stop grace is 30 s)


def watch_engines(plan: Plan) -> list[WatchedEngine]:
    """Every engine the router serves (a DP tier's head only: its followers have no HTTP)."""
    return [
        WatchedEngine(s.key, s.role, s.url.rstrip("/"))
        for s in plan.services()
        if s.role in TIERS and not s.headless
    ]


def watch_config(w: Watch) -> WatchConfig:
    return WatchConfig(
        w.interval_seconds,
        w.deadline_seconds,
        w.evict_after,
        w.readmit_after,
        w.restart_after,
        w.restart_backoff_seconds,
        w.degraded,
    )


class DockerRestarter:
    """`docker restart` of the engine's container on its host, over SSH as `up` reaches it."""

    def __init__(self, inv: Inventory, plan: Plan, accept_new: bool = False) -> None:
        self.inv, self.plan, self.accept_new = inv, plan, accept_new
        self.services = {s.key: s for s in plan.services()}

    def restart(self, engine: WatchedEngine) -> None:
        svc = self.services[engine.key]
        hosts = open_hosts(self.inv, [svc.host], accept_new_host_keys=self.accept_new)
        try:
            if hosts.errors:
                raise RuntimeError(f"cannot reach {svc.host}: {hosts.errors[svc.host]}")
            docker = hosts.links[svc.host].engine
            found = find_container(
                docker.containers(self.plan.deployment), self.plan.deployment, svc
            )
            if found is None:
                raise RuntimeError(f"{svc.key} has no container")
            rc, out = docker.run_once(docker_cli.restart(found.id, 30), timeout=RESTART_TIMEOUT)
            if rc != 0:
                raise RuntimeError(f"docker restart {svc.container_name}: {out.strip()[:200]}")
        except EngineError as e:
            raise RuntimeError(str(e)) from e
        finally:
            hosts.close()


REQUEST_TIMEOUT = 10.0  # seconds a client may take to send its request (and read the answer)
MAX_CONNECTIONS = 32  # scrapes and `status`: a few at a time; more are closed at once


class _BoundedServer(ThreadingHTTPServer):
    """At most MAX_CONNECTIONS handled at once: an idle half-sent request holds a slot for
    REQUEST_TIMEOUT at most, and never a thread per connection without bound."""

    daemon_threads = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def serve(watcher: Watcher, metrics: WatchMetrics, host: str, port: int) -> ThreadingHTTPServer:
    """/metrics, /verdicts and /health on ``host:port``, in a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT  # socket timeout: a client that stalls is dropped

        def log_message(self, format: str, *args: Any) -> None:
            return  # a scrape every few seconds is not news

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == "/metrics":
                body, ctype = metrics.exposition().encode(), "text/plain; version=0.0.4"
            elif path == "/verdicts":
                doc = {
                    "rounds": watcher.rounds,
                    "pairs": watcher.verdicts(),
                    "out_of_rotation": sorted(
                        k for k, s in watcher.state.engines.items() if not s.in_rotation
                    ),
                    "serving": watcher.serving_doc(),
                }
                body, ctype = json.dumps(doc).encode(), "application/json"
            elif path == "/health":
                body, ctype = b"ok", "text/plain"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = _BoundedServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True, name="watch-http").start()
    return server


def _api_key(inv: Inventory) -> str:
    """The engines' API key: the inventory's reference, or (the service, whose container
    cannot resolve the operator's reference) secrets.env's VLLM_API_KEY in its environment."""
    if inv.secrets.api_key is None:
        return ""
    try:
        return read_secret(inv.secrets.api_key, "secrets.api_key")
    except SecretError:
        if os.environ.get("VLLM_API_KEY"):
            return os.environ["VLLM_API_KEY"]
        raise


@dataclass(frozen=True)
class WatchOptions:
    listen: str = "127.0.0.1"  # the service binds the router host's address
    port: int | None = None  # None: watch.port
    restarts: bool = True
    rounds: int | None = None  # None: until interrupted
    accept_new_host_keys: bool = False  # restarts and the worker API go over SSH

    @classmethod
    def parse(
        cls, listen: str, *, restarts: bool, rounds: int | None = None, accept_new: bool = False
    ) -> WatchOptions:
        """``--listen ADDR[:PORT]`` (an IPv6 address in brackets when it has a port)."""
        host, sep, port = listen.rpartition(":")
        if sep and port.isdigit() and (host.endswith("]") or ":" not in host):
            return cls(host.strip("[]"), int(port), restarts, rounds, accept_new)
        return cls(listen.strip("[]"), None, restarts, rounds, accept_new)


def run_watch(
    inv: Inventory, opts: WatchOptions, emit: Emit, stop: threading.Event | None = None
) -> int:
    """Until Ctrl-C / SIGTERM (or ``opts.rounds``): exit 0, or 1 when the last round saw a
    failing pair."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    plan = build_plan(inv)
    register_inventory_secrets(inv)
    try:
        key = _api_key(inv)
    except SecretError as e:
        emit(Note(f"error: {e}", "error"))
        return EXIT_USAGE
    headers = api_key_headers({"VLLM_API_KEY": key} if key else {})
    metrics = WatchMetrics()
    with ExitStack() as run:  # what the run opens, closed at its end whatever happens
        deps = _deps(inv, plan, opts, emit, headers, metrics, run)
        return _watch(inv, plan, opts, emit, deps, stop)


def _deps(
    inv: Inventory,
    plan: Plan,
    opts: WatchOptions,
    emit: Emit,
    headers: dict[str, str],
    metrics: WatchMetrics,
    run: ExitStack,
) -> WatchDeps:
    """What the loop acts through. The worker API is on the router host's loopback
    (plan/proxy.py): the service runs there; in the foreground (restarts on) it goes through
    one admin channel per router (router_admin.py), opened here once for the run."""
    settings = inv.watch or Watch()
    accept = opts.accept_new_host_keys
    restarter: Restarter | None = DockerRestarter(inv, plan, accept) if opts.restarts else None
    admin: HttpFn = http
    ingress: StandbyWatch | None = None
    lease: LockLease | None = None
    if opts.restarts:
        hosts = open_hosts(inv, ingress_hosts(inv), accept_new_host_keys=accept)
        run.callback(hosts.close)
        admin = run.enter_context(AdminFetch(plan, hosts, http))
        if plan.standby_router is not None:
            spare = run.enter_context(AdminFetch(plan, hosts, http, router=plan.standby_router))
            probe: IngressProbe = SshIngress(plan, hosts, (admin, spare), headers)
            ingress = StandbyWatch(plan, probe, emit, metrics)
        # over SSH like the restarts: `up` and `down` hold watch back through the lock
        lease = ssh_lease(inv, accept, lambda m: emit(Note(m, "warn")))
        run.callback(lease.close)
    elif plan.standby_router is not None:  # the service: what plain HTTP shows it
        ingress = StandbyWatch(plan, ServiceIngress(plan, http, headers), emit, metrics)
    return WatchDeps(
        http,
        RouterWorkerApi(plan.router.url, admin, headers, model_id=plan.served_model_name),
        emit,
        metrics,
        restarter,
        headers,
        drain_seconds=settings.drain_seconds,
        ready_seconds=inv.timeouts.ready_seconds,
        ingress=ingress,
        lease=lease,
    )


def _watch(
    inv: Inventory,
    plan: Plan,
    opts: WatchOptions,
    emit: Emit,
    deps: WatchDeps,
    stop: threading.Event | None,
) -> int:
    settings = inv.watch or Watch()
    metrics = deps.metrics
    engines = watch_engines(plan)
    watcher = Watcher(engines, plan.served_model_name, watch_config(settings), deps)
    port = opts.port or settings.port
    try:
        server = serve(watcher, metrics, opts.listen, port)
    except OSError as e:
        emit(Note(f"error: cannot listen on {opts.listen}:{port}: {e.strerror or e}", "error"))
        return EXIT_FAILED
    emit(
        Note(
            f"watching {counted(len(engines), 'engine')} "
            f"({counted(len(watcher.pairs()), 'pair')}) every "
            f"{settings.interval_seconds:g} s; metrics on http://{opts.listen}:{port}/metrics"
        )
    )
    try:
        watcher.run(stop or threading.Event(), opts.rounds)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
    ok = all(v["ok"] for v in watcher.verdicts())
    code = EXIT_OK if ok else EXIT_FAILED
    emit(Done("watch", code, 0.0, f"{watcher.rounds} rounds"))
    return code


def counted(n: int, noun: str) -> str:
    """``1 pair``, ``2 pairs``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
