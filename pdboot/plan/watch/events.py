"""What `pdboot watch` reports, as plain frozen records beside pdboot.events (the same JSON
lines view writes them: ``kind`` is the name in the stream)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from pdboot.events import Event


@dataclass(frozen=True)
class WatchPairLine(Event):
    """One pair's canary inside a WatchRound (not emitted alone)."""

    kind: ClassVar[str] = "watch_pair"
    prefill: str
    decode: str
    result: str  # good, late, wrong, hang, error
    fault: str  # "" when good; failed_transfers, no_kv_pulled, hang, wrong_answer, error
    step: str
    detail: str
    seconds: float
    failed_transfers: float
    pulled_tokens: float


@dataclass(frozen=True)
class WatchRound(Event):
    kind: ClassVar[str] = "watch_round"
    round: int
    seconds: float  # the round's own duration
    pairs: tuple[WatchPairLine, ...]
    unhealthy: tuple[str, ...]  # engines whose /health failed
    # over the interval, whole-engine counters (client traffic included): (engine, delta)
    failed_transfers: tuple[tuple[str, float], ...] = ()
    expired_leases: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class WatchActionTaken(Event):
    """An eviction, re-admission, restart or alert, and whether the router/engine took it."""

    kind: ClassVar[str] = "watch_action"
    action: Literal["evict", "readmit", "restart", "alert"]
    engine: str
    tier: str
    fault: str
    reason: str
    ok: bool  # False: the router or the restart refused (detail says why)
    detail: str = ""


@dataclass(frozen=True)
class WatchServingChanged(Event):
    """The endpoint switched into or out of degraded mode (plan/degraded.py): ``mode`` is
    pd, decode_only, prefill_only or down; ``lost_tier`` the tier with no engine in rotation
    ("" in P/D); ``held_seconds`` how long the mode before it lasted."""

    kind: ClassVar[str] = "watch_serving"
    before: str
    mode: str
    lost_tier: str
    held_seconds: float


@dataclass(frozen=True)
class WatchHeldBack(Event):
    """A round in which watch did not act: an `up` or `down` (or the lock's host being out of
    reach) kept the deployment lock from it (deploy/watch/lease.py). ``held`` False: the
    first round that acts again after such rounds. Restarts, evictions, re-admissions and
    worker repairs wait; only /health is read (canaries would count in up's KV proof)."""

    kind: ClassVar[str] = "watch_held"
    held: bool
    holder: str  # who holds the deployment, as the lock describes it ("" when released)
    rounds: int  # rounds held back so far (the count that ended, when released)
    unhealthy: tuple[str, ...] = ()  # engines whose /health failed this round
