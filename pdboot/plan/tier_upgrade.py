"""A tier replaced through degraded mode (pure): the path for a change that breaks NIXL
compatibility where blue/green has no room (a tier of one) or no proxy to switch (issue 43),
and for any change that replaces the only engine of a tier, which a roll would take down.

Old and new engines never pair (each would refuse the other's KV at the handshake), and the
endpoint never goes down: one tier serves alone, as plain engines (plan/degraded.py), while
the other is replaced, then the other way round:

1. the router serves the old decode tier alone (plain);
2. the prefill tier is drained, stopped and started on the new build, out of rotation;
3. the router serves the new prefill tier alone (plain);
4. the decode tier is drained, stopped and started on the new build, out of rotation;
5. every new prefill->decode pair is proven (a KV pull probed engine to engine);
6. P/D again: the router serves the new tiers.

The decode tier serves first: a prefill-only cluster is the shorter stretch, as the decode is
the tier that holds NIXL state for the prefills it pulled from (converge restarts it after a
prefill change). A change that keeps NIXL compatibility replaces only the tiers it changes
(`tiers`): one whose decode tier alone changes serves from the running prefills while it is
replaced (serve, replace, prove, P/D again), and an engine kept as it runs keeps running.
What is lost while degraded: each request computes its prompt on the one engine it reaches,
so the serving tier's throughput, not the pair's (docs/operations.md).

``tier_phases`` gives the typed phases deploy/tier_upgrade.py carries out; ``phases`` the same
as upgrade.py's Phase values (what `up` and `up --plan` print, with each one's capacity).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pdboot.inventory.schema import TIERS, TierName
from pdboot.plan.converge import Step
from pdboot.plan.degraded import ServingMode
from pdboot.plan.rolling import Capacity

TierAction = Literal["serve", "replace", "prove"]
FIRST: TierName = "prefill"  # the tier replaced first (the decode tier serves meanwhile)


@dataclass(frozen=True)
class TierPhase:
    """One phase: ``serve`` switches the router to ``mode`` over ``engines`` (the engines in
    rotation); ``replace`` drains, stops and starts ``tier``'s engines (``engines``: the new
    ones) out of rotation; ``prove`` probes every new pair (``engines``: all new ones)."""

    number: int
    action: TierAction
    mode: ServingMode  # what the router serves during this phase (after a serve: its mode)
    engines: tuple[str, ...]
    tier: TierName | None = None  # replace: the tier replaced
    new: tuple[TierName, ...] = ()  # the tiers already on the new build during this phase
    change: str = "on the new build"  # what a replaced tier starts on, for describe()

    def describe(self) -> str:
        if self.action == "serve":
            if self.mode == "pd":
                return "P/D again: the router serves the new prefill and decode tiers"
            side = "new" if self.serving_tier in self.new else "old"
            return f"the router serves the {side} {self.serving_tier} tier alone (plain)"
        if self.action == "replace":
            return (
                f"the {self.tier} tier drains, stops and starts {self.change}, out of "
                f"rotation: {', '.join(self.engines)}"
            )
        return "every new prefill->decode pair proven (a KV pull, engine to engine)"

    @property
    def serving_tier(self) -> TierName | None:
        return {"decode_only": "decode", "prefill_only": "prefill"}.get(self.mode)  # type: ignore[return-value]


def tier_phases(
    blue: Mapping[TierName, Sequence[str]],
    green: Mapping[TierName, Sequence[str]],
    tiers: Sequence[TierName] = TIERS,
    change: str = "on the new build",
) -> tuple[TierPhase, ...]:
    """``blue``: tier -> the keys of the engines serving now; ``green``: tier -> the keys the
    inventory wants; ``tiers``: the tiers replaced (a new build: both). The order of the
    module docstring: for each replaced tier, FIRST first, the other tier serves alone (the
    new one once it was replaced), then it is replaced; then every pair is proven and P/D
    serves again."""
    out: list[TierPhase] = []
    new: tuple[TierName, ...] = ()
    for tier in (t for t in (FIRST, _other(FIRST)) if t in tiers):
        other = _other(tier)
        alone: ServingMode = "decode_only" if other == "decode" else "prefill_only"
        serving = tuple(sorted((green if other in new else blue).get(other, ())))
        out.append(TierPhase(len(out) + 1, "serve", alone, serving, new=new))
        mine = tuple(sorted(green.get(tier, ())))
        out.append(TierPhase(len(out) + 1, "replace", alone, mine, tier, new=new, change=change))
        new = (*new, tier)
    every_new = tuple(sorted(k for t in TIERS for k in green.get(t, ())))
    last = out[-1].mode if out else "pd"
    out.append(TierPhase(len(out) + 1, "prove", last, every_new, new=new))
    out.append(TierPhase(len(out) + 1, "serve", "pd", every_new, new=new))
    return tuple(out)


def _other(tier: TierName) -> TierName:
    return "decode" if tier == "prefill" else "prefill"


def changed_tiers(engines: Sequence[Step]) -> list[TierName]:
    """The tiers with an engine step to take (a change that keeps NIXL compatibility
    replaces these, and only these)."""
    return [t for t in TIERS if any(
        s.service.role == t and not s.service.headless and s.kind != "unchanged"
        for s in engines)]  # fmt: skip


def capacity(
    phase: TierPhase,
    blue: Mapping[TierName, Sequence[str]],
    green: Mapping[TierName, Sequence[str]],
) -> tuple[Capacity, ...]:
    """Per tier: the engines that serve clients during the phase, of those the inventory
    wants (a tier out of rotation serves 0, whatever runs)."""

    def serving(t: TierName) -> int:
        if phase.mode != "pd" and t != phase.serving_tier:
            return 0
        return len((green if t in phase.new else blue).get(t, ()))

    return tuple(Capacity(t, serving(t), len(green.get(t, ()))) for t in TIERS)


def running(
    phase: TierPhase,
    blue: Mapping[TierName, Sequence[str]],
    green: Mapping[TierName, Sequence[str]],
) -> tuple[str, ...]:
    """What runs at the end of the phase: "blue: KEY" (the old build) or "green: KEY"."""
    done = set(phase.new) | ({phase.tier} if phase.tier else set())
    return tuple(
        f"green: {k}" if t in done else f"blue: {k}"
        for t in TIERS
        for k in sorted((green if t in done else blue).get(t, ()))
    )


def engines_in_rotation(
    phase: TierPhase, tiers: Mapping[str, TierName], urls: Mapping[str, str]
) -> dict[str, TierName]:
    """A serve phase's engines as switch_router's ``in_rotation``: engine URL -> tier, from
    each key's tier and URL (``tiers``, ``urls``: key -> tier, key -> URL)."""
    return {urls[k]: tiers[k] for k in phase.engines if k in urls and k in tiers}


__all__ = [
    "FIRST",
    "TierAction",
    "TierPhase",
    "capacity",
    "changed_tiers",
    "engines_in_rotation",
    "running",
    "tier_phases",
]
