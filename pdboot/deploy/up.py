"""`up`: preflight -> pull everywhere (parallel) -> ship compose + secrets -> start the
decode and prefill tiers together -> wait for every engine's /health -> start the router
-> wait for its /health and every engine in /workers -> the proxy in front -> one chat
completion through it with proof that decode pulled KV from prefill -> the watch service,
if any (held back until after the changes and checks: it acts on the router's workers too,
and its canaries would count in the proof) -> endpoint.

Both engine tiers start at once: NIXL needs nothing from the other tier at start-up (decode
handshakes lazily, at the first request carrying a prefill's KV parameters). Decisions come
from converge.py, waiting from waits.py; this module acts and emits events, never prints.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import replace

from pdboot.deploy.actions import (
    endpoint_event,
    pull_all,
    running_now,
    ship_all,
    start_all,
    watch_held_back,
)
from pdboot.deploy.admin import AdminFetch
from pdboot.deploy.changes import add_former_hosts, plan_only
from pdboot.deploy.down import clean_files, stop_remove, teardown
from pdboot.deploy.lockguard import under_lock
from pdboot.deploy.logscan import explain, report_lines
from pdboot.deploy.readiness import Prober, find_container
from pdboot.deploy.router_api import RouterApiError
from pdboot.deploy.seams import (
    OP_DEADLINE,
    HostsFactory,
    LockFactory,
    PreflightFn,
    default_hosts,
    default_lock,
    recorded_findings,
    report_errors,
    take_lock,
)
from pdboot.deploy.up_steps import ChangeSteps, Confirm, UpEnv, UpOptions, UpStopped
from pdboot.deploy.waits import Clock, MonotonicClock, Tick, WaitError, WaitFailed, wait_all
from pdboot.events import (
    Diagnosis,
    Done,
    Emit,
    Failure,
    ImageCheck,
    Interrupted,
    KVSpeed,
    KVVerdict,
    Note,
    PreflightDone,
    Rollback,
    ServiceAction,
    ServiceReady,
    StageStarted,
    TierReady,
    WaitTick,
)
from pdboot.exitcodes import EXIT_CHANGES, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from pdboot.inventory.rules import live_workers
from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.plan.converge import Observed, Step, orphans, plan_up
from pdboot.plan.model import SECRETS_FILE, Plan, Service
from pdboot.preflight import image_probe
from pdboot.preflight.findings import (
    Findings,
    describe,
    describe_nics,
    plan_from,
    records_to_ship,
)
from pdboot.transport.hosts import (
    Hosts,
    SecretError,
    api_key_headers,
    project_dir,
    read_secrets,
    register_secrets,
    secrets_env,
)
from pdboot.transport.http import HttpFn, http
from pdboot.transport.tls_files import read_tls
from pdboot.verify.diagnose import diagnose
from pdboot.verify.kv_proof import prove_kv
from pdboot.verify.pdcheck import check_speed, first_decode, gate_event, run_up_gate
from pdboot.verify.rootcause import READ_LINES, first_error
from pdboot.weights.hub import is_hub_model
from pdboot.weights.stage import pin_weights, remove_oneshots, with_stage_image

LOG_LINES_ON_FAILURE = 50
ENGINE_TIERS = ("decode", "prefill")
_Stop = UpStopped  # a step failed and was reported; `up` exits 1


def up(
    inv: Inventory,
    opts: UpOptions,
    emit: Emit,
    *,
    preflight: PreflightFn | None = None,
    clock: Clock | None = None,
    hosts_factory: HostsFactory = default_hosts,
    fetch: HttpFn = http,
    lock_factory: LockFactory = default_lock,
    confirm: Confirm | None = None,
) -> int:
    """Run `up`, emitting events; returns the exit code (also in the final Done event).
    The deployment lock is held from before preflight to the end (Ctrl-C included);
    `--plan` changes nothing and takes no lock. ``confirm``: asked (with the outages, in
    words) before a tier that cannot roll is replaced without --yes; None: refuse."""
    clk = clock or MonotonicClock()
    t0 = clk.now()
    if opts.plan_only:
        code = plan_only(inv, opts.rolling, opts.accept_new_host_keys, emit, hosts_factory)
        detail = {EXIT_OK: "no changes", EXIT_CHANGES: "changes"}.get(code, "")
        if code == EXIT_CHANGES and not opts.detailed_exitcode:
            code = EXIT_OK  # as terraform plan: changes are a success unless asked
        emit(Done("up", code, clk.now() - t0, detail))
        return code
    held = take_lock(
        emit, lock_factory, inv, "up", no_wait=opts.no_wait, accept_new=opts.accept_new_host_keys
    )
    if isinstance(held, int) or held is None:  # None is only for `down`
        code = held or EXIT_FAILED
    else:
        code = under_lock(emit, held, inv.router.host, "up", lambda checked: _up(
            inv, opts, checked, preflight, clk, hosts_factory, fetch, confirm))  # fmt: skip
    took = clk.now() - t0
    emit(Done("up", code, took, f"deployed in {took:.1f}s" if code == EXIT_OK else ""))
    return code


def _up(
    inv: Inventory,
    opts: UpOptions,
    emit: Emit,
    preflight: PreflightFn | None,
    clock: Clock,
    hosts_factory: HostsFactory,
    fetch: HttpFn,
    confirm: Confirm | None = None,
) -> int:
    try:
        token = read_secrets(inv) or None  # secrets.env's variables -> values
        pair = read_tls(inv)  # router.tls: shipped to the proxy (0600)
        tls = (pair.cert, pair.key) if pair is not None else None
    except SecretError as e:
        emit(Note(f"error: {e}", "error"))
        return EXIT_USAGE
    if token is not None:
        register_secrets(token)  # masked in anything pdboot logs or prints
    try:
        findings = _preflight(inv, opts, emit, preflight)
        hosts = hosts_factory(inv, list(build_plan(inv).hosts), opts.accept_new_host_keys)
        add_former_hosts(inv, hosts, emit, hosts_factory, opts.accept_new_host_keys)
    except _Stop:
        return EXIT_FAILED
    except KeyboardInterrupt:
        emit(Interrupted(started=False))
        return EXIT_INTERRUPTED
    try:
        env = UpEnv(clock, fetch, token, confirm, tls=tls)
        return _on_hosts(inv, opts, emit, hosts, findings, env)
    finally:  # Ctrl-C mid-pull: no staging or seed container (nor its secret) is left
        if is_hub_model(inv.model) and inv.weights.stage:
            remove_oneshots(inv, hosts)
        hosts.close()


def _preflight(
    inv: Inventory, opts: UpOptions, emit: Emit, preflight: PreflightFn | None
) -> Findings | None:
    if opts.skip_preflight or preflight is None:
        emit(PreflightDone(ok=True, skipped=True))
        return None
    emit(StageStarted("preflight"))
    outcome = preflight(inv, opts.accept_new_host_keys)
    emit(PreflightDone(ok=outcome.ok))
    if not outcome.ok:
        raise _Stop
    return outcome.rdma


def _on_hosts(
    inv: Inventory,
    opts: UpOptions,
    emit: Emit,
    hosts: Hosts,
    findings: Findings | None,
    env: UpEnv,
) -> int:
    if hosts.errors:
        report_errors(emit, "cannot reach", hosts.errors)
        return EXIT_FAILED
    try:
        if findings is None:
            # no preflight this run: what the last one recorded on each host
            findings = recorded_findings(inv, hosts)
    except KeyboardInterrupt:
        emit(Interrupted(started=False))
        return EXIT_INTERRUPTED
    pinned = pin_weights(inv, hosts, env.fetch, env.token, emit, opts.refresh_weights)
    if pinned is None:
        return EXIT_FAILED
    inv, env = pinned.inventory, replace(env, weights=pinned)  # model_revision: the commit
    if pinned.moved and opts.rolling:  # one commit on both tiers, at every moment
        emit(Note("a new weights commit is not rolled: the changed engines restart at once"))
        opts = replace(opts, rolling=False)
    plan = plan_from(inv, findings)
    if plan.unresolved:
        for line in plan.unresolved:
            emit(Note(f"error: {line}; run `up` with preflight (no count recorded)", "error"))
        return EXIT_FAILED
    for line in describe(inv, plan, findings, skipped=opts.skip_preflight) + describe_nics(plan):
        emit(Note(line))
    run = _Up(inv, plan, hosts, opts, emit, env)
    run.records, run.findings = records_to_ship(findings), findings
    run.port_gbps = findings.gbps
    try:
        run.run()
    except _Stop:
        return EXIT_FAILED
    except KeyboardInterrupt:
        run.interrupted()
        return EXIT_INTERRUPTED
    finally:
        run.admin.close()
    return EXIT_OK


class _Up(ChangeSteps):
    def __init__(
        self, inv: Inventory, plan: Plan, hosts: Hosts, opts: UpOptions, emit: Emit, env: UpEnv
    ) -> None:
        self.inv, self.plan, self.hosts, self.opts = inv, plan, hosts, opts
        # the router's worker API through the router host's SSH connection (admin.py)
        self.admin = AdminFetch(plan, hosts, env.fetch)
        self.emit, self.env = emit, replace(env, fetch=self.admin)
        self.dir = project_dir(inv)
        self.records: dict[str, str] = {}  # host -> RDMA record text to ship
        self.port_gbps: dict[str, float] = {}  # host -> RDMA port rate preflight read
        engines = {h: link.engine for h, link in hosts.links.items()}
        self.prober = Prober(plan, engines, {}, self.env.fetch, env.clock, relink=hosts.relink)
        self.live = live_workers(inv)

    # ---- the sequence

    def run(self) -> None:
        self.pull()
        self.check_image()
        self.ship()
        observed = self.observe()
        steps = [s for st in plan_up(self.plan, observed) for s in st]
        watch = [s for s in steps if s.service.role == "watch"]
        watch = watch_held_back(self.hosts, watch, self.emit)
        proxy = [s for s in steps if s.service.role == "proxy"]
        # --rollback asks for all or nothing; a roll that fails keeps the old engines serving
        if self.live and self.opts.rolling and not self.opts.rollback:
            self.roll(observed)
        else:
            self.recreate(observed)
        self.start_proxy(proxy)
        if self.opts.prove:
            self.prove()
            self.gate()
            if self.opts.speed:
                self.kv_speed()
        if watch:  # once the router serves every engine and up's checks are done
            self.start(watch)
            self.wait([s.service for s in watch], router=False)
        self.show_endpoint()

    # ---- pull

    def pull(self) -> None:
        wanted = {h: sorted({s.image for s in hp.services}) for h, hp in self.plan.hosts.items()}
        stage = self.env.weights.after_pull(self.env.token, self.emit)  # staging's image first
        if stage is not None:
            wanted = with_stage_image(wanted, stage[0], self.inv)
        self.emit(
            StageStarted("pull", tuple(f"{h}: {i}" for h, imgs in wanted.items() for i in imgs))
        )
        errors = pull_all(
            self.hosts, wanted, self.emit, self.inv.timeouts.pull_seconds, stage, self.dir
        )
        if errors:
            report_errors(self.emit, "pull failed on", errors)
            raise _Stop

    def check_image(self) -> None:
        """After the pull, before the start: the image asked on each engine host
        (pdboot/preflight/image_probe.py). Part of preflight: --skip-preflight skips it."""
        if self.opts.skip_preflight:
            return
        self.emit(StageStarted("image_check"))
        results = image_probe.image_caps_check(self.plan, self.hosts)
        # the image's own `vllm serve` parser on every engine command, and its versions
        for host, found in self.image_args().items():
            results.setdefault(host, []).extend(found)
        for host in sorted(results):
            for r in results[host]:
                self.emit(ImageCheck(host, r.id, r.status, r.message, r.fix))
        if image_probe.failed(results):
            self.emit(Note("image check failed: nothing was started", "error"))
            raise _Stop
        if not self.check_ucx():
            raise _Stop

    # ---- ship

    def ship(self) -> None:
        self.emit(StageStarted("ship"))
        token = self.env.token
        secrets = secrets_env(token) if token is not None else None
        pins = self.files_to_ship()
        errors = ship_all(self.hosts, self.plan, self.dir, secrets, self.records, self.inv, pins)
        if errors:
            report_errors(self.emit, "cannot ship the compose project to", errors)
            raise _Stop
        extra = f" and {SECRETS_FILE} (0600)" if secrets is not None else ""
        self.emit(
            Note(f"shipped compose.yaml{extra} to {self.dir} on {len(self.plan.hosts)} host(s)")
        )

    # ---- observe / converge

    def observe(self, only: Sequence[str] | None = None) -> list[Observed]:
        values, errors = self.hosts.each(
            lambda _h, link: link.engine.containers(self.plan.deployment), OP_DEADLINE, only=only
        )
        if errors:
            report_errors(self.emit, "cannot list containers on", errors)
            raise _Stop
        return [o for obs in values.values() for o in obs]

    def remove_orphans(self, observed: list[Observed]) -> None:
        gone = orphans(self.plan, observed)
        if not gone:
            return
        for o in gone:
            self.emit(ServiceAction(o.key, "remove", "no longer in the inventory"))
        stop_remove(self.hosts, gone, self.emit)

    # ---- start and wait

    def start(self, steps: list[Step]) -> None:
        self.emit(StageStarted("start", tuple(s.service.key for s in steps)))
        errors = start_all(self.hosts, self.plan, self.dir, steps, self.emit)
        if errors:
            report_errors(self.emit, "cannot start services on", errors)
            raise _Stop

    def locate(self, services: Sequence[Service]) -> None:
        """Each service's container, found by its labels (never by a built name)."""
        observed = self.observe(sorted({s.host for s in services}))
        for svc in services:
            o = find_container(observed, self.plan.deployment, svc)
            if o is not None:
                self.prober.container_ids[svc.key] = o.id

    def wait(self, services: list[Service], *, router: bool) -> None:
        self.locate(services)
        if router:
            engines = [s for s in self.plan.services() if s.is_engine]
            register = self.register_all if self.live else None
            if register is not None:
                # a running router may still list engines that are gone (removed above);
                # a router that does not answer yet is registered by its probe below
                with contextlib.suppress(RouterApiError):
                    register()
            probes = {s.key: self.prober.router(s, engines, register) for s in services}
            deadline = self.inv.timeouts.router_ready_seconds
            what = "/health 200 and every engine in /workers"
        else:
            probes = {s.key: self.prober.engine(s) for s in services}
            deadline = self.inv.timeouts.ready_seconds
            what = "/health 200"
        self.emit(StageStarted("wait", tuple(probes)))
        announced: set[str] = set()
        try:
            took = wait_all(
                probes,
                what=what,
                deadline=deadline,
                interval=self.inv.timeouts.poll_interval_seconds,
                clock=self.env.clock,
                on_tick=lambda t: self.on_tick(t, announced),
            )
        except WaitError as e:
            self.fail(next(s for s in services if s.key == e.key), e)
            raise _Stop from None
        tiers = (
            ("router",)
            if router
            else tuple(r for r in ENGINE_TIERS if any(s.role == r for s in services))
        )
        self.emit(TierReady(tiers, what, took))

    def on_tick(self, t: Tick, announced: set[str]) -> None:
        for key, p in t.states.items():
            if p.state == "ready" and key not in announced:
                announced.add(key)
                self.emit(ServiceReady(key, t.elapsed))
        rows = tuple(self.prober.service_wait(k, p.state, p.detail) for k, p in t.states.items())
        self.emit(WaitTick(t.elapsed, rows))

    def fail(self, svc: Service, e: WaitError) -> None:
        cid = self.prober.container_ids.get(svc.key)
        try:
            if cid is None:
                raise LookupError(f"no container labelled {svc.key} found")
            lines = self.hosts.links[svc.host].engine.logs(cid, tail=READ_LINES)
        except Exception as le:  # still report the failure itself
            lines = [f"(cannot read logs: {le})"]
        known = diagnose({svc.key: lines})
        self.emit(
            Failure(
                svc.key,
                str(e),
                isinstance(e, WaitFailed),
                tuple(lines[-LOG_LINES_ON_FAILURE:]),
                tuple(line for f in known for line in f.lines()),
                first_error(lines),
            )
        )
        if self.opts.rollback:
            self.emit(Rollback("--rollback: removing this deployment's containers"))
            teardown(self.hosts, self.plan.deployment, self.emit)
            clean_files(self.hosts, self.inv, self.plan, False, self.emit)
        else:
            kind = "exited" if isinstance(e, WaitFailed) else "is not healthy"
            if e.probe.host_lost:
                kind = "is out of reach (its host was lost)"
            self.emit(
                Note(
                    f"{svc.key} {kind}; everything started is left in place for inspection "
                    f"(`pdboot logs INVENTORY {svc.key}`; `pdboot down INVENTORY` removes it)"
                )
            )

    # ---- prove and report

    def prove(self) -> None:
        self.emit(StageStarted("prove"))
        proof = prove_kv(self.plan, self.env.fetch, api_key_headers(self.env.token or {}))
        if proof.verdict is None:
            self.emit(
                Note(
                    f"error: test chat completion through the router failed: {proof.failure}",
                    "error",
                )
            )
            self.explain("the test request failed")
            raise _Stop
        v = proof.verdict
        self.emit(KVVerdict(v.ok, v.confirmed, v.message, proof.text.strip(), v.cause))
        if not v.ok:
            self.explain("the KV path failed")
            raise _Stop

    def gate(self) -> None:
        """Same greedy answer through P/D and from one decode alone (pdboot.verify.gate's rule):
        a broken KV path fails `up`; a late divergence (numerics) only warns."""
        headers = api_key_headers(self.env.token or {})
        outcome = run_up_gate(self.plan, self.env.fetch, headers)
        self.emit(gate_event(outcome, first_decode(self.plan).key))
        if not outcome.ok:
            self.explain("the correctness gate failed")
            raise _Stop

    def kv_speed(self) -> None:
        """Measured KV throughput per prefill->decode pair next to the link's rate (warns,
        never fails `up`: a slow path still serves correct answers)."""
        results = check_speed(
            self.plan,
            self.env.fetch,
            api_key_headers(self.env.token or {}),
            self.port_gbps,
            self.inv.requirements.link_gbps,
            self.inv.kv_transfer.kv_connector,
        )
        self.emit(KVSpeed(tuple(r.event() for r in results)))

    def explain(self, context: str) -> None:
        """Known causes in every engine's and the router's recent logs."""
        lines = report_lines(explain(self.hosts, self.plan, self.plan.services()))
        self.emit(Diagnosis(context, tuple(lines)))

    def show_endpoint(self) -> None:
        self.emit(endpoint_event(self.plan))

    def interrupted(self) -> None:
        self.emit(Interrupted(started=True, running=running_now(self.hosts, self.plan)))
