"""`logs`: one service's lines, or every service's, each line after its service's name, as
`docker compose logs` prints them; with --follow every chosen service at once, lines in the
order they arrive (one reader thread per container, one printer)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pdboot.deploy.logscan import report_lines
from pdboot.deploy.readiness import find_container
from pdboot.deploy.status import SelectorError, select_service
from pdboot.events import Diagnosis, Emit, Note
from pdboot.exitcodes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.plan.model import Plan, Service
from pdboot.transport.docker_parse import EngineError
from pdboot.transport.hosts import EngineOps, Hosts, open_hosts, register_inventory_secrets
from pdboot.verify.diagnose import diagnose as diagnose_logs


@dataclass(frozen=True)
class LogOptions:
    tail: int | None = 100  # lines from the end of each container's log; None: all
    follow: bool = False
    diagnose: bool = False
    since: int | None = None  # Unix time: only lines written after it
    accept_new_host_keys: bool = False
    timestamps: bool = False  # Docker's RFC 3339 time before each line


# (inventory, hosts, options) -> the open hosts (tests hand in fake ones)
LogHosts = Callable[[Inventory, Iterable[str], LogOptions], Hosts]


def open_log_hosts(inv: Inventory, names: Iterable[str], opts: LogOptions) -> Hosts:
    """A follow reads for as long as the operator watches: no Docker timeout then."""
    return open_hosts(
        inv,
        names,
        accept_new_host_keys=opts.accept_new_host_keys,
        engine_timeout=None if opts.follow else 120,
    )


def logs(
    inv: Inventory,
    selector: str | None,
    on_line: Callable[[str], None],
    emit: Emit,
    opts: LogOptions,
    hosts_factory: LogHosts = open_log_hosts,
) -> int:
    """Hands each log line of one service (found by label), or with no selector of every
    service of the deployment (each line after its service's name), to ``on_line``."""
    plan = build_plan(inv)
    try:
        chosen = [select_service(inv, selector, plan)] if selector else list(plan.services())
    except SelectorError as e:
        emit(Note(f"error: {e}", "error"))
        return EXIT_USAGE
    register_inventory_secrets(inv)  # engine logs pass through the masker (Engine.logs)
    hosts = hosts_factory(inv, list(dict.fromkeys(s.host for s in chosen)), opts)
    try:
        for host, why in sorted(hosts.errors.items()):
            emit(Note(f"error: cannot reach {host}: {why}", "error"))
        width = max(len(s.key) for s in chosen)
        prefix = {s.key: "" if selector else f"{s.key:<{width}} | " for s in chosen}
        found: list[tuple[Service, EngineOps, str]] = []
        failed = bool(hosts.errors)
        for svc in chosen:
            if svc.host in hosts.errors:
                continue
            engine = hosts.links[svc.host].engine
            cid = _container(engine, plan, svc, emit)
            if cid is None:
                failed = True
            else:
                found.append((svc, engine, cid))
        if opts.follow:
            failed |= _follow(found, on_line, emit, opts, prefix)
        else:
            for svc, engine, cid in found:
                failed |= _tail(svc, engine, cid, on_line, emit, opts, prefix[svc.key])
        return EXIT_FAILED if failed else EXIT_OK
    finally:
        hosts.close()


def _container(engine: EngineOps, plan: Plan, svc: Service, emit: Emit) -> str | None:
    try:
        found = find_container(engine.containers(plan.deployment), plan.deployment, svc)
    except EngineError as e:  # e.g. the host was lost (docker_parse.EngineLost)
        emit(Note(f"error: {e}", "error"))
        return None
    if found is None:
        emit(Note(f"error: {svc.key} has no container (is it up?)", "error"))
        return None
    return found.id


def _tail(
    svc: Service,
    engine: EngineOps,
    cid: str,
    on_line: Callable[[str], None],
    emit: Emit,
    opts: LogOptions,
    prefix: str,
) -> bool:
    """One service's lines; True when it failed (the host lost mid-read)."""
    try:
        lines = engine.logs(cid, tail=opts.tail, since=opts.since, timestamps=opts.timestamps)
    except EngineError as e:
        emit(Note(f"error: {e}", "error"))
        return True
    for line in lines:
        on_line(prefix + line)
    if opts.diagnose:  # --diagnose: known causes in these lines, cause + fix each
        known = diagnose_logs({svc.key: lines})
        emit(Diagnosis("logs --diagnose", tuple(report_lines(known))))
    return False


_ENDED = object()  # a reader's last item: its stream ended


def _follow(
    found: list[tuple[Service, EngineOps, str]],
    on_line: Callable[[str], None],
    emit: Emit,
    opts: LogOptions,
    prefix: dict[str, str],
) -> bool:
    """Every container's stream at once until each ends or Ctrl-C; True when one failed.
    The readers only queue lines: this thread prints, so lines never interleave mid-line."""
    lines: queue.Queue[tuple[str, object]] = queue.Queue()

    def read(key: str, engine: EngineOps, cid: str) -> None:
        try:
            for line in engine.follow_logs(
                cid, tail=opts.tail, since=opts.since, timestamps=opts.timestamps
            ):
                lines.put((key, line))
        except EngineError as e:
            lines.put((key, e))
        finally:
            lines.put((key, _ENDED))

    for svc, engine, cid in found:
        # daemon: a stream blocked on a live container ends with the process (Ctrl-C)
        threading.Thread(target=read, args=(svc.key, engine, cid), daemon=True).start()
    failed = False
    running = len(found)
    try:
        while running:
            try:
                key, item = lines.get(timeout=0.5)  # a timeout: Ctrl-C is seen at once
            except queue.Empty:
                continue
            if item is _ENDED:
                running -= 1
            elif isinstance(item, EngineError):
                emit(Note(f"error: {item}", "error"))
                failed = True
            else:
                on_line(prefix[key] + str(item))
    except KeyboardInterrupt:
        pass
    return failed
