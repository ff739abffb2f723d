"""What `up`, `down` and `status` report, as plain frozen records.

The orchestrator (up.py, down.py, status.py) decides and acts and calls ``emit(event)``;
it never prints. Views (pdboot/views/) turn events into a terminal display or into JSON
lines. Each record's ``kind`` is its name in the JSON stream. Service keys are
``role@host`` (``decode@gpu-b``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

Action = Literal["create", "recreate", "unchanged", "remove"]
Level = Literal["info", "warn", "error"]


@dataclass(frozen=True)
class Event:
    kind: ClassVar[str] = "event"


@dataclass(frozen=True)
class StageStarted(Event):
    """stage: preflight, pull, ship, converge, start, wait, prove, teardown, clean."""

    kind: ClassVar[str] = "stage"
    stage: str
    services: tuple[str, ...] = ()


@dataclass(frozen=True)
class PreflightDone(Event):
    kind: ClassVar[str] = "preflight"
    ok: bool
    skipped: bool = False


@dataclass(frozen=True)
class PreflightHost(Event):
    """`up`'s preflight reached (or not) one host; its checks follow as PreflightCheck."""

    kind: ClassVar[str] = "preflight_host"
    host: str
    reachable: bool
    seconds: float = 0.0


@dataclass(frozen=True)
class PreflightCheck(Event):
    """One check of `up`'s preflight on one host: the fields of a check in `pdboot preflight
    --json` (id, status, message, fix) and the host it ran on."""

    kind: ClassVar[str] = "preflight_check"
    host: str
    id: str
    status: Literal["pass", "warn", "fail", "skip"]
    message: str
    fix: str = ""


@dataclass(frozen=True)
class PullProgress(Event):
    kind: ClassVar[str] = "pull_progress"
    host: str
    image: str
    done: int  # bytes
    total: int  # bytes; 0 while unknown
    status: str


@dataclass(frozen=True)
class PullDone(Event):
    kind: ClassVar[str] = "pull_done"
    host: str
    image: str
    pulled: bool  # False: already present with the registry's digest
    digest: str | None
    bytes: int
    seconds: float


@dataclass(frozen=True)
class WeightsPinned(Event):
    """The one commit every engine loads (pdboot/plan/weights/pin.py chose it)."""

    kind: ClassVar[str] = "weights_pinned"
    model: str
    revision: str  # as the inventory asks it
    commit: str
    bytes: int  # the commit's files, as the hub lists them


@dataclass(frozen=True)
class WeightsProgress(Event):
    kind: ClassVar[str] = "weights_progress"
    host: str
    done: int  # bytes of the commit's files on the host's disk
    total: int


@dataclass(frozen=True)
class WeightsDone(Event):
    kind: ClassVar[str] = "weights_done"
    host: str
    commit: str
    cached: bool  # True: the host's cache already held every file (nothing fetched)
    bytes: int
    seconds: float
    client: str = ""  # huggingface_hub's version in the engine image


@dataclass(frozen=True)
class ServiceAction(Event):
    """What converge decided for one service (or an orphan to remove)."""

    kind: ClassVar[str] = "service_action"
    service: str
    action: Action
    reason: str


@dataclass(frozen=True)
class ServiceStarted(Event):
    """compose up returned for this service (its engine may still be loading)."""

    kind: ClassVar[str] = "service_started"
    service: str
    recreated: bool


@dataclass(frozen=True)
class ServiceWait(Event):
    """One service's state inside a WaitTick (not emitted alone)."""

    kind: ClassVar[str] = "service_wait"
    service: str
    state: str  # ready, waiting, failed
    detail: str  # "connection refused", "HTTP 503", ...
    log_line: str  # the container's latest log line ("" before the first read)
    # vLLM's start-up phase read from its log (pdboot/verify/loadphase.py): "loading weights",
    # "capturing CUDA graphs", ...; with k of n where vLLM prints it; "" when none yet
    phase: str = ""
    done: int | None = None
    total: int | None = None


@dataclass(frozen=True)
class WaitTick(Event):
    kind: ClassVar[str] = "waiting"
    elapsed: float
    services: tuple[ServiceWait, ...]


@dataclass(frozen=True)
class ServiceReady(Event):
    kind: ClassVar[str] = "ready"
    service: str
    seconds: float  # since the wait began


@dataclass(frozen=True)
class TierReady(Event):
    kind: ClassVar[str] = "tier_ready"
    tiers: tuple[str, ...]  # ("decode", "prefill") or ("router",)
    condition: str
    seconds: float


@dataclass(frozen=True)
class Failure(Event):
    """A service that exited or never became ready, with what its logs say."""

    kind: ClassVar[str] = "failure"
    service: str
    message: str
    exited: bool  # False: still running but not healthy by the deadline
    log_lines: tuple[str, ...]
    diagnosis: tuple[str, ...]  # known causes in the log lines: a cause line, a fix line each
    # the first error of the log (verify/rootcause.py): vLLM's root cause, shown first
    first_error: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostErrors(Event):
    """A step failed on some hosts: ``what`` reads "pull failed on", "cannot reach", ..."""

    kind: ClassVar[str] = "host_errors"
    what: str
    errors: tuple[tuple[str, str], ...]  # (host, message)


@dataclass(frozen=True)
class KVVerdict(Event):
    kind: ClassVar[str] = "kv_verdict"
    ok: bool
    confirmed: bool
    message: str
    completion: str
    cause: str = ""


@dataclass(frozen=True)
class GateVerdict(Event):
    """The correctness gate: the same greedy request through the router (P/D) and straight
    to one decode engine. level: ok, warn (late divergence: numerics), fail (broken KV)."""

    kind: ClassVar[str] = "gate"
    level: Literal["ok", "warn", "fail"]
    verdict: str  # identical, late_divergence, broken
    common_words: int
    pd_output: str
    direct_output: str
    decode: str  # the decode engine asked directly
    message: str


@dataclass(frozen=True)
class PairSpeedLine(Event):
    """One prefill->decode pair inside KVSpeed (not emitted alone)."""

    kind: ClassVar[str] = "kv_pair_speed"
    prefill: str
    decode: str
    gbps: float | None  # measured on the decode (None: nothing measured)
    link_gbps: float | None  # what the link should give (preflight's port rate or link_gbps)
    megabytes: float
    line: str  # the measured-vs-link sentence, or why nothing was measured
    flag: str = ""  # kv_tcp_fallback, kv_pull_same_host, "" when the path looks right
    advice: str = ""  # the flag's message: usual causes / the connector note


@dataclass(frozen=True)
class KVSpeed(Event):
    kind: ClassVar[str] = "kv_speed"
    pairs: tuple[PairSpeedLine, ...]


@dataclass(frozen=True)
class Diagnosis(Event):
    """Known causes found in recent logs (engines and router): a cause line and a fix line
    per finding. ``context`` says what prompted the scan (a failed test request, ...)."""

    kind: ClassVar[str] = "diagnosis"
    context: str
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Rollback(Event):
    kind: ClassVar[str] = "rollback"
    reason: str


@dataclass(frozen=True)
class Stopped(Event):
    kind: ClassVar[str] = "stopped"
    role: str
    services: tuple[str, ...]


@dataclass(frozen=True)
class Endpoint(Event):
    kind: ClassVar[str] = "endpoint"
    url: str
    model: str
    curl: str


@dataclass(frozen=True)
class Interrupted(Event):
    kind: ClassVar[str] = "interrupted"
    started: bool  # False: interrupted before anything was started
    running: tuple[tuple[str, str], ...] = ()  # (service, state) of what runs now


@dataclass(frozen=True)
class ImageCheck(Event):
    """After the pull, before the start: one verdict of asking the engine image on an
    engine host (docker.image_arch, docker.image_nixl; pdboot/preflight/image_probe.py), or
    of its own `vllm serve` parser on the engine commands (docker.image_args;
    pdboot/preflight/image_args.py)."""

    kind: ClassVar[str] = "image_check"
    host: str
    check: str
    status: Literal["pass", "warn", "fail", "skip"]
    message: str
    fix: str = ""


@dataclass(frozen=True)
class RollPlanned(Event):
    """One step of the change `up` makes (also what `up --plan` prints): which engines, how,
    each tier's workers serving during it ("prefill 1/2"), and whether the endpoint stays up."""

    kind: ClassVar[str] = "roll_step"
    number: int
    action: str  # add, remove, replace, restart, router, together
    tier: str
    services: tuple[str, ...]
    how: str
    reason: str
    capacity: tuple[str, ...]
    endpoint_up: bool
    outage: str = ""


@dataclass(frozen=True)
class RollProgress(Event):
    """A roll step's phase as it runs: deregister, drain, start, register, done."""

    kind: ClassVar[str] = "roll"
    number: int
    phase: str
    detail: str


@dataclass(frozen=True)
class RollStopped(Event):
    """A roll stopped by a failure: which engine runs which configuration now."""

    kind: ClassVar[str] = "roll_stopped"
    number: int
    # (key, "new configuration" | "old ..." | "not running" | "out of reach ..." | "unknown ...")
    engines: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Note(Event):
    kind: ClassVar[str] = "note"
    message: str
    level: Level = "info"


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
    # an engine's UCX_NET_DEVICES and where it came from ("mlx5_0:1 (PIX, nearest GPUs 0)")
    nic: str = ""
    # a data-parallel engine's ranks here; the head adds the ranks its /metrics reports
    ranks: str = ""
    # device: cpu engines: the cores their threads are bound to ("cores 0-1")
    cores: str = ""
    # why the state could not be read (state unreachable): the SSH or Docker error, with
    # its fix, as `preflight` words it
    reason: str = ""

    @property
    def healthy(self) -> bool:
        return self.state == "running" and self.health == "ok"


@dataclass(frozen=True)
class StatusReport(Event):
    kind: ClassVar[str] = "status"
    deployment: str
    endpoint: str
    healthy: bool
    services: tuple[ServiceStatus, ...]
    pd: Any = None  # pdstatus.PDStatus: per-engine P/D metrics, spread, flags (None: not read)
    watch: Any = None  # watch.verdicts.WatchVerdicts: the last verdict per pair (None: no watch)
    revision: str = ""  # the --revision every engine is planned with ("": vLLM's default)
    workers: Any = None  # router_api.WorkerDiff: foreign / missing router workers (None: not read)


@dataclass(frozen=True)
class Done(Event):
    kind: ClassVar[str] = "done"
    command: str  # up, down, status
    exit_code: int
    seconds: float
    summary: str = ""


Emit = Callable[[Event], None]


def fan(*views: Emit) -> Emit:
    """One emit that hands every event to each view in turn."""

    def emit(event: Event) -> None:
        for v in views:
            v(event)

    return emit
