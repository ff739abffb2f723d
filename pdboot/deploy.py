"""`up` and `down`: ordered bring-up with health gates, and teardown by label.

up:   preflight -> pull everywhere (parallel, progress) -> ship compose + secrets ->
      decode tier (wait /health) -> prefill tier (wait /health) -> router (wait /health and
      every engine registered in /workers) -> one chat completion through the router with
      proof that the decode engines pulled KV from prefill -> endpoint + curl line.
down: router, then prefill, then decode, each tier on all its hosts in parallel, only
      containers carrying this deployment's labels.

What to do is decided by converge.py (pure); waiting by waits.py (pure, fake-clock tested);
this module wires them to the hosts and prints.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console
from rich.filesize import decimal
from rich.live import Live
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TransferSpeedColumn,
)
from rich.table import Column, Table
from rich.text import Text

from pdboot import lock
from pdboot.converge import Observed, Step, decode_restart_note, orphans, plan_down, plan_up
from pdboot.diagnose import diagnose
from pdboot.engine import PullProgress, PullResult
from pdboot.hosts import (
    Hosts,
    Link,
    SecretError,
    open_hosts,
    project_dir,
    read_hf_token,
    secrets_env,
)
from pdboot.inventory import Inventory
from pdboot.plan import SECRETS_FILE, Plan, Service, build_plan
from pdboot.probes import KVCounters, RouterWorkers, completion_text, http, kv_verdict
from pdboot.rdma_findings import (
    RECORD_FILE,
    Findings,
    describe,
    from_preflight,
    from_records,
    records_to_ship,
)
from pdboot.remote import HostLost, RemoteError, register_secret
from pdboot.render import render_host
from pdboot.waits import (
    READY,
    Clock,
    MonotonicClock,
    Probe,
    Tick,
    WaitError,
    WaitFailed,
    failed,
    wait_all,
    waiting,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
LOG_LINES_ON_FAILURE = 50
OP_DEADLINE = 300.0  # compose up / stop of one tier on one host


@dataclass(frozen=True)
class UpOptions:
    skip_preflight: bool = False
    rollback: bool = False
    accept_new_host_keys: bool = False
    prove: bool = True
    no_wait: bool = False  # a held deployment lock: exit 1 at once instead of waiting


@dataclass(frozen=True)
class PreflightOutcome:
    ok: bool
    rdma: Findings | None = None  # per host: usable RDMA found (for kv_transfer.rdma auto)


# (inv, out, accept_new_host_keys) -> outcome; prints its own report
PreflightFn = Callable[[Inventory, Console, bool], PreflightOutcome]


class _Stop(Exception):
    """A step failed and was reported; `up` exits 1."""


# --------------------------------------------------------------------------- up


def up(
    inv: Inventory,
    opts: UpOptions,
    out: Console,
    *,
    preflight: PreflightFn | None = None,
    clock: Clock | None = None,
) -> int:
    held = _take_lock(inv, "up", opts.no_wait, opts.accept_new_host_keys, out)
    if not isinstance(held, lock.HeldLock):
        return held or EXIT_FAILED
    try:
        return _up(inv, opts, out, preflight=preflight, clock=clock)
    finally:
        held.release()


def _take_lock(
    inv: Inventory, operation: str, no_wait: bool, accept_new: bool, out: Console
) -> lock.HeldLock | int | None:
    """The deployment lock (see lock.py); the exit code when it cannot be had; None for
    `down` when the lock's host cannot be reached (down removes what it can reach)."""
    try:
        return lock.take(
            inv,
            operation,
            wait=not no_wait,
            say=lambda m: out.print(Text(m, style="yellow"), soft_wrap=True),
            accept_new_host_keys=accept_new,
        )
    except lock.LockBusy as e:
        out.print(Text(f"error: {e}", style="red"), soft_wrap=True)
    except RemoteError as e:
        why = f"{e} (fix: {e.fix})" if e.fix else str(e)
        if operation == "down":
            msg = f"cannot take the deployment lock: {why}; going on without it"
            out.print(Text(msg, style="yellow"))
            return None
        out.print(Text(f"error: cannot take the deployment lock: {why}", style="red"))
    except KeyboardInterrupt:
        out.print(Text("interrupted while waiting for the deployment lock", style="yellow"))
        return EXIT_INTERRUPTED
    return EXIT_FAILED


def _up(
    inv: Inventory,
    opts: UpOptions,
    out: Console,
    *,
    preflight: PreflightFn | None = None,
    clock: Clock | None = None,
) -> int:
    try:
        token = read_hf_token(inv.secrets.hf_token)
    except SecretError as e:
        out.print(Text(f"error: {e}", style="red"))
        return EXIT_USAGE
    if token is not None:
        register_secret(token)  # masked in anything pdboot logs or prints
    findings: Findings | None = None
    try:
        if opts.skip_preflight or preflight is None:
            note = " (--skip-preflight)" if opts.skip_preflight else ""
            out.print("preflight skipped" + note)
        else:
            outcome = preflight(inv, out, opts.accept_new_host_keys)
            if not outcome.ok:
                out.print(Text("preflight failed: nothing was pulled or started", style="red"))
                return EXIT_FAILED
            findings = outcome.rdma
        t0 = time.monotonic()
        hosts = open_hosts(
            inv, build_plan(inv).hosts, accept_new_host_keys=opts.accept_new_host_keys
        )
    except KeyboardInterrupt:
        out.print(Text("interrupted before anything was started", style="yellow"))
        return EXIT_INTERRUPTED
    try:
        if hosts.errors:
            _report_errors(out, "cannot reach", hosts.errors)
            return EXIT_FAILED
        try:
            if findings is None:
                # no preflight this run: what the last one recorded on each host
                findings = recorded_findings(inv, hosts)
        except KeyboardInterrupt:
            out.print(Text("interrupted before anything was started", style="yellow"))
            return EXIT_INTERRUPTED
        plan = build_plan(inv, findings.present, findings.ports)
        for line in describe(inv, plan, findings, skipped=opts.skip_preflight):
            out.print(line)
        run = _Up(inv, plan, hosts, opts, out, clock or MonotonicClock(), token)
        run.records = records_to_ship(findings)
        try:
            run.run()
        except _Stop:
            return EXIT_FAILED
        except KeyboardInterrupt:
            run.interrupted()
            return EXIT_INTERRUPTED
        out.print(f"[green]up[/green]: deployed in {time.monotonic() - t0:.1f}s")
        return EXIT_OK
    finally:
        hosts.close()


class _Up:
    def __init__(
        self,
        inv: Inventory,
        plan: Plan,
        hosts: Hosts,
        opts: UpOptions,
        out: Console,
        clock: Clock,
        token: str | None,
    ) -> None:
        self.inv, self.plan, self.hosts, self.opts = inv, plan, hosts, opts
        self.out, self.clock, self.token = out, clock, token
        self.dir = project_dir(inv)
        self.records: dict[str, str] = {}  # host -> RDMA record text to ship
        self.latest_line: dict[str, str] = {}
        self.last_log_fetch: dict[str, float] = {}

    # ---- the sequence

    def run(self) -> None:
        self.pull()
        self.ship()
        observed = self.observe()
        stages = plan_up(self.plan, observed)
        self.show_steps(stages)
        self.remove_orphans(observed)
        for steps in stages:
            self.start(steps)
            self.wait(steps)
        if self.opts.prove:
            self.prove()
        self.show_endpoint()
        note = decode_restart_note(stages)
        if note is not None:
            self.out.print(Text(note, style="yellow"), soft_wrap=True)

    # ---- pull

    def pull(self) -> None:
        wanted = {h: sorted({s.image for s in hp.services}) for h, hp in self.plan.hosts.items()}
        progress = Progress(
            TextColumn("{task.description}", table_column=Column(overflow="fold")),
            BarColumn(bar_width=10),
            # never folded ("20.0/20… MB" was): the description gives way first
            DownloadColumn(table_column=Column(no_wrap=True)),
            TransferSpeedColumn(table_column=Column(no_wrap=True)),
            TextColumn("{task.fields[note]}", table_column=Column(no_wrap=True)),
            console=self.out,
            transient=False,
            disable=not self.out.is_terminal,  # a log gets only the finished lines
        )
        tasks: dict[tuple[str, str], TaskID] = {}
        for h, images in wanted.items():
            for img in images:
                # the bar shows the image's last path component (room for the numbers
                # at 80 columns); the finished line names it in full
                short = img.rsplit("/", 1)[-1]
                tasks[(h, img)] = progress.add_task(f"{h}: {short}", total=None, note="checking")

        def pull_host(host: str, link: Link) -> list[PullResult]:
            results = []
            for img in wanted[host]:
                task = tasks[(host, img)]
                done = [0]
                t0 = time.monotonic()

                def on_progress(
                    p: PullProgress, task: TaskID = task, done: list[int] = done
                ) -> None:
                    done[0] = p.done
                    progress.update(task, completed=p.done, total=p.total or None, note=p.status)

                r = link.engine.pull(img, on_progress)
                # a finished bar gives way to one plain line naming the image in full,
                # the same on a terminal and in a log
                progress.update(task, visible=False)
                if r.pulled:
                    took = time.monotonic() - t0
                    line = f"{host}: {img} pulled ({decimal(done[0])} in {took:.1f}s)"
                    if r.digest:
                        line = line[:-1] + f", {r.digest[:19]})"
                else:
                    line = f"{host}: {img} already present ({(r.digest or '')[:19]})"
                progress.console.print(line, soft_wrap=True, highlight=False)
                results.append(r)
            return results

        with progress:
            _, errors = self.hosts.each(pull_host, self.inv.timeouts.pull_seconds)
        if errors:
            _report_errors(self.out, "pull failed on", errors)
            raise _Stop

    # ---- ship

    def ship(self) -> None:
        texts = {h: render_host(self.plan, h, self.inv) for h in self.plan.hosts}
        secrets = secrets_env(self.token) if self.token is not None else None

        def ship_host(host: str, link: Link) -> None:
            needs = any(s.uses_secrets for s in self.plan.hosts[host].services)
            extra = {RECORD_FILE: self.records[host]} if host in self.records else None
            link.engine.ship(self.dir, texts[host], secrets if needs else None, extra)

        _, errors = self.hosts.each(ship_host, OP_DEADLINE)
        if errors:
            _report_errors(self.out, "cannot ship the compose project to", errors)
            raise _Stop
        extra = f" and {SECRETS_FILE} (0600)" if secrets is not None else ""
        self.out.print(f"shipped compose.yaml{extra} to {self.dir} on {len(texts)} host(s)")

    # ---- observe / converge

    def observe(self) -> list[Observed]:
        values, errors = self.hosts.each(
            lambda _h, link: link.engine.containers(self.plan.deployment), OP_DEADLINE
        )
        if errors:
            _report_errors(self.out, "cannot list containers on", errors)
            raise _Stop
        return [o for obs in values.values() for o in obs]

    def show_steps(self, stages: list[list[Step]]) -> None:
        for steps in stages:
            for s in steps:
                style = {"unchanged": "dim", "create": "green", "recreate": "yellow"}[s.kind]
                self.out.print(
                    Text.assemble(
                        (f"{s.service.key:<28}", "bold"), (f"{s.kind:<10}", style), s.reason
                    )
                )

    def remove_orphans(self, observed: list[Observed]) -> None:
        gone = orphans(self.plan, observed)
        if not gone:
            return
        for o in gone:
            self.out.print(f"{o.key:<28} remove    no longer in the inventory")
        _stop_remove(self.hosts, gone, self.out)

    # ---- start and wait

    def start(self, steps: list[Step]) -> None:
        todo: dict[str, list[Step]] = {}
        for s in steps:
            if s.kind != "unchanged":
                todo.setdefault(s.service.host, []).append(s)
        if not todo:
            return

        def start_host(host: str, link: Link) -> None:
            for s in todo[host]:
                link.engine.compose_up(
                    self.dir,
                    self.plan.hosts[host].project,
                    s.service.name,
                    recreate=s.kind == "recreate",
                    timeout=OP_DEADLINE,
                )

        _, errors = self.hosts.each(start_host, OP_DEADLINE, only=todo)
        if errors:
            _report_errors(self.out, "cannot start services on", errors)
            raise _Stop

    def wait(self, steps: list[Step]) -> None:
        services = [s.service for s in steps]
        router = services[0].role == "router"
        probes = {s.key: self.probe(s) for s in services}
        deadline = (
            self.inv.timeouts.router_ready_seconds if router else self.inv.timeouts.ready_seconds
        )
        what = "/health 200 and every engine in /workers" if router else "/health 200"
        announced: set[str] = set()
        last_plain = [0.0]  # the first plain line after 5 s of waiting
        try:
            with Live(console=self.out, transient=True, auto_refresh=False) as live:

                def on_tick(t: Tick) -> None:
                    for key, p in t.states.items():
                        if p.state == "ready" and key not in announced:
                            announced.add(key)
                            live.console.print(f"[green]ready[/green] {key} after {t.elapsed:.1f}s")
                    if self.out.is_terminal:
                        live.update(self._tick_table(t), refresh=True)
                    elif t.elapsed - last_plain[0] >= 5.0:
                        # a log, not a terminal: one line per waiting service every 5 s
                        last_plain[0] = t.elapsed
                        for key, p in t.states.items():
                            if p.state != "ready" and t.elapsed > 0:
                                line = self.latest_line.get(key, "")[-120:]
                                live.console.print(
                                    Text(f"waiting {key} {t.elapsed:.0f}s: {p.detail} | {line}")
                                )

                took = wait_all(
                    probes,
                    what=what,
                    deadline=deadline,
                    interval=self.inv.timeouts.poll_interval_seconds,
                    clock=self.clock,
                    on_tick=on_tick,
                )
        except WaitError as e:
            self.fail(next(s for s in services if s.key == e.key), e)
            raise _Stop from None
        tier = "router" if router else services[0].role
        self.out.print(f"{tier} tier ready ({what}) after {took:.1f}s")

    def probe(self, svc: Service) -> Callable[[], Probe]:
        link = self.hosts.links[svc.host]
        container = f"{self.plan.hosts[svc.host].project}-{svc.name}"

        def check_container(detail: str) -> Probe:
            try:
                return inspect_container(detail)
            except HostLost as e:  # not a slow engine: waiting longer cannot help
                return failed(e.message)

        def inspect_container(detail: str) -> Probe:
            obs = link.engine.inspect(container)
            if obs.restart_count > 0:
                # the restart policy brought it back; it crashed all the same
                return failed(f"container exited and was restarted {obs.restart_count}x")
            if obs.state in ("exited", "dead"):
                code = f" (exit code {obs.exit_code})" if obs.exit_code is not None else ""
                return failed(f"container {obs.state}{code}")
            now = self.clock.now()
            if now - self.last_log_fetch.get(svc.key, -1e9) >= 1.0:
                self.last_log_fetch[svc.key] = now
                lines = link.engine.logs(container, tail=1)
                if lines:
                    self.latest_line[svc.key] = Text.from_ansi(lines[-1]).plain
            return waiting(detail)

        if svc.role != "router":

            def engine_probe() -> Probe:
                a = http(svc.health_url, timeout=2.0)
                return READY if a.ok else check_container(a.describe())

            return engine_probe

        engines = [s for stage in self.plan.stages[:2] for s in stage]
        prefills = [s.url for s in engines if s.role == "prefill"]
        decodes = [s.url for s in engines if s.role == "decode"]

        def router_probe() -> Probe:
            a = http(svc.health_url, timeout=2.0)
            if not a.ok:
                return check_container(a.describe())
            w = http(f"{svc.url}/workers", timeout=2.0)
            if not w.ok:
                return waiting(f"/workers: {w.describe()}")
            missing = RouterWorkers.parse(w.body).missing(prefills, decodes)
            return waiting("not registered: " + ", ".join(missing)) if missing else READY

        return router_probe

    def _tick_table(self, t: Tick) -> Table:
        table = Table(box=None, show_header=False, pad_edge=False)
        for key, p in t.states.items():
            mark = "[green]ready[/green]" if p.state == "ready" else f"[yellow]{p.state}[/yellow]"
            line = self.latest_line.get(key, "")
            table.add_row(
                key, mark, f"{t.elapsed:5.1f}s", Text(p.detail), Text(line[-100:], style="dim")
            )
        return table

    def fail(self, svc: Service, e: WaitError) -> None:
        link = self.hosts.links[svc.host]
        container = f"{self.plan.hosts[svc.host].project}-{svc.name}"
        self.out.print(Text(f"error: {e}", style="red"))
        try:
            lines = link.engine.logs(container, tail=LOG_LINES_ON_FAILURE)
        except Exception as le:  # still report the failure itself
            lines = [f"(cannot read logs: {le})"]
        self.out.print(
            Text(f"--- last {LOG_LINES_ON_FAILURE} log lines of {svc.key} ---", style="bold")
        )
        for line in lines:
            self.out.print(Text.from_ansi(line), highlight=False, soft_wrap=True)
        self.out.print(Text("---", style="bold"))
        d = diagnose(lines)
        if d is not None:
            self.out.print(Text(f"diagnosis: {d.message}", style="bold red"), soft_wrap=True)
        if self.opts.rollback:
            self.out.print("rolling back (--rollback): removing this deployment's containers")
            _teardown(self.hosts, self.plan.deployment, self.out)
            _clean_files(self.hosts, self.inv, self.plan, False, self.out)
        else:
            kind = "exited" if isinstance(e, WaitFailed) else "is not healthy"
            if e.probe.detail.startswith(f"host {svc.host} lost"):
                kind = "is out of reach (its host was lost)"
            self.out.print(
                f"{svc.key} {kind}; everything started is left in place for inspection "
                f"(`pdboot logs INVENTORY {svc.key}`; `pdboot down INVENTORY` removes it)"
            )

    # ---- prove and report

    def prove(self) -> None:
        decodes = self.plan.stages[0]
        before = [KVCounters.parse(http(f"{d.url}/metrics").body) for d in decodes]
        body = {
            "model": self.plan.served_model_name,
            "messages": [{"role": "user", "content": "Say hello in five words."}],
            "max_tokens": 8,
            "temperature": 0,
        }
        a = http(f"{self.plan.endpoint}/v1/chat/completions", body=body, timeout=300.0)
        text = completion_text(a.body) if a.ok else ""
        if not a.ok or not text:
            self.out.print(
                Text(
                    f"error: test chat completion through the router failed: {a.describe()} "
                    f"{a.body[:500]}",
                    style="red",
                ),
                soft_wrap=True,
            )
            raise _Stop
        after = [KVCounters.parse(http(f"{d.url}/metrics").body) for d in decodes]
        total = KVCounters.total([a2 - b for a2, b in zip(after, before, strict=True)])
        verdict = kv_verdict(total)
        self.out.print(Text.assemble(("test completion: ", "bold"), repr(text.strip()[:80])))
        if not verdict.ok:
            self.out.print(Text(f"error: {verdict.message}", style="red"))
            raise _Stop
        style = "green" if verdict.confirmed else "yellow"
        self.out.print(Text(verdict.message, style=style))

    def show_endpoint(self) -> None:
        endpoint = f"{self.plan.endpoint}/v1"
        example = json.dumps(
            {
                "model": self.plan.served_model_name,
                "messages": [{"role": "user", "content": "Hello!"}],
                "max_tokens": 64,
            }
        )
        curl = (
            f"curl {self.plan.endpoint}/v1/chat/completions "
            f"-H 'Content-Type: application/json' -d {shlex.quote(example)}"
        )
        self.out.print(Text.assemble(("endpoint: ", "bold"), endpoint))
        self.out.print(Text.assemble(("model:    ", "bold"), self.plan.served_model_name))
        self.out.print(Text(curl), soft_wrap=True, highlight=False)

    def interrupted(self) -> None:
        self.out.print(Text("interrupted: stopped waiting", style="yellow"))
        try:
            values, _ = self.hosts.each(
                lambda _h, link: link.engine.containers(self.plan.deployment), 30
            )
        except KeyboardInterrupt:
            values = {}
        running = [o for obs in values.values() for o in obs]
        if running:
            self.out.print("running now:")
            for o in running:
                self.out.print(f"  {o.key:<28} {o.state}")
        else:
            self.out.print("nothing of this deployment is running")
        self.out.print("`pdboot up` continues from here; `pdboot down` removes it")


# --------------------------------------------------------------------------- down


@dataclass(frozen=True)
class DownOptions:
    purge: bool = False
    accept_new_host_keys: bool = False
    no_wait: bool = False


def down(inv: Inventory, opts: DownOptions, out: Console) -> int:
    held = _take_lock(inv, "down", opts.no_wait, opts.accept_new_host_keys, out)
    if isinstance(held, int):
        return held
    try:
        return _down(inv, opts, out)
    finally:
        if held is not None:
            held.release()


def _down(inv: Inventory, opts: DownOptions, out: Console) -> int:
    plan = build_plan(inv)
    hosts = open_hosts(inv, plan.hosts, accept_new_host_keys=opts.accept_new_host_keys)
    try:
        failed_any = bool(hosts.errors)
        if hosts.errors:
            _report_errors(out, "cannot reach (its containers are left as they are)", hosts.errors)
        # The token file is not needed by running containers (compose read it at
        # creation): remove it while the tiers stop. --purge waits for the containers,
        # since images in use cannot be removed.
        cleaned: list[bool] = []
        cleaner = threading.Thread(
            target=lambda: cleaned.append(_clean_files(hosts, inv, plan, False, out)),
            daemon=True,
        )
        if not opts.purge:
            cleaner.start()
        removed, errors = _teardown(hosts, plan.deployment, out)
        failed_any |= errors
        if opts.purge:
            cleaned.append(_clean_files(hosts, inv, plan, True, out))
        else:
            cleaner.join(OP_DEADLINE)
        failed_any |= not (cleaned and cleaned[0])
        if removed == 0 and not failed_any:
            out.print("nothing of this deployment is running")
        elif not failed_any:
            out.print(f"[green]down[/green]: removed {removed} container(s)")
        return EXIT_FAILED if failed_any else EXIT_OK
    finally:
        hosts.close()


def _teardown(hosts: Hosts, deployment: str, out: Console) -> tuple[int, bool]:
    """Remove this deployment's containers: router, prefill, decode. (count, any error)"""
    values, errors = hosts.each(lambda _h, link: link.engine.containers(deployment), OP_DEADLINE)
    if errors:
        _report_errors(out, "cannot list containers on", errors)
    observed = [o for obs in values.values() for o in obs]
    removed = 0
    any_error = bool(errors)
    for role, batch in plan_down(deployment, observed):
        ok = _stop_remove(hosts, batch, out)
        any_error |= not ok
        removed += len(batch)
        out.print(f"stopped {role}: " + ", ".join(o.key for o in batch))
    return removed, any_error


def _stop_remove(hosts: Hosts, batch: list[Observed], out: Console) -> bool:
    by_host: dict[str, list[str]] = {}
    for o in batch:
        by_host.setdefault(o.host, []).append(o.id)
    _, errors = hosts.each(
        lambda h, link: link.engine.stop_remove(by_host[h]), OP_DEADLINE, only=by_host
    )
    if errors:
        _report_errors(out, "cannot remove containers on", errors)
    return not errors


def _clean_files(hosts: Hosts, inv: Inventory, plan: Plan, purge: bool, out: Console) -> bool:
    """The token file always goes with the containers; --purge also takes the project
    directory and the images pdboot pulled."""
    pdir = project_dir(inv)

    def clean(host: str, link: Link) -> list[str]:
        notes: list[str] = []
        if purge:
            link.engine.remove_project_dir(pdir)
            for img in sorted({s.image for s in plan.hosts[host].services}):
                if link.engine.remove_image(img):
                    notes.append(f"removed image {img}")
        else:
            link.conn.run(["rm", "-f", f"{pdir}/{SECRETS_FILE}"])
        return notes

    values, errors = hosts.each(clean, OP_DEADLINE)
    for host, notes in values.items():
        for n in notes:
            out.print(f"{host}: {n}")
    if purge and not errors:
        out.print(f"purged {pdir} and pulled images on {len(values)} host(s)")
    if errors:
        _report_errors(out, "cannot clean up files on", errors)
    return not errors


# --------------------------------------------------------------------------- output


def _report_errors(out: Console, what: str, errors: dict[str, str]) -> None:
    for host, msg in errors.items():
        out.print(Text(f"error: {what} {host}: {msg}", style="red"), soft_wrap=True)


def recorded_findings(inv: Inventory, hosts: Hosts) -> Findings:
    """The RDMA findings `up` recorded on the hosts (only read for kv_transfer.rdma auto;
    an unreadable host counts as no record: the step that needs it reports the host)."""
    if inv.kv_transfer.rdma != "auto":
        return Findings({}, {}, "recorded")
    path = f"{project_dir(inv)}/{RECORD_FILE}"
    texts, _ = hosts.each(lambda _h, link: link.engine.read_file(path), OP_DEADLINE)
    return from_records(texts)


def default_preflight() -> PreflightFn:
    """The preflight `up` runs first: the full preflight, printed compactly (a line per
    host, then every failure and warning with its fix), with its RDMA findings."""

    def gate(inv: Inventory, out: Console, accept_new_host_keys: bool) -> PreflightOutcome:
        from pdboot import preflight, report  # report imports preflight; both are heavy

        result = preflight.run_preflight(inv, accept_new_host_keys=accept_new_host_keys)
        report.print_compact(result, out)
        return PreflightOutcome(result.ok, from_preflight(result))

    return gate
