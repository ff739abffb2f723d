"""Which path a change takes, and why (pure): a roll, blue/green, degraded mode, or an outage.

- *roll*: every replaced engine keeps its NIXL hash inputs (nixl_compat.py), so an old and
  a new engine pair as two old ones did: rolling.py's steps, engine by engine.
- *blue/green*: a hash input changes (a new vLLM build, another dtype...): old and new
  engines would refuse each other's KV at every handshake, so no roll may pair them. A new
  set (green: its own router and engines) is proven alone, then the proxy switches to it.
  Its room is freed by draining and stopping half of each blue tier (never below one engine
  per tier); the phases below say which engines run and each tier's capacity.
- *degraded*: a hash input changes and blue/green cannot run (a tier has one engine: no half
  to free; or no proxy in front): one tier serves alone, as plain engines, while the other is
  replaced, then the other way round, and P/D again once the new pairs are proven
  (tier_upgrade.py's phases). No outage, and nothing asked. Also a change that keeps NIXL
  compatibility but replaces the only engine of a tier (a roll would take that tier, and the
  endpoint, down): the other tier serves alone while the changed tiers are replaced.
- *outage*: a hash input changes and not every running engine is replaced (one kept as it
  runs would pair old with new): every engine is replaced at once (the recreate path) and
  the endpoint fails requests until the new set is ready; `up` asks for --yes first, as for
  any tier that cannot roll. An operator who wants it anyway asks with --no-rolling.

``blue_green`` says whether blue/green can run (a proxy in front, every running engine
replaced); ``degraded`` whether degraded mode can (every running engine replaced, each tier
with an engine before and after); ``lone`` the tiers of one engine a compatible change
replaces, which degraded mode then replaces where it can (each tier with an engine before
and after; no engine data-parallel or new, no host with both tiers, the router unchanged).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from pdboot.inventory.schema import TIERS, TierName
from pdboot.plan.change_plan import ChangePlan, all_at_once
from pdboot.plan.converge import Step
from pdboot.plan.model import Plan
from pdboot.plan.nixl_compat import (
    UNKNOWN,
    Compatibility,
    HashInputs,
    ImageVersion,
    classify,
    hash_inputs,
    same_image_version,
)
from pdboot.plan.rolling import Capacity
from pdboot.plan.tier_upgrade import capacity, changed_tiers, running, tier_phases

PathKind = Literal["none", "roll", "blue-green", "degraded", "outage"]


@dataclass(frozen=True)
class Phase:
    number: int
    what: str
    running: tuple[str, ...]  # "blue: prefill@p1" / "green: decode@d2"
    capacity: tuple[Capacity, ...]  # of the set the endpoint serves from
    endpoint_up: bool
    serving: str  # "blue" or "green": which set the proxy sends clients to
    mode: str = "pd"  # plan/degraded.py's ServingMode: both tiers, or one alone (plain)


@dataclass(frozen=True)
class UpgradePath:
    kind: PathKind
    why: str
    compat: Compatibility
    phases: tuple[Phase, ...] = ()

    def describe(self) -> str:
        words = {
            "none": "no engine is replaced",
            "roll": "roll engine by engine",
            "blue-green": "blue/green (a new set beside the old, proven alone, then switched)",
            "degraded": "through degraded mode (one tier serves alone while the other is replaced)",
            "outage": "outage (every engine replaced at once)",
        }[self.kind]
        return f"upgrade path: {words}: {self.why}"


def replaced_engines(steps: Sequence[Step]) -> list[Step]:
    """The steps that recreate a running engine (its old and new settings both known)."""
    return [
        s for s in steps if s.service.is_engine and s.kind == "recreate" and s.current is not None
    ]


def compatibility(
    steps: Sequence[Step],
    versions: Mapping[str, ImageVersion],
    running: Mapping[str, ImageVersion],
) -> Compatibility:
    """``versions``: image -> what the after-pull probe read in it; ``running``: engine key
    -> what was read in its running container (where its image changes)."""
    changes: dict[str, tuple[HashInputs, HashInputs]] = {}
    for s in replaced_engines(steps):
        o = s.current
        assert o is not None  # replaced_engines keeps only those
        old_v, new_v = same_image_version(
            o.image, s.service.image, versions, running.get(s.service.key)
        )
        changes[s.service.key] = (
            hash_inputs(o.command, dict(o.env), old_v),
            hash_inputs(s.service.command, dict(s.service.environment), new_v),
        )
    return classify(changes)


def choose(
    replaced: Sequence[Step],
    compat: Compatibility,
    blue: Mapping[TierName, Sequence[str]],
    green: Mapping[TierName, Sequence[str]],
    *,
    blue_green: bool,
    degraded: bool = False,
    lone: Sequence[TierName] = (),
    changed: Sequence[TierName] = TIERS,
) -> UpgradePath:
    """``replaced``: the engine steps that recreate a running engine; ``blue``: tier ->
    the keys of the engines serving now; ``green``: tier -> the keys the inventory wants;
    ``lone``: for a compatible change that degraded mode can carry, the tiers of one engine
    it replaces; ``changed``: the tiers with an engine to replace or add."""
    if not replaced:
        return UpgradePath("none", "no running engine changes its configuration", compat)
    if compat.compatible and lone:
        tiers = " and ".join(f"the {t} tier" for t in lone)
        has = "each have" if len(lone) > 1 else "has"
        why = (
            f"{compat.why}; but {tiers} {has} one engine, which a roll would take down: "
            "the other tier serves alone while the changed tiers are replaced"
        )
        phases = degraded_phases(blue, green, changed, "with its new settings")
        return UpgradePath("degraded", why, compat, phases)
    if compat.compatible:
        return UpgradePath("roll", compat.why, compat)
    single = [t for t in TIERS if len(blue.get(t, ())) < 2]
    if (single or not blue_green) and degraded:
        if single:
            tiers = " and ".join(f"the {t} tier" for t in single)
            has = "each have" if len(single) > 1 else "has"
            room = f"{tiers} {has} one engine: no half can be freed for a new set"
        else:
            room = "blue/green needs the proxy in front"
        why = f"{compat.why}; {room}, so each tier serves alone while the other is replaced"
        return UpgradePath("degraded", why, compat, degraded_phases(blue, green))
    if single:
        tiers = " and ".join(f"the {t} tier" for t in single)
        has = "each have" if len(single) > 1 else "has"
        why = (
            f"{compat.why}; {tiers} {has} one engine: no half can be freed for a new set, "
            "and an engine kept as it runs would pair old with new: every engine is "
            "replaced at once"
        )
        return UpgradePath("outage", why, compat, _outage(blue, green))
    if not blue_green:
        why = (
            f"{compat.why}; old and new engines would refuse each other's KV, and blue/green "
            "needs the proxy in front and every engine replaced: every engine is replaced "
            "at once"
        )
        return UpgradePath("outage", why, compat, _outage(blue, green))
    return UpgradePath("blue-green", compat.why, compat, blue_green_phases(blue, green))


def _caps(
    counts: Mapping[TierName, int], wanted: Mapping[TierName, Sequence[str]]
) -> tuple[Capacity, ...]:
    return tuple(Capacity(t, counts.get(t, 0), len(wanted.get(t, ()))) for t in TIERS)


def _outage(
    blue: Mapping[TierName, Sequence[str]], green: Mapping[TierName, Sequence[str]]
) -> tuple[Phase, ...]:
    every = tuple(f"green: {k}" for t in TIERS for k in green.get(t, ()))
    return (
        Phase(1, "stop every engine and start the new ones at once", every,
              _caps({}, green), False, "green"),
        Phase(2, "the new set serves once every engine is ready", every,
              _caps({t: len(green.get(t, ())) for t in TIERS}, green), True, "green"),
    )  # fmt: skip


def blue_green_phases(
    blue: Mapping[TierName, Sequence[str]], green: Mapping[TierName, Sequence[str]]
) -> tuple[Phase, ...]:
    """Half of each blue tier (rounded down, so at least one stays) is drained and stopped;
    green's first engines are the inventory's on the hosts that freed (as many per tier as
    were freed); once green serves, blue stops and green grows to the whole inventory."""
    freed = {t: sorted(blue.get(t, ()))[len(blue.get(t, ())) - len(blue.get(t, ())) // 2 :]
             for t in TIERS}  # fmt: skip
    kept = {t: [k for k in sorted(blue.get(t, ())) if k not in freed[t]] for t in TIERS}
    first = {t: _first_green(green.get(t, ()), freed[t]) for t in TIERS}
    blue_kept = tuple(f"blue: {k}" for t in TIERS for k in kept[t])
    green_first = tuple(f"green: {k}" for t in TIERS for k in first[t])
    green_all = tuple(f"green: {k}" for t in TIERS for k in green.get(t, ()))
    n_kept = {t: len(kept[t]) for t in TIERS}
    n_first = {t: len(first[t]) for t in TIERS}
    return (
        Phase(1, "drain and stop half of each blue tier: "
              + ", ".join(k for t in TIERS for k in freed[t]),
              blue_kept, _caps(n_kept, blue), True, "blue"),
        Phase(2, "start green on the freed room behind its own router; prove it there "
              "(KV proof, correctness gate) before any client reaches it",
              blue_kept + green_first, _caps(n_kept, blue), True, "blue"),
        Phase(3, "the proxy switches to green's router (graceful reload)",
              blue_kept + green_first, _caps(n_first, green), True, "green"),
        Phase(4, "blue drains and stops", green_first, _caps(n_first, green), True, "green"),
        Phase(5, "green grows to the whole inventory (live adds)", green_all,
              _caps({t: len(green.get(t, ())) for t in TIERS}, green), True, "green"),
    )  # fmt: skip


def degraded_phases(
    blue: Mapping[TierName, Sequence[str]],
    green: Mapping[TierName, Sequence[str]],
    tiers: Sequence[TierName] = TIERS,
    change: str = "on the new build",
) -> tuple[Phase, ...]:
    """tier_upgrade.py's phases as `up` shows them: what runs, each tier's capacity, the
    serving mode; the endpoint stays up in every one."""
    out = []
    for p in tier_phases(blue, green, tiers, change):
        side = "green" if p.serving_tier in p.new or p.mode == "pd" else "blue"
        out.append(Phase(p.number, p.describe(), running(p, blue, green),
                         capacity(p, blue, green), True, side, p.mode))  # fmt: skip
    return tuple(out)


def _first_green(wanted: Sequence[str], freed: Sequence[str]) -> list[str]:
    """The inventory's engines in the freed engines' places (same key: host and name), never
    one beside them on the same host (that is blue's, still serving)."""
    return [k for k in sorted(wanted) if k in set(freed)]


# --------------------------------------------------------------------------- the decision


def upgrade_path(
    plan: Plan,
    stages: Sequence[Sequence[Step]],
    versions: Mapping[str, ImageVersion],
    running: Mapping[str, ImageVersion],
) -> UpgradePath:
    steps = [s for st in stages for s in st]
    compat = compatibility(steps, versions, running)
    blue = {
        t: [
            s.service.key
            for s in steps
            if s.service.role == t
            and not s.service.headless
            and s.current is not None
            and s.current.running
        ]
        for t in TIERS
    }
    green = {t: [s.key for s in plan.services() if s.role == t and not s.headless] for t in TIERS}
    # blue/green replaces every engine: one kept as it runs would pair old with new
    every = all(s.kind == "recreate" for s in steps if s.service.is_engine and s.current)
    ok = plan.proxy is not None and every
    # degraded mode needs the same, and an engine in each tier before and after, not a proxy
    both = all(blue[t] and green[t] for t in TIERS)
    alone = every and both
    replaced = replaced_engines(steps)
    engines = [s for s in steps if s.service.is_engine]
    changed = changed_tiers(engines)
    # a compatible change: only a tier of one that would go down, and only where degraded
    # mode carries the whole change: no engine data-parallel or new, the router as it runs
    # (the proxy's and watch's steps are `up`'s own, on every path), and no host with
    # engines of both tiers (the roll orders GPUs handed between them; a tier's replacement
    # does not)
    hosts = {t: {s.service.host for s in engines if s.service.role == t} for t in TIERS}
    carried = (
        both
        and not any(s.service.headless or s.kind == "create" for s in engines)
        and all(s.kind == "unchanged" for s in steps if s.service.role == "router")
        and not hosts["prefill"] & hosts["decode"]
    )
    lone = [t for t in changed if len(blue[t]) == 1 and any(s.service.role == t for s in replaced)]
    return choose(
        replaced,
        compat,
        blue,
        green,
        blue_green=ok,
        degraded=alone,
        lone=lone if carried else (),
        changed=changed,
    )


@dataclass(frozen=True)
class Decision:
    """The path a change takes and the change plan it applies: an outage replaces every
    engine at once (all_at_once), blue/green and degraded mode have no roll steps (their
    phases are the steps)."""

    change: ChangePlan
    path: UpgradePath | None = None  # None: no running engine is replaced
    pending: bool = False  # `up --plan` only: the path waits on a version read after the pull

    def taken(self, kind: PathKind) -> bool:
        return self.path is not None and self.path.kind == kind and not self.pending


def decide(
    plan: Plan,
    change: ChangePlan,
    running: Mapping[str, ImageVersion],
    images: Mapping[str, ImageVersion],
    *,
    pulled: bool,
) -> Decision:
    """Roll, blue/green, degraded mode or outage, from the builds that run and the ones the
    new images hold (deploy/versions.py reads both). ``pulled``: `up` read the pulled
    images' versions; False for `up --plan`, which pulls nothing: a new image not on its
    host yet leaves the path pending (a version never read is never assumed equal, so `up`
    itself never waits: it goes blue/green, through degraded mode, or an outage)."""
    if not change.rolls:
        return Decision(change)
    path = upgrade_path(plan, change.stages, images, running)
    if not pulled and unread_build_only(path):
        return Decision(change, path, pending=True)
    if path.kind == "outage":
        change = all_at_once(plan, change)
    elif path.kind in ("blue-green", "degraded"):
        change = replace(change, roll=replace(change.roll, steps=()))
    return Decision(change, path)


def unread_build_only(path: UpgradePath) -> bool:
    """The only differences are new images whose vLLM version is not known yet (`up --plan`
    pulls nothing): the path depends on what `up` reads after the pull."""
    diffs = path.compat.differences
    return bool(diffs) and all(d.factor == "vllm_version" and d.new == UNKNOWN for d in diffs)


__all__ = [
    "Decision",
    "PathKind",
    "Phase",
    "UpgradePath",
    "blue_green_phases",
    "choose",
    "compatibility",
    "decide",
    "degraded_phases",
    "replaced_engines",
    "unread_build_only",
    "upgrade_path",
]
