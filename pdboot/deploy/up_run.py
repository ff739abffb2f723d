"""One `up` on opened hosts, once the plan is known: pull everywhere (parallel) -> the image
check -> ship compose + secrets -> converge once (plan/change_plan.py) and apply it
(converger.py over service_ops.py) -> the proxy -> one chat completion with proof that
decode pulled KV from prefill, the correctness gate, the KV speed -> the watch service, if
any (held back until after the changes and checks: it acts on the router's workers too, and
its canaries would count in the proof) -> the endpoint. Each step checks the run's
cancellation token first; a failed step is reported and raises UpStopped. The changes
themselves run as one plan of steps (converger.py, bluegreen.py) through executor.py."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

from pdboot.deploy import pair_guard
from pdboot.deploy.all_hosts import pull_all, report_errors, ship_all, watch_held_back
from pdboot.deploy.bluegreen import BlueGreen, BlueGreenFailed
from pdboot.deploy.converger import accept_outages, apply, apply_steps, proxy_steps
from pdboot.deploy.executor import Action, Executor, Run
from pdboot.deploy.frame import CancelToken
from pdboot.deploy.ingress import bring_up_ingress
from pdboot.deploy.logscan import explain, report_lines
from pdboot.deploy.planned_change import planned, show_changes, shown
from pdboot.deploy.router_admin import AdminFetch
from pdboot.deploy.router_swap import PointProxy, RouterSwapError
from pdboot.deploy.service_ops import ServiceOps, Where
from pdboot.deploy.tier_upgrade import Serving, upgrade_steps
from pdboot.deploy.up_options import UpEnv, UpOptions, UpStopped
from pdboot.deploy.weights.staging import with_stage_image
from pdboot.events import (
    Diagnosis,
    Emit,
    Endpoint,
    ImageCheck,
    Interrupted,
    KVSpeed,
    KVVerdict,
    Note,
    StageStarted,
)
from pdboot.exitcodes import EXIT_OK
from pdboot.inventory.rules import advertised_address
from pdboot.inventory.schema import Inventory
from pdboot.plan.change_plan import ChangeOptions, ChangePlan
from pdboot.plan.facts import PlanFacts
from pdboot.plan.model import (
    KEEPALIVED_CONF_FILE,
    ROUTER_SECRETS_FILE,
    SECRETS_FILE,
    WATCH_SECRETS_FILE,
    Plan,
)
from pdboot.plan.nixl_compat import ImageVersion
from pdboot.plan.proxy import proxy_files
from pdboot.plan.watch.sidecar import watch_secrets_text
from pdboot.preflight import image_probe, ucx_probe
from pdboot.preflight.findings import plan_from, records_to_ship
from pdboot.transport.hosts import (
    Hosts,
    api_key_headers,
    project_dir,
    router_secrets_env,
    secrets_env,
)
from pdboot.verify.kv_proof import prove_kv
from pdboot.verify.pdcheck import check_speed, first_decode, gate_event, run_up_gate


class UpRun:
    def __init__(
        self,
        inv: Inventory,
        plan: Plan,
        hosts: Hosts,
        opts: UpOptions,
        emit: Emit,
        env: UpEnv,
        token: CancelToken,
        changes: ChangeOptions,
        findings: PlanFacts,
    ) -> None:
        self.inv, self.plan, self.hosts, self.opts = inv, plan, hosts, opts
        self.emit, self.token, self.changes = emit, token, changes
        # the router's worker API through the router host's SSH connection (router_admin.py)
        self.admin = AdminFetch(plan, hosts, env.fetch)
        self.env = replace(env, fetch=self.admin)
        self.dir = project_dir(inv)
        self.findings = findings  # what the plan was built on
        self.records = records_to_ship(findings)  # host -> RDMA record text to ship
        self.port_gbps = findings.rdma_gbps  # host -> RDMA port rate preflight read
        self.versions: dict[str, ImageVersion] = {}  # image -> what the parser read in it
        # host -> the compose.yaml that ran before this up (pair_guard), read as up ships
        self.previous: Mapping[str, str] = MappingProxyType({})

    # ---- the sequence

    def run(self) -> int:
        """EXIT_OK once deployed; with apply off (`up --plan`), the same path up to the
        change plan, shown: EXIT_CHANGES when it changes anything, else EXIT_OK."""
        applying = not self.opts.plan_only
        if applying:
            self.pull()
            self.check_image()
            self.ship()
        ops = self.service_ops()  # on the plan as the UCX check left it
        observed = ops.observe()
        if applying:
            observed = ops.settle_spare(observed)  # a spare router a stopped swap left
        # converge, once: what to change; a plan read no pulled image (None)
        pulled = self.versions if applying else None
        decided = planned(self.emit, self.hosts, self.plan, observed, self.changes, pulled)
        change = decided.change
        if not applying:
            return shown(self.emit, decided)
        self.token.check()
        watch = watch_held_back(self.hosts, change.watch, self.emit)
        addresses = {h: advertised_address(spec) for h, spec in self.inv.hosts.items()}
        run = ops.executor_run(addresses)
        try:
            if decided.taken("outage") and decided.path is not None:
                accept_outages(
                    self.emit, [decided.path.why], yes=self.opts.yes, confirm=self.env.confirm
                )
            if decided.taken("blue-green") or decided.taken("degraded"):
                show_changes(self.emit, change, "converge")  # the table; the phases follow
            if decided.taken("blue-green"):  # a new build never rolls: beside the old
                self.blue_green(run, change)
            elif decided.taken("degraded") and decided.path is not None:
                # a tier of one replaced: the other tier serves alone meanwhile
                steps = self.tier_upgrade(change, new_build=not decided.path.compat.compatible)
                apply_steps(run, self.token, [*steps, *proxy_steps(change.proxy)])
            else:
                apply(run, self.token, change, yes=self.opts.yes, confirm=self.env.confirm)
        finally:
            run.close()
        # router.standby: its router, proxy and keepalived, before the checks through the
        # endpoint (with router.virtual_ip, the endpoint is the address keepalived holds)
        bring_up_ingress(ops.w, self.admin.fetch, change.ingress)
        if self.opts.prove:
            self.prove()
            self.gate()
            if self.opts.speed:
                self.kv_speed()
        if watch:  # once the router serves every engine and up's checks are done
            ops.start(watch)
            ops.wait([s.service for s in watch], router=False)
        self.token.check()
        self.emit(endpoint_event(self.plan))
        return EXIT_OK

    def blue_green(self, run: Run, change: ChangePlan) -> None:
        headers = api_key_headers(self.env.token or {})
        green = BlueGreen(self.plan, self.env.fetch, headers, self.emit)
        steps = green.steps([s for st in change.stages for s in st])
        executor = Executor(run, self.token)
        try:
            executor.execute([*steps, *proxy_steps(change.proxy)])
        except (BlueGreenFailed, RouterSwapError, UpStopped) as e:
            why = str(e) or "a step failed (above)"
            if not any(isinstance(s, PointProxy) for s in executor.done):
                why = f"green failed before any client reached it: {why}; blue serves again"
            self.emit(Note(f"error: blue/green stopped: {why}", "error"))
            raise UpStopped from None

    def tier_upgrade(self, change: ChangePlan, *, new_build: bool) -> list[Action]:
        headers = api_key_headers(self.env.token or {})
        engines = [s for st in change.stages for s in st]
        serving = Serving(self.env.clock)
        return upgrade_steps(
            self.plan, engines, change.orphans, serving, self.env.fetch, headers, new_build
        )

    def service_ops(self) -> ServiceOps:
        return ServiceOps(
            Where(
                self.inv,
                self.plan,
                self.hosts,
                self.emit,
                self.token,
                self.env.fetch,
                self.env.clock,
                live=self.changes.live,
                rollback=self.opts.rollback,
                headers=api_key_headers(self.env.token or {}),
                explain=self.explain,
                previous=self.previous,
            )
        )

    # ---- pull

    def pull(self) -> None:
        self.token.check()
        wanted = {h: sorted({s.image for s in hp.services}) for h, hp in self.plan.hosts.items()}
        # staging's image first; its thread stops at its next report once the lock is lost
        stage = self.env.weights.after_pull(self.env.token, self.token.checking(self.emit))
        if stage is not None:
            wanted = with_stage_image(wanted, stage[0], self.inv)
        self.emit(
            StageStarted("pull", tuple(f"{h}: {i}" for h, imgs in wanted.items() for i in imgs))
        )
        errors = pull_all(
            self.hosts,
            wanted,
            self.emit,
            self.inv.timeouts.pull_seconds,
            stage,
            self.dir,
            token=self.token,
        )
        self.token.check()  # a host's pull stopped by a lost lock is not a failed pull
        if errors:
            report_errors(self.emit, "pull failed on", errors)
            raise UpStopped

    def check_image(self) -> None:
        """After the pull, before the start: the image asked on each engine host
        (pdboot/preflight/image_probe.py). Part of preflight: --skip-preflight skips it."""
        if self.opts.skip_preflight:
            return
        self.token.check()
        self.emit(StageStarted("image_check"))
        # with the image's own `vllm serve` parser on every engine command, side by side
        results = image_probe.image_checks(self.plan, self.hosts, versions=self.versions)
        for host in sorted(results):
            for r in results[host]:
                self.emit(ImageCheck(host, r.id, r.status, r.message, r.fix))
        if image_probe.failed(results):
            self.emit(Note("image check failed: nothing was started", "error"))
            raise UpStopped
        if not self.check_ucx():
            raise UpStopped

    def check_ucx(self) -> bool:
        """After the image check: each engine's UCX backend as it will create it
        (preflight/ucx_probe.py); ``rdma: auto`` may move hosts to TCP (plan and records
        follow). False when an engine's fails: nothing may start."""
        before = self.findings
        self.plan, self.findings, ok = ucx_probe.check(
            self.plan,
            self.hosts,
            before,
            self.inv.kv_transfer.rdma,
            self.emit,
            lambda f: plan_from(self.inv, f),
        )
        if self.findings is not before:  # rdma auto fell back to TCP somewhere
            self.records = records_to_ship(self.findings)
        if not ok:
            self.emit(Note("UCX check failed: nothing was started", "error"))
        return ok

    # ---- ship

    def ship(self) -> None:
        self.token.check()
        self.emit(StageStarted("ship"))
        token = self.env.token
        secrets = secrets_env(token) if token is not None else None
        pins = self.files_to_ship()
        errors = ship_all(self.hosts, self.plan, self.dir, secrets, self.records, self.inv, pins)
        if errors:
            report_errors(self.emit, "cannot ship the compose project to", errors)
            raise UpStopped
        extra = f" and {SECRETS_FILE} (0600)" if secrets is not None else ""
        self.emit(
            Note(f"shipped compose.yaml{extra} to {self.dir} on {len(self.plan.hosts)} host(s)")
        )

    def files_to_ship(self) -> dict[str, dict[str, str]]:
        """Host -> files beside compose.yaml: the weights pin, the proxy's nginx.conf and its
        key check (PRIVATE_FILES: 0600)."""
        out = {h: dict(files) for h, files in self.env.weights.pin_files().items()}
        if self.changes.rolls:  # what a roll's failed pair brings back
            self.previous = pair_guard.keep_previous(self.hosts, self.plan, self.dir)
        for host, text in self.previous.items():
            out.setdefault(host, {})[pair_guard.PREVIOUS_COMPOSE] = text
        key = (self.env.token or {}).get("VLLM_API_KEY")
        here = out.setdefault(self.inv.router.host, {})
        here.update(proxy_files(self.inv, key, self.env.tls))
        router_env = router_secrets_env(self.env.token or {})
        if router_env is not None and self.plan.router.env_file == ROUTER_SECRETS_FILE:
            here[ROUTER_SECRETS_FILE] = router_env  # the API key alone (PRIVATE_FILES: 0600)
        if self.inv.router.standby is not None:  # the standby's proxy and router: the same files
            there = out.setdefault(self.inv.router.standby, {})
            there.update(proxy_files(self.inv, key, self.env.tls))
            if router_env is not None and self.plan.router.env_file == ROUTER_SECRETS_FILE:
                there[ROUTER_SECRETS_FILE] = router_env
        for host, conf in self.plan.keepalived_confs.items():
            out.setdefault(host, {})[KEEPALIVED_CONF_FILE] = conf
        watch_env = watch_secrets_text(key) if self.plan.watch is not None else None
        if watch_env is not None:
            here[WATCH_SECRETS_FILE] = watch_env
        return out

    # ---- prove and report

    def prove(self) -> None:
        self.token.check()
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
            raise UpStopped
        v = proof.verdict
        self.emit(KVVerdict(v.ok, v.confirmed, v.message, proof.text.strip(), v.cause))
        if not v.ok:
            self.explain("the KV path failed")
            raise UpStopped

    def gate(self) -> None:
        """Same greedy answer through P/D and from one decode alone (pdboot.verify.gate's rule):
        a broken KV path fails `up`; a late divergence (numerics) only warns."""
        self.token.check()
        headers = api_key_headers(self.env.token or {})
        outcome = run_up_gate(self.plan, self.env.fetch, headers)
        self.emit(gate_event(outcome, first_decode(self.plan).key))
        if not outcome.ok:
            self.explain("the correctness gate failed")
            raise UpStopped

    def kv_speed(self) -> None:
        """Measured KV throughput per prefill->decode pair next to the link's rate (warns,
        never fails `up`: a slow path still serves correct answers)."""
        self.token.check()
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
        found = explain(self.hosts, self.plan, self.plan.services(), self.env.clock)
        lines = report_lines(found)
        self.emit(Diagnosis(context, tuple(lines)))

    def interrupted(self) -> None:
        self.emit(Interrupted(started=True, running=running_now(self.hosts, self.plan)))


def endpoint_event(plan: Plan) -> Endpoint:
    """What `up` ends with: the endpoint, the model name clients send, and a curl to try."""
    example = json.dumps(
        {
            "model": plan.served_model_name,
            "messages": [{"role": "user", "content": "Hello!"}],
            "max_tokens": 64,
        }
    )
    curl = (
        f"curl {plan.endpoint}/v1/chat/completions "
        f"-H 'Content-Type: application/json' -d {shlex.quote(example)}"
    )
    return Endpoint(f"{plan.endpoint}/v1", plan.served_model_name, curl)


def running_now(hosts: Hosts, plan: Plan) -> tuple[tuple[str, str], ...]:
    """What runs of the deployment when `up` is interrupted (a second Ctrl-C: nothing)."""
    try:
        values, _ = hosts.each(lambda _h, link: link.engine.containers(plan.deployment), 30)
    except KeyboardInterrupt:
        values = {}
    return tuple((o.key, o.state) for obs in values.values() for o in obs)
