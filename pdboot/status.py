"""`status` and `logs`: what runs where, and one service's logs.

status: per service of the plan (and any leftover of this deployment): host, state,
health (its own /health over HTTP, the truth for readiness), uptime, image, whether its
config hash label matches the inventory, endpoint. Exit 0 only when every planned service
runs and answers /health.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pdboot.converge import Observed, owned
from pdboot.deploy import EXIT_FAILED, EXIT_OK, EXIT_USAGE, recorded_findings
from pdboot.engine import EngineError
from pdboot.hosts import open_hosts
from pdboot.inventory import Inventory
from pdboot.plan import ROLES, Service, build_plan
from pdboot.probes import http


@dataclass(frozen=True)
class ServiceStatus:
    service: str
    role: str
    host: str
    state: str  # running, exited, ..., absent, unreachable
    health: str  # ok, HTTP 503, connection refused, -
    uptime_seconds: float | None
    image: str
    matches_inventory: bool | None
    endpoint: str
    planned: bool = True

    @property
    def healthy(self) -> bool:
        return self.state == "running" and self.health == "ok"


def parse_started(started_at: str) -> datetime | None:
    """Docker's RFC 3339 with nanoseconds -> aware datetime (None for the zero time)."""
    if not started_at or started_at.startswith("0001-"):
        return None
    s = started_at.replace("Z", "+00:00")
    if "." in s:
        head, _, rest = s.partition(".")
        m = re.match(r"\d*", rest)
        frac = m.group(0) if m else ""
        tz = rest[len(frac) :]
        s = f"{head}.{frac[:6]}{tz}"
    try:
        return datetime.fromisoformat(s)
    except ValueError:
        return None


def uptime(started_at: str, now: datetime) -> float | None:
    t = parse_started(started_at)
    return None if t is None else max((now - t).total_seconds(), 0.0)


def human_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def service_status(
    svc: Service | None, obs: Observed | None, *, reachable: bool, now: datetime, health: str
) -> ServiceStatus:
    """Pure: one row from the plan's service and what was observed."""
    role = svc.role if svc else str(obs.role if obs else "?")
    host = svc.host if svc else (obs.host if obs else "?")
    if not reachable:
        state = "unreachable"
    elif obs is None:
        state = "absent"
    else:
        state = obs.state
    return ServiceStatus(
        service=f"{role}@{host}",
        role=role,
        host=host,
        state=state,
        health=health,
        uptime_seconds=uptime(obs.started_at, now) if obs and obs.state == "running" else None,
        image=obs.image if obs else (svc.image if svc else ""),
        matches_inventory=(obs.config_hash == svc.config_hash) if (obs and svc) else None,
        endpoint=svc.url if svc else "",
        planned=svc is not None,
    )


def collect(inv: Inventory, accept_new_host_keys: bool = False) -> list[ServiceStatus]:
    hosts = open_hosts(inv, build_plan(inv).hosts, accept_new_host_keys=accept_new_host_keys)
    try:
        # the config hash includes the RDMA choice `up` made from its preflight: rebuild
        # the plan from that record, not from the declared devices alone
        findings = recorded_findings(inv, hosts)
        plan = build_plan(inv, findings.present, findings.ports)
        values, errors = hosts.each(lambda _h, link: link.engine.containers(plan.deployment), 60.0)
    finally:
        hosts.close()
    unreachable = set(hosts.errors) | set(errors)
    observed = owned([o for obs in values.values() for o in obs], plan.deployment)
    now = datetime.now(timezone.utc)
    rows = []
    seen: set[str] = set()
    for svc in plan.services():
        obs = next((o for o in observed if o.host == svc.host and o.role == svc.role), None)
        if obs is not None:
            seen.add(obs.id)
        health = "-"
        if obs is not None and obs.state == "running":
            a = http(svc.health_url, timeout=3.0)
            health = "ok" if a.ok else a.describe()
        rows.append(
            service_status(svc, obs, reachable=svc.host not in unreachable, now=now, health=health)
        )
    for o in observed:
        if o.id not in seen:
            rows.append(service_status(None, o, reachable=True, now=now, health="-"))
    return rows


def status(inv: Inventory, out: Console, *, as_json: bool = False) -> int:
    rows = collect(inv)
    planned = [r for r in rows if r.planned]
    healthy = bool(planned) and all(r.healthy for r in planned)
    if as_json:
        doc = {
            "deployment": inv.name,
            "endpoint": build_plan(inv).endpoint + "/v1",
            "healthy": healthy,
            "services": [asdict(r) for r in rows],
        }
        # soft_wrap: never break a line inside a JSON string on a narrow console
        out.print(json.dumps(doc, indent=2), soft_wrap=True, highlight=False, markup=False)
        return EXIT_OK if healthy else EXIT_FAILED
    out.print(status_table(rows, inv.name, out.width))
    out.print("healthy" if healthy else "[red]not healthy[/red]")
    return EXIT_OK if healthy else EXIT_FAILED


def short_image(ref: str) -> str:
    """`10.77.2.1:5000/vllm/vllm-openai:v0.33.0` -> `vllm-openai:v0.33.0` (the full
    reference is in --json); a digest is cut to 12 hex digits."""
    name = ref.rsplit("/", 1)[-1]
    m = re.match(r"^(.*sha256:)([0-9a-f]{12})[0-9a-f]*$", name)
    return m.group(1) + m.group(2) if m else name


def short_endpoint(url: str) -> str:
    """`http://10.77.2.10:8201` -> `10.77.2.10:8201`."""
    return url.split("://", 1)[-1].rstrip("/")


def _cells(r: ServiceStatus) -> dict[str, Text]:
    state_style = "green" if r.state == "running" else "red"
    if not r.planned:
        match = Text("not in inventory", style="yellow")
    else:
        match = {
            True: Text("yes"),
            False: Text("changed", style="yellow"),
            None: Text("-"),
        }[r.matches_inventory]
    return {
        "service": Text(r.service, style="bold"),
        "state": Text(r.state, style=state_style),
        "health": Text(r.health, style="green" if r.health == "ok" else "red"),
        "uptime": Text(human_seconds(r.uptime_seconds)),
        "image": Text(short_image(r.image)),
        "matches": match,
        "endpoint": Text(short_endpoint(r.endpoint)),
    }


def status_table(rows: list[ServiceStatus], deployment: str, width: int) -> Table:
    """One line per service when that fits the width; otherwise two lines per service
    (uptime under the state, whether the config matches under the image). Addresses,
    tags and service names are never broken; only health details and the like wrap."""
    cells = [_cells(r) for r in rows]
    wide = _table(
        deployment, ["service", "state", "health", "uptime", "image", "matches", "endpoint"], cells
    )
    if Console(width=10_000).measure(wide).maximum <= width:
        return wide
    narrow = []
    for c in cells:
        matches = {"yes": Text("config matches", style="dim"), "-": Text("")}.get(
            c["matches"].plain,
            Text.assemble("config ", c["matches"])
            if c["matches"].plain == "changed"
            else c["matches"],
        )
        narrow.append(
            {
                "service": c["service"],
                "state": Text("\n").join([c["state"], Text(c["uptime"].plain, style="dim")]),
                "health": c["health"],
                "image / config": Text("\n").join([c["image"], matches]),
                "endpoint": c["endpoint"],
            }
        )
    return _table(deployment, ["service", "state", "health", "image / config", "endpoint"], narrow)


def _table(deployment: str, columns: list[str], rows: list[dict[str, Text]]) -> Table:
    table = Table(
        title=f"deployment {deployment}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1, 0, 0),  # with the box's blank separator: two spaces between columns
        pad_edge=False,
        show_edge=False,
    )
    for col in columns:
        # only health details may wrap (between words, in the two-line form); the rest
        # are tokens an operator copies (names, tags, addresses): never broken
        words = col == "health" and "uptime" not in columns
        table.add_column(col, no_wrap=not words, overflow="fold", min_width=10 if words else None)
    for r in rows:
        table.add_row(*(r[c] for c in columns))
    return table


# --------------------------------------------------------------------------- logs


class SelectorError(ValueError):
    pass


def select_service(inv: Inventory, selector: str) -> Service:
    """``decode`` (only when one host runs it), ``decode@gpu-b``, or ``router``."""
    plan = build_plan(inv)
    role, _, host = selector.partition("@")
    if role not in ROLES:
        raise SelectorError(f"unknown role {role!r}: use one of {', '.join(ROLES)}")
    matches = [s for s in plan.services() if s.role == role and (not host or s.host == host)]
    if not matches:
        raise SelectorError(
            f"no {role} on host {host!r}: "
            + ", ".join(s.key for s in plan.services() if s.role == role)
        )
    if len(matches) > 1:
        raise SelectorError(
            f"{role} runs on {len(matches)} hosts; pick one: " + ", ".join(s.key for s in matches)
        )
    return matches[0]


def logs(inv: Inventory, selector: str, out: Console, *, tail: int, follow: bool) -> int:
    try:
        svc = select_service(inv, selector)
    except SelectorError as e:
        out.print(Text(f"error: {e}", style="red"))
        return EXIT_USAGE
    plan = build_plan(inv)
    hosts = open_hosts(inv, [svc.host], engine_timeout=None if follow else 120)
    try:
        if hosts.errors:
            out.print(Text(f"error: cannot reach {svc.host}: {hosts.errors[svc.host]}", "red"))
            return EXIT_FAILED
        engine = hosts.links[svc.host].engine
        found = [
            o
            for o in owned(engine.containers(plan.deployment), plan.deployment)
            if o.role == svc.role
        ]
        if not found:
            out.print(Text(f"error: {svc.key} has no container (is it up?)", style="red"))
            return EXIT_FAILED
        cid = found[0].id
        if follow:
            try:
                for line in engine.follow_logs(cid, tail=tail):
                    out.print(Text.from_ansi(line), highlight=False, soft_wrap=True)
            except KeyboardInterrupt:
                pass
        else:
            for line in engine.logs(cid, tail=tail):
                out.print(Text.from_ansi(line), highlight=False, soft_wrap=True)
        return EXIT_OK
    except EngineError as e:  # e.g. the host was lost mid-read (engine.EngineLost)
        out.print(Text(f"error: {e}", style="red"), soft_wrap=True)
        return EXIT_FAILED
    finally:
        hosts.close()
