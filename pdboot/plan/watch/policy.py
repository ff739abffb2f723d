"""`pdboot watch`'s decisions: one round of observations in, the actions to take out.

Pure: plain values and the round's time (a fake clock in tests); nothing here sends a request.

Who is to blame when a pair fails. A canary goes through one prefill->decode pair, so a failed
pair says "one of these two". An engine is blamed directly when its own ``/health`` fails,
when (decodes) its answer alone is missing or hangs, or when (prefills) it refuses the prefill
step, which no decode takes part in: real vLLM draining on SIGTERM answers 500 ("cannot
schedule new futures after shutdown") until it exits, and that prefill is the one to leave.
Otherwise an engine is blamed when more than half of its pairs failed, counting only pairs
whose other end is not blamed directly: with two decodes, a decode that breaks every pair is
blamed and the prefills, which still work with the other decode, are not. With one prefill
and one decode any other failing pair is a tie: neither can leave the router (the last engine
of a tier): that is an alert.

The last engine of a tier leaves the router only when it is certainly the one at fault (its
``/health`` fails, or its own answer does) and the other tier keeps an engine in rotation:
the endpoint then serves from the other tier alone (degraded mode, plan/degraded.py) instead
of failing every request; ``WatchConfig.degraded`` off keeps it in the router with an alert.

Which faults a restart fixes. Failed NIXL transfers and a pull that hangs while the decode
answers alone and ``/health`` is fine are the "peer state went bad" failures vLLM users fix by
restarting (a UCX connection dead since NIXL_ERR_REMOTE_DISCONNECT, vllm#55181's hang). Wrong
answers (a broken GPUDirect path, a KV layout mismatch) and a failing ``/health`` are not fixed
by a restart of this kind: the engine stays out of rotation until its canaries pass again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from pdboot.inventory.schema import TierName

# good: identical answers; late: the gate's late divergence (numerics, counted good);
# wrong: the P/D answer differs early or is empty; hang: a step ran past its deadline;
# error: a step failed (HTTP error, connection refused, no kv_transfer_params)
CanaryResult = Literal["good", "late", "wrong", "hang", "error"]
# fault kinds, stable for events and metrics labels
PEER_FAULTS = frozenset({"failed_transfers", "hang"})


@dataclass(frozen=True)
class WatchedEngine:
    key: str  # service key, e.g. prefill@gpu-a
    tier: TierName
    url: str  # what the router lists it as


@dataclass(frozen=True)
class PairCheck:
    """One canary through one pair in one round."""

    prefill: str
    decode: str
    result: CanaryResult
    step: str = ""  # where it failed: prefill, decode, direct, metrics, compare; "" when good
    detail: str = ""
    seconds: float = 0.0  # the P/D path's time (prefill + decode steps)
    failed_transfers: float = 0.0  # the decode's vllm:nixl_num_failed_transfers_total delta
    pulled_tokens: float = 0.0  # the decode's prompt tokens with source=external_kv_transfer

    @property
    def fault(self) -> str:
        """ "" when the pair is good; else a stable kind."""
        if self.failed_transfers > 0:
            return "failed_transfers"
        if self.result in ("good", "late"):
            return "" if self.pulled_tokens > 0 else "no_kv_pulled"
        if self.result == "hang":
            return "hang"
        return "wrong_answer" if self.result == "wrong" else "error"

    @property
    def ok(self) -> bool:
        return self.fault == ""

    def reason(self) -> str:
        what = {
            "failed_transfers": f"{self.failed_transfers:.0f} failed NIXL transfers",
            "no_kv_pulled": "the decode pulled no KV (it recomputed the prompt)",
            "hang": f"the {self.step} step hung",
            "wrong_answer": "wrong answer",
            "error": f"the {self.step} step failed",
        }.get(self.fault, "good")
        tail = f": {self.detail}" if self.detail else ""
        return f"{self.prefill} -> {self.decode}: {what}{tail}"


@dataclass(frozen=True)
class Round:
    now: float  # monotonic seconds
    pairs: tuple[PairCheck, ...]
    health: Mapping[str, bool]  # engine key -> /health answered 200 in time
    # decode key -> failed transfers over the whole interval (client traffic included)
    failed_transfers: Mapping[str, float] = field(default_factory=dict)
    # prefill key -> KV leases expired over the interval (no decode pulled in time)
    expired_leases: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class WatchConfig:
    interval_seconds: float = 30.0
    deadline_seconds: float = 10.0  # per canary step; past it the step is a hang
    evict_after: int = 1  # consecutive bad rounds before leaving the router
    readmit_after: int = 3  # consecutive good rounds before coming back
    restart_after: int = 2  # consecutive bad rounds (peer faults) before a restart
    restart_backoff_seconds: float = 600.0  # at most one restart per engine in this window
    degraded: bool = True  # a tier's last engine may leave: the other tier serves alone


@dataclass(frozen=True)
class EngineState:
    in_rotation: bool = True
    bad_rounds: int = 0
    good_rounds: int = 0
    fault: str = ""  # the latest bad round's kind
    reason: str = ""
    last_restart: float | None = None
    alerted: bool = False  # an alert for this bad spell was raised (once per spell)


@dataclass(frozen=True)
class WatchState:
    engines: Mapping[str, EngineState]
    last_good: Mapping[tuple[str, str], float] = field(default_factory=dict)


def initial_state(engines: Sequence[WatchedEngine]) -> WatchState:
    """Every engine starts in rotation (``up`` registered them all)."""
    return WatchState({e.key: EngineState() for e in engines})


@dataclass(frozen=True)
class Evict:
    engine: str
    tier: TierName
    fault: str
    reason: str


@dataclass(frozen=True)
class Readmit:
    engine: str
    tier: TierName
    good_rounds: int


@dataclass(frozen=True)
class Restart:
    """Restart ``engine`` (already out of rotation: drained), then ``then_decodes`` one by one
    (a prefill restart leaves the decodes that held NIXL state for it broken)."""

    engine: str
    tier: TierName
    reason: str
    then_decodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Alert:
    engine: str
    tier: TierName
    fault: str
    reason: str


WatchAction = Evict | Readmit | Restart | Alert


@dataclass(frozen=True)
class Blame:
    fault: str
    reason: str
    # False: a tie between a pair's two ends (one failing pair of engines that work with the
    # others, or a fault that began in mid-round): the decode is blamed, and evicted only
    # when the next round blames it again
    certain: bool = True


def blame(engines: Sequence[WatchedEngine], obs: Round) -> dict[str, Blame]:
    """Engine key -> why this round shows it bad."""
    direct: dict[str, Blame] = {}
    for e in engines:
        if not obs.health.get(e.key, True):
            direct[e.key] = Blame("health", f"{e.key}: /health failing")
    for p in obs.pairs:
        if p.step == "direct" and not p.ok and p.decode not in direct:
            direct[p.decode] = Blame(p.fault, p.reason())
        # the prefill step goes to the prefill alone: an answer refused there is its own,
        # whatever the decode (a hang stays a pair's: a slow prefill is weighed, not evicted)
        if p.step == "prefill" and p.result == "error" and p.prefill not in direct:
            direct[p.prefill] = Blame(p.fault, p.reason())
    out = dict(direct)
    counted = [p for p in obs.pairs if p.prefill not in direct and p.decode not in direct]

    def weight(key: str) -> tuple[float, int]:
        mine = [p for p in counted if key in (p.prefill, p.decode)]
        failed = sum(1 for p in mine if not p.ok)
        return (failed / len(mine) if mine else 0.0, failed)

    for p in counted:
        if p.ok:
            continue
        wp, wd = weight(p.prefill), weight(p.decode)
        if wp > wd:
            out.setdefault(p.prefill, Blame(p.fault, p.reason()))
        else:  # the decode, also on a tie (it holds the pair's NIXL state), not yet certain
            out.setdefault(p.decode, Blame(p.fault, p.reason(), certain=wd > wp))
    return out


def step(
    cfg: WatchConfig, engines: Sequence[WatchedEngine], state: WatchState, obs: Round
) -> tuple[WatchState, list[WatchAction]]:
    """One round: new state and the actions to take, in order."""
    bad = blame(engines, obs)
    observed = {k for p in obs.pairs for k in (p.prefill, p.decode)}
    rotation = {e.key for e in engines if state.engines[e.key].in_rotation}
    actions: list[WatchAction] = []
    new: dict[str, EngineState] = {}
    for e in engines:
        s = state.engines[e.key]
        if e.key in bad:
            b = bad[e.key]
            s = replace(
                s, bad_rounds=s.bad_rounds + 1, good_rounds=0, fault=b.fault, reason=b.reason
            )
            evict_after = cfg.evict_after + (0 if b.certain else 1)
            s, acts = _when_bad(cfg, engines, e, s, rotation, obs.now, evict_after, b.certain)
            actions += acts
        elif e.key in observed or not obs.pairs:
            s = replace(s, good_rounds=s.good_rounds + 1, bad_rounds=0, alerted=False)
            if not s.in_rotation and s.good_rounds >= cfg.readmit_after:
                s = replace(s, in_rotation=True, fault="", reason="")
                rotation.add(e.key)
                actions.append(Readmit(e.key, e.tier, s.good_rounds))
        new[e.key] = s
    last_good = dict(state.last_good)
    for p in obs.pairs:
        if p.ok:
            last_good[(p.prefill, p.decode)] = obs.now
    return WatchState(new, last_good), actions


def _when_bad(
    cfg: WatchConfig,
    engines: Sequence[WatchedEngine],
    e: WatchedEngine,
    s: EngineState,
    rotation: set[str],
    now: float,
    evict_after: int,
    certain: bool = True,
) -> tuple[EngineState, list[WatchAction]]:
    """Evict (or alert when it is the last of its tier and the tier cannot be left to the
    other one: module docstring), then restart when a restart helps."""
    acts: list[WatchAction] = []
    if s.in_rotation and s.bad_rounds >= evict_after:
        others = [x for x in engines if x.tier == e.tier and x.key != e.key and x.key in rotation]
        serving = [x for x in engines if x.tier != e.tier and x.key in rotation]
        if not others and not (cfg.degraded and certain and serving):
            if not s.alerted:
                acts.append(
                    Alert(
                        e.key,
                        e.tier,
                        s.fault,
                        f"{s.reason} (the last {e.tier} engine in rotation: kept in the router)",
                    )
                )
                s = replace(s, alerted=True)
            return s, acts
        rotation.discard(e.key)
        s = replace(s, in_rotation=False)
        acts.append(Evict(e.key, e.tier, s.fault, s.reason))
    backoff_over = s.last_restart is None or now - s.last_restart >= cfg.restart_backoff_seconds
    if (
        not s.in_rotation
        and s.fault in PEER_FAULTS
        and s.bad_rounds >= cfg.restart_after
        and backoff_over
    ):
        decodes = tuple(x.key for x in engines if x.tier == "decode") if e.tier == "prefill" else ()
        acts.append(Restart(e.key, e.tier, s.reason, decodes))
        s = replace(s, last_restart=now, bad_rounds=0)
    return s, acts
