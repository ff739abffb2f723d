"""A new vLLM build through degraded mode (pure): the path for a change that breaks NIXL
compatibility where blue/green has no room (a tier of one) or no proxy to switch (issue 43).

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
prefill change). What is lost while degraded: each request computes its prompt on the one
engine it reaches, so the serving tier's throughput, not the pair's (docs/operations.md).

``tier_phases`` gives the typed phases deploy/tier_upgrade.py carries out; ``phases`` the same
as upgrade.py's Phase values (what `up` and `up --plan` print, with each one's capacity).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pdboot.inventory.schema import TIERS, TierName
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

    def describe(self) -> str:
        if self.action == "serve":
            if self.mode == "pd":
                return "P/D again: the router serves the new prefill and decode tiers"
            side = "new" if self.serving_tier in self.new else "old"
            return f"the router serves the {side} {self.serving_tier} tier alone (plain)"
        if self.action == "replace":
            return (
                f"the {self.tier} tier drains, stops and starts on the new build, out of "
                f"rotation: {', '.join(self.engines)}"
            )
        return "every new prefill->decode pair proven (a KV pull, engine to engine)"

    @property
    def serving_tier(self) -> TierName | None:
        return {"decode_only": "decode", "prefill_only": "prefill"}.get(self.mode)  # type: ignore[return-value]


def tier_phases(
    blue: Mapping[TierName, Sequence[str]], green: Mapping[TierName, Sequence[str]]
) -> tuple[TierPhase, ...]:
    """``blue``: tier -> the keys of the engines serving now; ``green``: tier -> the keys the
    inventory wants. The order of the module docstring."""
    second: TierName = "decode" if FIRST == "prefill" else "prefill"
    alone_old: ServingMode = "decode_only" if FIRST == "prefill" else "prefill_only"
    alone_new: ServingMode = "prefill_only" if FIRST == "prefill" else "decode_only"
    old = tuple(sorted(blue.get(second, ())))
    first_new = tuple(sorted(green.get(FIRST, ())))
    every_new = tuple(sorted(k for t in TIERS for k in green.get(t, ())))
    return (
        TierPhase(1, "serve", alone_old, old),
        TierPhase(2, "replace", alone_old, first_new, FIRST),
        TierPhase(3, "serve", alone_new, first_new, new=(FIRST,)),
        TierPhase(4, "replace", alone_new, tuple(sorted(green.get(second, ()))), second,
                  new=(FIRST,)),
        TierPhase(5, "prove", alone_new, every_new, new=TIERS),
        TierPhase(6, "serve", "pd", every_new, new=TIERS),
    )  # fmt: skip


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
    "engines_in_rotation",
    "running",
    "tier_phases",
]
