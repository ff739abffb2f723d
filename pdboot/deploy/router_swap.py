"""Swapping the router with no outage (issue 28, point 6): a new router starts beside the
old one on the other loopback port of the router host (plan/router_slots.py: home is
``router.internal_port``, spare ``router.swap_port``), gets every worker, and once it serves,
the proxy's upstream moves to it by a graceful nginx reload (requests in flight finish on the
old router; new ones go to the new); the old router then drains and stops.

``swap_steps`` plans one such move, to either place, as the executor's steps (executor.py);
``move_steps`` is what a router change in `up` does (a step of its roll, rollout.py): to the
spare with the new settings, then home again with the same settings,
so that outside a swap the router always runs home, where compose.yaml, the watch service,
`status` and a restarted proxy expect it. Contract in /work/notes/router-swap-api.md (and
docs/operations.md).

How the proxy is switched: its nginx.conf (plan/proxy.py) names both upstreams and includes
``/tmp/pdboot-route*.conf`` inside its container; the swap writes that file (the upstream to
use) with ``docker exec`` (the shipped conf never changes), checks the result with ``nginx -t`` and
reloads (``nginx -s reload``: the master starts workers on the new conf, the old ones finish
their requests and exit).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from pdboot.deploy.executor import Action, Run, execute
from pdboot.deploy.frame import NEVER_CANCELLED
from pdboot.deploy.router_admin import AdminFetch
from pdboot.deploy.router_api import RouterApiError, RouterWorkerApi
from pdboot.deploy.waits import Clock, MonotonicClock
from pdboot.events import Emit, Note
from pdboot.inventory.schema import Inventory, TierName
from pdboot.plan.converge import Observed
from pdboot.plan.model import Plan, Service
from pdboot.plan.proxy import (
    PROXY_CONF_IN_CONTAINER,
    ROUTE_FILE,
    UPSTREAM_HOME,
    UPSTREAM_SPARE,
    route_text,
)
from pdboot.plan.render import render_services
from pdboot.plan.router_slots import (
    SPARE_COMPOSE,
    SPARE_NAME,
    Slot,
    other,
    spare_project,
    spare_router,
)
from pdboot.transport import docker_cli
from pdboot.transport.connection import Connection
from pdboot.transport.hosts import Hosts, project_dir
from pdboot.transport.http import HttpFn

# blue/green's proof of green on its own router: the new router and an HttpFn reaching it
Check = Callable[[Service, HttpFn], None]
STOP_GRACE = 30  # seconds docker gives a stopped router to finish what it still serves


class RouterSwapError(Exception):
    """The swap stopped; the message says where, and which router serves (the old one,
    unless the proxy had already moved)."""


@dataclass
class SwapContext:
    """What a swap needs. ``fetch``: pdboot's plain HTTP function (the swap reaches each
    router's loopback port through the router host's SSH connection itself); ``workers``:
    URL -> type to register on the new router (empty for a router with static lists);
    ``model_id``: the served model name each registration names."""

    inv: Inventory
    plan: Plan
    hosts: Hosts
    fetch: HttpFn
    emit: Emit
    workers: Mapping[str, str] = field(default_factory=dict)  # URL -> type (plain: regular)
    model_id: str = ""
    clock: Clock = field(default_factory=MonotonicClock)
    ready_seconds: float = 0.0  # 0: timeouts.router_ready_seconds
    drain_seconds: float = 0.0  # 0: timeouts.drain_seconds
    interval: float = 0.0  # 0: timeouts.poll_interval_seconds
    channels: dict[str, AdminFetch] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        t = self.inv.timeouts
        self.ready_seconds = self.ready_seconds or t.router_ready_seconds
        self.drain_seconds = self.drain_seconds or t.drain_seconds
        self.interval = self.interval or t.poll_interval_seconds

    @property
    def conn(self) -> Connection:
        link = self.hosts.links.get(self.plan.router.host)
        if link is None:
            raise RouterSwapError(f"no connection to the router host {self.plan.router.host}")
        return link.conn

    def placed(self, router: Service, slot: Slot) -> Service:
        """``router`` as it runs in ``slot``."""
        return spare_router(self.inv, router) if slot == "spare" else router

    def admin(self, router: Service) -> AdminFetch:
        """The admin channel of ``router`` (a place: home or spare), opened on first use and
        kept for the run: every step that talks to that router shares it; ``close()`` ends
        them all."""
        channel = self.channels.get(router.url)
        if channel is None:
            channel = AdminFetch(self.plan, self.hosts, self.fetch, router=router)
            self.channels[router.url] = channel
        return channel

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()
        self.channels.clear()


def move_steps(router: Service) -> list[Action]:
    """The router's settings changed (``router``: the new one; the compose.yaml shipped to
    the router host must already hold it): the new settings start in the spare place, the
    proxy moves there, the old router drains and stops; then the same again back home. Two
    reloads of the proxy, no moment without a router behind it."""
    return [*swap_steps(router, "spare"), *swap_steps(router, "home")]


def swap_steps(
    router: Service,
    to: Slot,
    check: Check | None = None,
    workers: Mapping[str, TierName] | None = None,
) -> list[Action]:
    """Start ``router`` in place ``to`` beside the router running in the other place,
    register every worker of the context's ``workers`` on it, wait until it serves them,
    point the proxy at it (graceful reload), drain the old router and stop it.

    Before: the proxy runs with this pdboot's nginx.conf and serves through the other place;
    for ``to="home"`` the router host's compose.yaml holds ``router`` (compose starts it).
    After: ``router`` serves in ``to``, the other place is stopped (the spare's container
    removed). A failure before the proxy moved leaves the old router serving and the new one
    removed (the undo of StartRouter); raises RouterSwapError. ``check`` (the new router and
    an HttpFn that reaches it) runs once it serves, before the proxy moves; its
    RouterSwapError is a failure too. ``workers``: what the new router must serve, when not
    the context's."""
    named = tuple(workers.items()) if workers is not None else None
    out: list[Action] = [StartRouter(router, to), RouterReady(router, to, named)]
    if check is not None:  # blue/green: green proven on its own router (bluegreen.py)
        out.append(CheckRouter(router, to, check))
    return [*out, PointProxy(router, to), DrainRouter(router, other(to))]


def swap_router(ctx: SwapContext, router: Service, *, to: Slot, check: Check | None = None) -> None:
    """One swap (swap_steps) run by the executor on its own."""
    execute(Run(ctx.plan, ctx.emit, swap=ctx), NEVER_CANCELLED, swap_steps(router, to, check))


def move_router(ctx: SwapContext, router: Service | None = None) -> None:
    """move_steps run by the executor on its own."""
    steps = move_steps(router or ctx.plan.router)
    execute(Run(ctx.plan, ctx.emit, swap=ctx), NEVER_CANCELLED, steps)


# ---- the steps


@dataclass(frozen=True)
class StartRouter:
    router: Service
    to: Slot
    commits = False

    def describe(self) -> str:
        return f"start the router in the {self.to} place"

    def run(self, run: Run) -> Action | None:
        ctx = run.swap_context()
        new = ctx.placed(self.router, self.to)
        ctx.emit(Note(f"router swap: starting {new.container_name} on 127.0.0.1:{new.port}"))
        _start(ctx, new, self.to)
        return StopRouter(self.router, self.to, said=False)


@dataclass(frozen=True)
class RouterReady:
    """/health answers, and every worker is registered and healthy: ``workers`` (URL, type)
    when the plan names them (blue/green's green), else the swap context's."""

    router: Service
    to: Slot
    workers: tuple[tuple[str, str], ...] | None = None
    commits = False

    def describe(self) -> str:
        return f"wait for the router in the {self.to} place"

    def run(self, run: Run) -> Action | None:
        ctx = run.swap_context()
        if self.workers is not None:
            ctx = replace(ctx, workers=dict(self.workers))
        _ready(ctx, ctx.placed(self.router, self.to))
        return None


@dataclass(frozen=True)
class CheckRouter:
    router: Service
    to: Slot
    check: Check
    commits = False

    def describe(self) -> str:
        return f"check the router in the {self.to} place"

    def run(self, run: Run) -> Action | None:
        ctx = run.swap_context()
        new = ctx.placed(self.router, self.to)
        self.check(new, ctx.admin(new))
        return None


@dataclass(frozen=True)
class PointProxy:
    router: Service
    to: Slot
    commits = True  # clients reach the new router: what came before is not undone

    def describe(self) -> str:
        return f"point the proxy at the {self.to} place"

    def run(self, run: Run) -> Action | None:
        ctx = run.swap_context()
        _point_proxy(ctx, self.to)
        new = ctx.placed(self.router, self.to)
        ctx.emit(Note(f"router swap: the proxy forwards to {new.container_name}"))
        return None


@dataclass(frozen=True)
class DrainRouter:
    """The router the proxy left drains, then stops (the spare's container removed)."""

    router: Service
    place: Slot
    commits = False

    def describe(self) -> str:
        return f"drain and stop the router in the {self.place} place"

    def run(self, run: Run) -> Action | None:
        ctx = run.swap_context()
        old = ctx.placed(self.router, self.place)
        _drain(ctx, old)
        StopRouter(self.router, self.place).run(run)
        return None


@dataclass(frozen=True)
class StopRouter:
    router: Service
    place: Slot
    said: bool = True  # say it (the undo of a start is quiet, as the swap was)
    commits = False

    def describe(self) -> str:
        return f"stop the router in the {self.place} place"

    def run(self, run: Run) -> Action | None:
        ctx = run.swap_context()
        old = ctx.placed(self.router, self.place)
        _stop(ctx, old, remove=self.place == "spare")
        if self.said:
            ctx.emit(Note(f"router swap: {old.container_name} drained and stopped"))
        return None


def settle_spare(ctx: SwapContext, observed: Sequence[Observed]) -> bool:
    """A spare router left by an interrupted swap (`up` calls this before it plans): when
    the proxy forwards to it, the plan's router is swapped back home (no outage); otherwise
    it serves nothing and is removed. True when there was one."""
    spares = [
        o for o in observed if o.service_name == SPARE_NAME and o.host == ctx.plan.router.host
    ]
    if not spares:
        return False
    if _route_now(ctx) == "spare":
        ctx.emit(Note("router swap: an interrupted swap left the proxy on the spare router"))
        swap_router(ctx, ctx.plan.router, to="home")
    else:
        _stop(ctx, ctx.placed(ctx.plan.router, "spare"), remove=True)
        ctx.emit(Note("router swap: removed the spare router an interrupted swap left"))
    return True


def _route_now(ctx: SwapContext) -> Slot:
    """Where the proxy forwards now: its route file, read in its container."""
    proxy = ctx.plan.proxy.container_name if ctx.plan.proxy is not None else ""
    if not proxy:
        return "home"
    route = shlex.quote(ROUTE_FILE)
    res = ctx.conn.run(
        docker_cli.exec_in(proxy, "sh", "-c", f'read -r l < {route} && echo "$l"'),
        timeout=60,
    )
    return "spare" if res.rc == 0 and UPSTREAM_SPARE in res.stdout else "home"


# ---- what the steps do


def _run(ctx: SwapContext, argv: list[str], what: str, timeout: float = 120.0) -> str:
    res = ctx.conn.run(argv, timeout=timeout)
    if res.rc != 0:
        detail = (res.stderr.strip() or res.stdout.strip())[-600:]
        raise RouterSwapError(f"router swap: cannot {what} (exit {res.rc}): {detail}")
    return res.stdout


def _start(ctx: SwapContext, svc: Service, slot: Slot) -> None:
    pdir = project_dir(ctx.inv)
    if slot == "spare":
        header = (
            "# Generated by pdboot: the spare router of a router swap (deploy/router_swap.py)\n"
        )
        ctx.conn.put_text(
            f"{pdir}/{SPARE_COMPOSE}", render_services(spare_project(svc), [svc], header)
        )
        project, file = spare_project(svc), SPARE_COMPOSE
    else:
        project, file = svc.project, "compose.yaml"
    argv = docker_cli.compose_up(pdir, project, [svc.name], file=file, recreate=True)
    _run(ctx, argv, f"start {svc.container_name}", timeout=300.0)


def _ready(ctx: SwapContext, svc: Service) -> None:
    """/health answers, every worker registered and listed healthy."""
    fetch = ctx.admin(svc)
    deadline = ctx.clock.now() + ctx.ready_seconds
    while not fetch(f"{svc.url}/health", timeout=5.0).ok:
        if ctx.clock.now() > deadline:
            raise RouterSwapError(
                f"router swap: {svc.container_name} did not answer /health within "
                f"{ctx.ready_seconds:g} s; the old router keeps serving"
            )
        ctx.clock.sleep(ctx.interval)
    if not ctx.workers:
        return
    api = RouterWorkerApi(svc.url, fetch, model_id=ctx.model_id)
    try:
        api.sync(ctx.workers)
        while True:
            healthy = {w.url for w in api.workers() if w.healthy}
            if set(ctx.workers) <= healthy:
                return
            if ctx.clock.now() > deadline:
                missing = ", ".join(sorted(set(ctx.workers) - healthy))
                raise RouterSwapError(
                    f"router swap: {svc.container_name} lists {missing} as missing or "
                    f"unhealthy after {ctx.ready_seconds:g} s; the old router keeps serving"
                )
            ctx.clock.sleep(ctx.interval)
    except RouterApiError as e:
        raise RouterSwapError(f"router swap: {svc.container_name}: {e}") from e


def _point_proxy(ctx: SwapContext, slot: Slot) -> None:
    """Write the route file in the proxy's container, check the whole conf with it, and
    reload; a conf nginx refuses gets the old route back. Shell builtins and nginx only (a
    minimal image may have no coreutils)."""
    proxy = ctx.plan.proxy.container_name if ctx.plan.proxy is not None else ""
    if not proxy:
        raise RouterSwapError("router swap: the plan has no proxy to switch")
    conf = shlex.quote(PROXY_CONF_IN_CONTAINER)
    route = shlex.quote(ROUTE_FILE)
    text = shlex.quote(route_text(UPSTREAM_SPARE if slot == "spare" else UPSTREAM_HOME))
    script = (
        f"old=; if [ -e {route} ]; then read -r old < {route} || :; fi; "
        f"printf %s {text} > {route}; "
        f"if nginx -t -q -c {conf}; then nginx -s reload -c {conf}; else "
        f'printf "%s\\n" "$old" > {route}; exit 3; fi'
    )
    _run(ctx, docker_cli.exec_in(proxy, "sh", "-c", script), f"switch {proxy}'s upstream")


def _load(ctx: SwapContext, fetch: HttpFn, svc: Service) -> int | None:
    """The router's requests in flight (the sum of its workers' load); None: no answer."""
    a = fetch(f"{svc.url}/workers", timeout=5.0)
    if not a.ok:
        return None
    try:
        items = json.loads(a.body).get("workers", [])
        return sum(int(w.get("load", 0) or 0) for w in items if isinstance(w, dict))
    except (ValueError, AttributeError, TypeError):
        return None


def _drain(ctx: SwapContext, old: Service) -> None:
    """Until the old router has nothing in flight twice in a row (its old nginx workers may
    still hand it a request just after the reload), at most drain_seconds; then docker's
    stop lets it finish the rest within STOP_GRACE."""
    fetch = ctx.admin(old)
    deadline = ctx.clock.now() + ctx.drain_seconds
    ctx.clock.sleep(max(ctx.interval, 1.0))
    quiet = 0
    while quiet < 2 and ctx.clock.now() < deadline:
        load = _load(ctx, fetch, old)
        if load is None:
            return  # not running, or not answering: nothing to wait for
        quiet = quiet + 1 if load == 0 else 0
        ctx.clock.sleep(ctx.interval)


def _stop(ctx: SwapContext, svc: Service, *, remove: bool) -> None:
    """Stop (SIGTERM, STOP_GRACE) and, for the spare, remove; a container that is not
    there is no error."""
    name = svc.container_name
    res = ctx.conn.run(docker_cli.stop(name, STOP_GRACE), timeout=STOP_GRACE + 60)
    if res.rc != 0 and "No such container" not in res.stderr:
        raise RouterSwapError(f"router swap: cannot stop {name}: {res.stderr.strip()[-300:]}")
    if remove:
        ctx.conn.run(docker_cli.remove(name), timeout=60)
