"""The path an image change takes, decided from plain values (plan/upgrade.py's ``decide``):
what `up` read from the hosts (the build each engine runs, the build each new image holds)
comes in as arguments, so the choice itself needs no host. deploy/versions.py reads them."""

from __future__ import annotations

from dataclasses import replace

from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.plan.change_plan import ChangeOptions, change_plan
from pdboot.plan.converge import Observed
from pdboot.plan.model import Plan
from pdboot.plan.nixl_compat import UNKNOWN, ImageVersion
from pdboot.plan.upgrade import Decision, decide
from tests.unit.builders import ROLL_HOSTS, inventory, running_as_planned

OLD, NEW = "registry.example:5000/vllm:a", "registry.example:5000/vllm:b"
V33 = ImageVersion("0.33.0", "")
NIGHTLY = ImageVersion("0.33.0+nightly.1", "")


def two_and_two(image: str) -> Inventory:
    return inventory(ROLL_HOSTS, ["p1", "p2"], ["d1", "d2"], "r", image=image)


def one_and_one(image: str) -> Inventory:
    return inventory(image=image)


def running(p: Plan) -> list[Observed]:
    """What the hosts report of ``p`` running: its labels, and the image, command and
    environment that docker inspect shows (what NIXL's hash inputs are read from)."""
    by_key = {s.key: s for s in p.services()}
    return [
        replace(
            o,
            image=by_key[key].image,
            command=tuple(by_key[key].command),
            env=tuple(sorted(dict(by_key[key].environment).items())),
        )
        for key, o in zip(by_key, running_as_planned(by_key.values()))
    ]


def decided(old: Inventory, new: Inventory, new_build: ImageVersion, *, pulled: bool) -> Decision:
    before, after = build_plan(old), build_plan(new)
    change = change_plan(after, running(before), ChangeOptions(live=True))
    builds = {s.key: V33 for s in before.services() if s.is_engine}
    return decide(after, change, builds, {NEW: new_build}, pulled=pulled)


def test_the_same_build_in_a_new_image_rolls_engine_by_engine() -> None:
    d = decided(two_and_two(OLD), two_and_two(NEW), V33, pulled=True)
    assert d.path is not None and d.path.kind == "roll"
    assert d.change.roll.steps  # the roll's steps are the change


def test_a_new_build_with_two_per_tier_goes_blue_green_with_no_roll_steps() -> None:
    d = decided(two_and_two(OLD), two_and_two(NEW), NIGHTLY, pulled=True)
    assert d.taken("blue-green")
    assert d.change.roll.steps == ()  # blue/green's phases are the steps


def test_a_new_build_for_a_tier_of_one_goes_through_degraded_mode() -> None:
    d = decided(one_and_one(OLD), one_and_one(NEW), NIGHTLY, pulled=True)
    assert d.taken("degraded")
    assert d.change.roll.steps == ()


def test_a_version_not_read_yet_leaves_the_plan_pending_and_up_never_assumes_it() -> None:
    unread = ImageVersion(UNKNOWN, "")
    shown = decided(two_and_two(OLD), two_and_two(NEW), unread, pulled=False)  # up --plan
    assert shown.pending and shown.path is not None
    assert not shown.taken("blue-green") and not shown.taken("roll")
    acted = decided(two_and_two(OLD), two_and_two(NEW), unread, pulled=True)  # up itself
    assert not acted.pending
    assert acted.path is not None and acted.path.kind != "roll"


def test_no_engine_replaced_is_no_path() -> None:
    same = two_and_two(OLD)
    d = decided(same, same, V33, pulled=True)
    assert d.path is not None and d.path.kind == "none"
    assert d.change.roll.steps == ()


def settings_changed(old: Inventory, new: Inventory) -> Decision:
    """The same image (its build read as the running one), other settings."""
    before, after = build_plan(old), build_plan(new)
    change = change_plan(after, running(before), ChangeOptions(live=True))
    builds = {s.key: V33 for s in before.services() if s.is_engine}
    return decide(after, change, builds, {OLD: V33}, pulled=True)


def test_a_compatible_change_to_a_decode_tier_of_one_goes_through_degraded_mode() -> None:
    """A roll would take the only decode, and the endpoint, down: the prefill tier serves
    alone while the decode tier (only it) is replaced, then P/D again."""
    longer = {"decode.extra_args": ["--max-model-len", "4096"]}
    new = inventory(image=OLD, overrides=longer)
    d = settings_changed(one_and_one(OLD), new)
    assert d.taken("degraded") and d.path is not None
    assert d.path.compat.compatible
    assert "the decode tier has one engine, which a roll would take down" in d.path.why
    assert [(p.mode, p.running) for p in d.path.phases] == [
        ("prefill_only", ("blue: prefill@p1", "blue: decode@d1")),
        ("prefill_only", ("blue: prefill@p1", "green: decode@d1")),
        ("prefill_only", ("blue: prefill@p1", "green: decode@d1")),
        ("pd", ("blue: prefill@p1", "green: decode@d1")),
    ]
    assert "starts with its new settings" in d.path.phases[1].what
    caps = [[c.describe() for c in p.capacity] for p in d.path.phases]
    assert caps[0] == ["prefill 1/1", "decode 0/1"] and caps[-1] == ["prefill 1/1", "decode 1/1"]
    assert all(p.endpoint_up for p in d.path.phases)
    assert d.change.roll.steps == ()


def test_a_compatible_change_with_two_engines_a_tier_still_rolls() -> None:
    longer = {"decode.extra_args": ["--max-model-len", "4096"]}
    new = inventory(ROLL_HOSTS, ["p1", "p2"], ["d1", "d2"], "r", image=OLD, overrides=longer)
    d = settings_changed(two_and_two(OLD), new)
    assert d.path is not None and d.path.kind == "roll"
    assert d.change.roll.steps


def test_a_compatible_change_that_also_changes_the_router_rolls_as_before() -> None:
    """Degraded mode's phases do not carry a router change: the roll (with its outage asked
    for the tier of one) stays the path."""
    both = {"decode.extra_args": ["--max-model-len", "4096"], "router.request_timeout_secs": 600}
    new = inventory(image=OLD, overrides=both)
    d = settings_changed(one_and_one(OLD), new)
    assert d.path is not None and d.path.kind == "roll", d.path
    assert d.change.roll.outages


def test_a_decode_of_one_changed_while_a_second_joins_rolls_without_an_outage() -> None:
    """A new engine in the changed tier: the roll adds it before it replaces the old one, so
    the tier never goes down; degraded mode is not needed (nor does it order GPUs)."""
    longer = {"decode.extra_args": ["--max-model-len", "4096"]}
    new = inventory(ROLL_HOSTS, ["p1"], ["d1", "d2"], "r", image=OLD, overrides=longer)
    d = settings_changed(inventory(ROLL_HOSTS, ["p1"], ["d1"], "r", image=OLD), new)
    assert d.path is not None and d.path.kind == "roll", d.path
    assert not d.change.roll.outages
