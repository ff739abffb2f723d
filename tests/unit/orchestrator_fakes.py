"""A fake world for driving `up`/`down` in milliseconds: fake hosts whose fake engine keeps
containers in memory, a fake HTTP function answering /health, /workers, /metrics and chat
completions from that state, and the FakeClock of pdboot.deploy.waits. The fake engine
implements pdboot.transport.hosts.EngineOps; pulls are fed REAL docker pull events through
transport.docker_parse.PullProgress."""

from __future__ import annotations

import itertools
import json
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from pdboot.deploy import versions
from pdboot.deploy.down import DownOptions, down
from pdboot.deploy.up import up
from pdboot.deploy.up_options import UpOptions
from pdboot.deploy.waits import FakeClock
from pdboot.events import Emit, Event
from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.plan.converge import Observed
from pdboot.plan.model import LABEL_CONFIG_HASH, LABEL_DEPLOYMENT, LABEL_ENGINE, LABEL_ROLE
from pdboot.plan.proxy import UPSTREAM_HOME, UPSTREAM_SPARE, route_text
from pdboot.plan.router_slots import SPARE_COMPOSE, SPARE_NAME, spare_router
from pdboot.preflight import image_args
from pdboot.transport.connection import CommandResult
from pdboot.transport.docker_host import PullResult
from pdboot.transport.docker_parse import EngineError, EngineLost, PullProgress
from pdboot.transport.hosts import Hosts, Link
from pdboot.transport.http import HttpAnswer
from pdboot.transport.lock import LockBusy
from tests.unit.builders import changed, inventory_doc, load
from tests.unit.paths import FIXTURES

# builders' 1P1D (p1 -> d1, router on r) with short waits and no weights staging
# (weights/test_pin_and_verdicts.py and tests/e2e/test_weights_staged_once_per_host.py cover it)
FAKE = inventory_doc(
    overrides={
        "timeouts": {"ready_seconds": 60, "router_ready_seconds": 30, "poll_interval_seconds": 0.5},
        "weights": {"stage": False},
    }
)

# the daemon's own events for one small layer (docker pull ... stream=True, decode=True)
UCX_OK = (
    0,
    'PDBOOT_UCX {"backend": true, "ib": ["mlx5_0:1 ACTIVE"], "net": ["eth0", "lo"], '
    '"uverbs": true}',
)
FAKE_DIGEST = "sha256:" + "ab" * 32  # the one PULL_EVENTS ends with
PULL_EVENTS: list[dict[str, Any]] = [
    {"status": "Pulling from vllm/vllm-openai", "id": "v0.33.0"},
    {"status": "Pulling fs layer", "progressDetail": {}, "id": "a1b2c3"},
    {"status": "Downloading", "progressDetail": {"current": 512, "total": 1024}, "id": "a1b2c3"},
    {"status": "Download complete", "progressDetail": {}, "id": "a1b2c3"},
    {"status": "Pull complete", "progressDetail": {}, "id": "a1b2c3"},
    {"status": "Digest: sha256:" + "ab" * 32},
    {"status": "Status: Downloaded newer image for vllm/vllm-openai:v0.33.0"},
]


ARGS_OK = (
    0,
    'PDBOOT_ARGS {"engines": {"prefill@p1": "", "decode@d1": ""}, '
    '"version": "0.34.0", "options": ["--port"], "total_s": 2.5}',
)
# the after-pull image probe's answer: the stand-in image's, verbatim (GPUs 12.0, arch list
# with sm_120, NIXL's UCX backend with cuda and ib transports)
CAPS = FIXTURES / "image_caps"
PROBE_OK = (0, (CAPS / "standin-rtx6000.txt").read_text())


def inventory(overrides: Mapping[str, Any] | None = None) -> Inventory:
    """The fake world's deployment, with ``overrides`` (builders.changed's dotted paths)."""
    return load(changed(FAKE, overrides or {}))


@dataclass
class Container:
    id: str
    host: str
    labels: dict[str, str]
    started: float
    build: str = ""  # the inventory's image when it started: what NIXL's hash sees here
    command: tuple[str, ...] = ()  # what docker inspect reports (Config.Cmd, Config.Env)
    env: tuple[tuple[str, str], ...] = ()
    state: str = "running"
    exit_code: int | None = None
    logs: list[str] = field(default_factory=list)


@dataclass
class World:
    inv: Inventory
    clock: FakeClock = field(default_factory=FakeClock)
    load: dict[str, float] = field(default_factory=lambda: {"decode": 1.0, "prefill": 1.0})
    crash: dict[str, str] = field(default_factory=dict)  # role -> its last log line
    never_healthy: set[str] = field(default_factory=set)
    corrupt_kv: bool = False  # the router's answer differs (a broken KV path)
    late_divergence: bool = False  # ... differs after a long common prefix (numerics)
    pull_bytes: int = 4096  # KV bytes one pull moves
    pull_seconds: float = 0.001
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (url, body)
    interrupt_on: str | None = None  # a URL suffix whose request raises KeyboardInterrupt
    containers: dict[str, Container] = field(default_factory=dict)
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (op, host, what)
    graces: list[int] = field(default_factory=list)  # each stop_remove's SIGKILL grace
    shipped: dict[str, dict[str, str]] = field(default_factory=dict)  # host -> extra files
    kv_pulls: int = 0
    probe: tuple[int, str] = PROBE_OK  # what run_once (the image probe) answers
    # what the image's own `vllm serve` parser answers (pdboot/preflight/image_args.py): the
    # shape of its real answer on the emulated package, every command accepted
    args_probe: tuple[int, str] = ARGS_OK
    # the UCX probe (preflight/ucx_probe.py): host -> (a device the container lacks there,
    # what the probe answers when the engine's UCX_NET_DEVICES names it); else UCX_OK
    ucx: dict[str, tuple[str, tuple[int, str]]] = field(default_factory=dict)
    lost_at: dict[str, float] = field(default_factory=dict)  # host -> when its link goes
    lock_holder: str | None = None  # another run's holder text: the deployment lock is busy
    locks: list[str] = field(default_factory=list)  # "take up", "release up", ...
    # the router's live worker list (vllm-router --enable-igw): url -> worker_type; a
    # (re)started router starts empty, as the real one does in IGW mode
    registered: dict[str, str] = field(default_factory=dict)
    # the router swap's spare router (plan/router_slots.py): its worker list while it runs
    # (None: not running), and where the proxy's route file points
    spare: dict[str, str] | None = None
    route: str = "home"
    # per engine URL: what its /metrics says is in flight (num_requests_running); each read
    # counts one down, so a drain sees it reach 0 after that many polls
    in_flight: dict[str, int] = field(default_factory=dict)
    lock_lost_at: float | None = None  # fake-clock time the held lock counts as lost
    # host -> images there before pdboot came (side-loaded): a pull finds them present
    side_loaded: dict[str, set[str]] = field(default_factory=dict)
    pulled_record: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    # host -> fake-clock time from which listing its containers fails (a cut Docker read)
    unreadable_from: dict[str, float] = field(default_factory=dict)
    # issue 29: engines of different builds (images) refuse each other's KV at the NIXL
    # handshake, as real vLLM does; `up` keeps each host's compose file, and the previous
    # inventory is what compose.previous.yaml starts (a roll bringing an old engine back)
    hash_checks: bool = False
    running_version: str = "0.34.0"  # what a running engine's vLLM answers (ARGS_OK's)
    image_version: str = "0.34.0"  # what a new image's answers when asked alone
    previous_inv: Inventory | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: Iterable[int] = field(default_factory=itertools.count)

    def hosts(self, inv: Inventory, names: Iterable[str], _accept: bool) -> Hosts:
        self.calls.append(("open", ",".join(names), ""))
        return Hosts(links={h: Link(FakeConn(self, h), FakeEngine(self, h)) for h in names})

    def take_lock(
        self, inv: Inventory, operation: str, wait: bool, _accept: bool, say: Callable[[str], None]
    ) -> FakeLock:
        """A pdboot.deploy.frame.LockFactory: busy while ``lock_holder`` is set (like lock.take
        with --no-wait), else held at once."""
        if self.lock_holder is not None:
            raise LockBusy(f"{self.lock_holder} (--no-wait: not waiting)")
        self.locks.append(f"take {operation}")
        return FakeLock(self, operation)

    def is_lost(self, host: str) -> bool:
        return host in self.lost_at and self.clock.now() >= self.lost_at[host]

    def of_role(self, role: str) -> list[Container]:
        return [c for c in self.containers.values() if c.labels[LABEL_ROLE] == role]

    def healthy(self, role: str) -> bool:
        cs = [c for c in self.of_role(role) if c.state == "running"]
        return bool(cs) and all(
            role not in self.never_healthy
            and self.clock.now() >= c.started + self.load.get(role, 0)
            for c in cs
        )

    def serving(self, svc: Any) -> bool:
        """The engine container of this service runs and has loaded (by host, role, index)."""
        cs = [
            c
            for c in self.of_role(svc.role)
            if c.host == svc.host
            and c.labels.get(LABEL_ENGINE, "0") == str(svc.engine_index)
            and c.state == "running"
        ]
        return (
            bool(cs)
            and svc.role not in self.never_healthy
            and all(self.clock.now() >= c.started + self.load.get(svc.role, 0) for c in cs)
        )

    def fetch(
        self,
        url: str,
        *,
        timeout: float = 2.0,
        body: Any = None,
        method: str | None = None,
        **_: Any,
    ) -> HttpAnswer:
        if self.interrupt_on and url.endswith(self.interrupt_on):
            raise KeyboardInterrupt
        plan = build_plan(self.inv)
        spare = spare_router(self.inv, plan.router)
        if url.startswith(spare.url + "/"):
            return self.spare_router(url[len(spare.url) :], body, method)
        svc = next((s for s in plan.services() if url.startswith(s.url)), None)
        if svc is None:  # an engine the inventory no longer has (being removed)
            return self.gone_engine(url)
        path = url[len(svc.url) :]
        role = svc.role
        if role == "proxy":  # the public endpoint: the client API in front of the router
            if not self.of_role("proxy") or not self.of_role("router"):
                return HttpAnswer(0, "", "connection refused")
            if path != "/health" and not path.startswith("/v1/"):
                return HttpAnswer(404, "")  # the worker API is not on the public port
            role = "router"
        elif svc.role == "router":
            if not self.of_role("router"):
                return HttpAnswer(0, "", "connection refused")
        elif not self.serving(svc):
            return HttpAnswer(0, "", "connection refused")
        if path == "/health":
            return HttpAnswer(200, "")
        if svc.role == "router" and path.startswith("/workers"):
            return self.router_workers(path, body, method)
        if path == "/metrics":
            # vLLM 0.33's real names: a pull per request, all but the last prompt token
            # from the prefill (the decode computes that one itself)
            n = self.kv_pulls
            left = self.in_flight.get(svc.url, 0)
            self.in_flight[svc.url] = max(0, left - 1)
            return HttpAnswer(
                200,
                f"vllm:num_requests_running {left}\n"
                "vllm:num_requests_waiting 0\n"
                f"vllm:nixl_xfer_time_seconds_count {n}\n"
                f"vllm:nixl_xfer_time_seconds_sum {n * self.pull_seconds}\n"
                f"vllm:nixl_bytes_transferred_sum {n * self.pull_bytes}\n"
                f'vllm:prompt_tokens_by_source_total{{source="external_kv_transfer"}} {n * 9}\n'
                f'vllm:prompt_tokens_by_source_total{{source="local_compute"}} {n}\n',
            )
        if path == "/v1/chat/completions":
            self.kv_pulls += 1
            answer = {
                "choices": [{"message": {"content": "Hello!"}}],
                "usage": {"prompt_tokens": 10},
            }
            return HttpAnswer(200, json.dumps(answer))
        if path == "/v1/completions":
            return self.completion(role, dict(body or {}), url, self.build_of(svc))
        return HttpAnswer(404, "")

    def gone_engine(self, url: str) -> HttpAnswer:
        """An orphan's /metrics while it drains: what ``in_flight`` says, counted down."""
        base = url.removesuffix("/metrics")
        if base not in self.in_flight:
            return HttpAnswer(0, "", "connection refused")
        left = self.in_flight[base]
        self.in_flight[base] = max(0, left - 1)
        return HttpAnswer(200, f"vllm:num_requests_running {left}\nvllm:num_requests_waiting 0\n")

    def spare_router(self, path: str, body: Any, method: str | None) -> HttpAnswer:
        """The spare router: its /health, and its own worker list (calls filed as "spare")."""
        if self.spare is None:
            return HttpAnswer(0, "", "connection refused")
        if path == "/health":
            return HttpAnswer(200, "")
        if path.startswith("/workers"):
            return self.router_workers(path, body, method, spare=True)
        return HttpAnswer(404, "")

    def router_workers(
        self, path: str, body: Any, method: str | None, *, spare: bool = False
    ) -> HttpAnswer:
        """vllm-router 0.1.17's worker API in IGW mode: GET, POST, DELETE /workers."""
        what = f"{path}/{urllib.parse.quote(str(body['url']), safe='')}" if body else path
        which = "spare" if spare else "router"
        self.calls.append((which, method or ("POST" if body else "GET"), what))
        listed = self.spare if spare and self.spare is not None else self.registered
        if method == "DELETE":
            url = urllib.parse.unquote(path[len("/workers/") :])
            if listed.pop(url, None) is None:
                err = {"error": f"Worker with URL {url} not found", "code": "WORKER_NOT_FOUND"}
                return HttpAnswer(400, json.dumps(err))
            return HttpAnswer(200, json.dumps({"success": True}))
        if body is not None:
            listed[str(body["url"])] = str(body["worker_type"])
            return HttpAnswer(200, json.dumps({"success": True}))
        plan = build_plan(self.inv)
        by_url = {s.url: s for s in plan.services()}
        if "--enable-igw" not in plan.router.command:  # static lists: the plan's engines
            workers = [
                {"url": s.url, "worker_type": s.role, "is_healthy": True}
                for s in plan.services()
                if s.is_engine and self.healthy(s.role)
            ]
            return HttpAnswer(200, json.dumps({"workers": workers}))
        workers = [
            {
                "url": u,
                "worker_type": t,
                "is_healthy": u.rstrip("/") in by_url and self.serving(by_url[u.rstrip("/")]),
            }
            for u, t in listed.items()
        ]
        return HttpAnswer(200, json.dumps({"workers": workers}))

    GATE_ANSWER = " Venus is the hottest planet. Earth has liquid water. Mars is red and cold."

    def build_of(self, svc: Any) -> str:
        return next(
            (
                c.build
                for c in self.of_role(svc.role)
                if c.host == svc.host
                and c.labels.get(LABEL_ENGINE, "0") == str(svc.engine_index)
                and c.state == "running"
            ),
            "",
        )

    def completion(self, role: str, body: dict[str, Any], url: str, build: str = "") -> HttpAnswer:
        self.requests.append((url, body))
        params = body.get("kv_transfer_params")
        if role == "decode" and params and self.hash_checks and params.get("build") != build:
            return HttpAnswer(500, '{"error": "Internal server error"}')
        if role == "prefill":
            kvp = {
                "do_remote_prefill": True,
                "remote_engine_id": "e1",
                "remote_block_ids": [[1]],
                "build": build,
            }
            return HttpAnswer(
                200,
                json.dumps(
                    {
                        "choices": [{"text": "x"}],
                        "kv_transfer_params": kvp,
                        "usage": {"prompt_tokens": 900},
                    }
                ),
            )
        text = self.GATE_ANSWER
        if role == "router" or params:
            self.kv_pulls += 1
            if self.corrupt_kv and role == "router":
                text = " the the the , , of of"
            elif self.late_divergence and role == "router":
                text = text.replace("cold.", "dusty.")
        return HttpAnswer(200, json.dumps({"choices": [{"text": text}]}))


@dataclass
class FakeLock:
    world: World
    operation: str

    def release(self) -> None:
        self.world.locks.append(f"release {self.operation}")

    @property
    def lost_reason(self) -> str | None:
        """Lost from ``world.lock_lost_at`` on (the fake clock): as lock_holder.HeldLock after its
        heartbeats stopped reaching the host."""
        at = self.world.lock_lost_at
        if at is not None and self.world.clock.now() >= at:
            return "no heartbeat reached ingress for 21s (fake)"
        return None


@dataclass
class FakeConn:
    """A transport.connection.Connection that records what `up` runs on the host."""

    world: World
    host: str

    @property
    def name(self) -> str:
        return self.host

    @property
    def lost(self) -> str | None:
        return None

    def run(
        self, cmd: Sequence[str] | str, timeout: float | None = None, stdin: str | None = None
    ) -> CommandResult:
        text = cmd if isinstance(cmd, str) else " ".join(cmd)
        self.world.calls.append(("run", self.host, text))
        w = self.world
        if SPARE_COMPOSE in text and " up " in text:  # the router swap starts the spare
            w.spare = {}
            w.calls.append(("swap", self.host, "start spare"))
        elif SPARE_NAME in text and text.startswith("docker stop"):
            w.spare = None
            w.calls.append(("swap", self.host, "stop spare"))
        elif text.startswith("docker exec") and "read -r l" in text:  # where the proxy points
            return CommandResult(
                0, route_text(UPSTREAM_SPARE if w.route == "spare" else UPSTREAM_HOME), "", 0.0
            )
        elif text.startswith("docker exec") and "pdboot-route" in text:  # the proxy's route
            w.route = "spare" if UPSTREAM_SPARE in text else "home"
            w.calls.append(("swap", self.host, f"proxy -> {w.route}"))
        return CommandResult(0, "", "", 0.0)

    def put_text(self, path: str, text: str, mode: int = 0o644) -> None:
        self.world.calls.append(("put_text", self.host, path))

    def close(self) -> None:
        pass


@dataclass
class FakeEngine:
    """pdboot.transport.hosts.EngineOps over the world's containers."""

    world: World
    host: str

    def _call(self, op: str, what: str = "") -> None:
        with self.world.lock:
            self.world.calls.append((op, self.host, what))

    def pull(self, image: str, on_progress: Callable[[PullProgress], None]) -> PullResult:
        self._call("pull", image)
        if image in self.world.side_loaded.get(self.host, set()):
            return PullResult(image, False, FAKE_DIGEST, "already present")
        p = PullProgress(image)
        for e in PULL_EVENTS:
            p.feed(e)
            on_progress(p)
        return PullResult(image, True, p.digest)

    def ship(
        self, project_dir: str, compose_text: str, secrets_text: Any, extra: Any = None
    ) -> None:
        self._call("ship", project_dir)
        self.world.shipped[self.host] = dict(extra or {})

    def containers(self, deployment: str) -> list[Observed]:
        since = self.world.unreadable_from.get(self.host)
        if since is not None and self.world.clock.now() >= since:
            raise EngineError(
                self.host, "cannot list containers: ('Connection aborted.', "
                "OSError('Socket is closed'))"
            )  # fmt: skip
        with self.world.lock:
            mine = [c for c in self.world.containers.values() if c.host == self.host]
        return [self._observed(c) for c in mine if c.labels[LABEL_DEPLOYMENT] == deployment]

    def _observed(self, c: Container) -> Observed:
        return Observed(
            self.host,
            c.id,
            f"x-{c.id}",
            dict(c.labels),
            c.state,
            image=c.build,
            exit_code=c.exit_code,
            command=c.command,
            env=c.env,
        )

    def _reach(self) -> None:
        if self.world.is_lost(self.host):  # what the keepalive watchdog reports
            raise EngineLost(self.host, "no answer to SSH keepalives for 12s")

    def inspect(self, container_id: str) -> Observed:
        self._reach()
        return self._observed(self.world.containers[container_id])

    def logs(
        self,
        container_id: str,
        tail: int | None = 50,
        since: int | None = None,
        timestamps: bool = False,
    ) -> list[str]:
        self._reach()
        c = self.world.containers[container_id]
        lines = c.logs[-tail:] if tail is not None else list(c.logs)
        if timestamps:  # Docker's form: RFC 3339 with nanoseconds, then a space
            at = datetime.fromtimestamp(c.started, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
            lines = [f"{at}.000000000Z {line}" for line in lines]
        return lines

    def follow_logs(
        self,
        container_id: str,
        tail: int | None = 50,
        since: int | None = None,
        timestamps: bool = False,
    ) -> Iterator[str]:
        yield from self.logs(container_id, tail, since, timestamps)

    def compose_up(
        self,
        project_dir: str,
        project: str,
        service: str | Sequence[str],
        *,
        recreate: bool,
        timeout: float,
        file: str = "compose.yaml",
    ) -> None:
        names = [service] if isinstance(service, str) else list(service)
        self._call("compose_up", ",".join(names) + ("" if file == "compose.yaml" else f" ({file})"))
        inv = self.world.inv if file == "compose.yaml" else self.world.previous_inv
        assert inv is not None, f"{file}: no previous inventory in this world"
        for name in names:
            self._start(name, inv)

    def _start(self, name: str, inv: Inventory) -> None:
        plan = build_plan(inv)
        svc = next(s for s in plan.services() if s.host == self.host and s.name == name)
        role = svc.role
        with self.world.lock:
            for cid in [
                c.id
                for c in self.world.of_role(role)
                if c.host == self.host and c.labels.get(LABEL_ENGINE, "0") == str(svc.engine_index)
            ]:
                del self.world.containers[cid]
            if role == "router":
                self.world.registered.clear()  # IGW mode: a new router knows no workers
            cid = f"c{next(iter(self.world._ids))}"
            labels = {**dict(svc.labels), LABEL_CONFIG_HASH: svc.config_hash}
            c = Container(
                cid,
                self.host,
                labels,
                self.world.clock.now(),
                svc.image,
                svc.command,
                svc.environment,
                logs=[f"{role} loading"],
            )
            if role in self.world.crash:
                c.state, c.exit_code = "exited", 1
                c.logs.append(self.world.crash[role])
            self.world.containers[cid] = c

    def stop_remove(self, container_ids: list[str], grace: int = 30) -> None:
        self._call("stop_remove", ",".join(container_ids))
        with self.world.lock:
            self.world.graces.append(grace)
            for cid in container_ids:
                self.world.containers.pop(cid, None)

    def read_file(self, path: str) -> str | None:
        if path.endswith("/compose.yaml") and self.world.previous_inv is not None:
            with self.world.lock:  # what runs there (previous_inv's): its config hash labels
                ran = [
                    c.labels[LABEL_CONFIG_HASH]
                    for c in self.world.containers.values()
                    if c.host == self.host
                ]
            return f"compose.yaml of {self.host}: {' '.join(ran)}"
        return None

    def local_digests(self, image: str) -> list[str]:
        return [FAKE_DIGEST]

    def record_pulled(self, project_dir: str, entries: list[tuple[str, str]]) -> None:
        with self.world.lock:
            self.world.pulled_record.setdefault(self.host, []).extend(entries)

    def pulled(self, project_dir: str) -> list[tuple[str, str]]:
        return list(self.world.pulled_record.get(self.host, []))

    def run_once(self, argv: list[str], timeout: float) -> tuple[int, str]:
        if argv[:3] == ["docker", "image", "inspect"]:  # the argument check's image ID
            self._call("inspect_id", argv[-1])
            return 1, f"Error: No such image: {argv[-1]}"  # no ID: no cache
        if len(argv) > 1 and argv[-2] == image_args.PROBE:
            self._call("run_once_args", argv[-4])
            return self.world.args_probe
        if argv[:2] == ["docker", "exec"]:  # a running engine's vLLM version (deploy/versions)
            self._call("exec_version", argv[2])
            return 0, f'PDBOOT_VERSION {{"version": "{self.world.running_version}"}}'
        if argv[-1:] == [versions.SCRIPT]:  # a new image's, when the image check was skipped
            self._call("image_version", argv[-3])
            return 0, f'PDBOOT_VERSION {{"version": "{self.world.image_version}"}}'
        if any("PDBOOT_UCX" in a for a in argv):
            env = " ".join(a for a in argv if a.startswith("UCX_"))
            self._call("ucx_probe", env)
            lacks, answer = self.world.ucx.get(self.host, ("", UCX_OK))
            return answer if lacks and lacks in env else UCX_OK
        self._call("run_once", argv[-1] if argv else "")
        return self.world.probe

    def remove_project_dir(self, project_dir: str) -> None:
        self._call("remove_project_dir", project_dir)

    def remove_image(self, image: str) -> bool:
        self._call("remove_image", image)
        return True

    def close(self) -> None:
        pass


class Recorder:
    """An emit that keeps every event."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, e: Event) -> None:
        self.events.append(e)

    def of(self, cls: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, cls)]


def up_in(
    world: World,
    opts: UpOptions | None = None,
    emit: Emit | None = None,
    *,
    inv: Inventory | None = None,
    **kw: Any,
) -> int:
    """`up` against ``world`` (its hosts, lock, HTTP and clock); ``kw``: up's other
    injection points (preflight, confirm)."""
    return up(
        inv or world.inv,
        opts or UpOptions(skip_preflight=True),
        emit or Recorder(),
        clock=world.clock,
        hosts_factory=world.hosts,
        fetch=world.fetch,
        lock_factory=world.take_lock,
        **kw,
    )


def run_up(
    world: World, opts: UpOptions | None = None, inv: Inventory | None = None
) -> tuple[int, Recorder]:
    rec = Recorder()
    return up_in(world, opts, rec, inv=inv), rec


def run_down(world: World, rec: Recorder, opts: DownOptions | None = None) -> int:
    return down(
        world.inv,
        opts or DownOptions(),
        rec,
        hosts_factory=world.hosts,
        lock_factory=world.take_lock,
        fetch=world.fetch,
        clock=world.clock,
    )
