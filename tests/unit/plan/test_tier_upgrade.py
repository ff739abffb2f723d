"""A new vLLM build for a tier of one, through degraded mode (pure: plan/tier_upgrade.py and
its phases as plan/upgrade.py shows them): which tier serves in each phase, with what
capacity, what runs, and that an old and a new engine are never in rotation together."""

from __future__ import annotations

from pdboot.plan import nixl_compat as nc
from pdboot.plan import upgrade as up
from pdboot.plan.tier_upgrade import capacity, engines_in_rotation, running, tier_phases

ONE = {"prefill": ["prefill@p1"], "decode": ["decode@d1"]}
WIDE = {"prefill": ["prefill@p1"], "decode": ["decode@d1", "decode@d2"]}
NEW_BUILD = nc.classify(
    {
        "prefill@p1": (
            nc.hash_inputs(["/m"], {}, nc.ImageVersion("0.33.0", "")),
            nc.hash_inputs(["/m"], {}, nc.ImageVersion("0.33.0+nightly.1", "")),
        )
    }
)


def test_one_prefill_one_decode_serves_the_old_decode_then_the_new_prefill_then_pd() -> None:
    phases = tier_phases(ONE, ONE)
    assert [(p.action, p.mode, p.tier) for p in phases] == [
        ("serve", "decode_only", None),
        ("replace", "decode_only", "prefill"),
        ("serve", "prefill_only", None),
        ("replace", "prefill_only", "decode"),
        ("prove", "prefill_only", None),
        ("serve", "pd", None),
    ]
    assert phases[0].engines == ("decode@d1",)  # the old decode, alone
    assert phases[2].engines == ("prefill@p1",)  # the new prefill, alone
    assert phases[5].engines == ("decode@d1", "prefill@p1")
    assert [p.number for p in phases] == [1, 2, 3, 4, 5, 6]


def test_each_phase_has_one_tier_serving_until_pd_again() -> None:
    caps = [[c.describe() for c in capacity(p, ONE, ONE)] for p in tier_phases(ONE, ONE)]
    assert caps == [
        ["prefill 0/1", "decode 1/1"],
        ["prefill 0/1", "decode 1/1"],
        ["prefill 1/1", "decode 0/1"],
        ["prefill 1/1", "decode 0/1"],
        ["prefill 1/1", "decode 0/1"],
        ["prefill 1/1", "decode 1/1"],
    ]


def test_the_old_and_the_new_build_never_run_in_rotation_together() -> None:
    for p in tier_phases(ONE, ONE):
        rows = running(p, ONE, ONE)
        if p.mode == "decode_only":
            serving = [r for r in rows if "decode@" in r]
        elif p.mode == "prefill_only":
            serving = [r for r in rows if "prefill@" in r]
        else:
            serving = list(rows)
        assert len({r.split(":")[0] for r in serving}) == 1, (p, rows)
    last = running(tier_phases(ONE, ONE)[-1], ONE, ONE)
    assert last == ("green: prefill@p1", "green: decode@d1")
    second = running(tier_phases(ONE, ONE)[1], ONE, ONE)
    assert second == ("green: prefill@p1", "blue: decode@d1")  # the prefill replaced


def test_a_wider_decode_tier_serves_with_every_decode_and_grows_with_the_inventory() -> None:
    green = {"prefill": ["prefill@p1"], "decode": ["decode@d1", "decode@d2", "decode@d3"]}
    phases = tier_phases(WIDE, green)
    assert phases[0].engines == ("decode@d1", "decode@d2")
    assert phases[3].engines == ("decode@d1", "decode@d2", "decode@d3")
    assert [c.describe() for c in capacity(phases[0], WIDE, green)] == [
        "prefill 0/1",
        "decode 2/3",
    ]
    assert [c.describe() for c in capacity(phases[5], WIDE, green)] == [
        "prefill 1/1",
        "decode 3/3",
    ]


def test_a_serve_phase_names_the_router_entries_by_engine_url() -> None:
    tiers = {"prefill@p1": "prefill", "decode@d1": "decode"}
    urls = {"prefill@p1": "http://p1:8100", "decode@d1": "http://d1:8200"}
    phases = tier_phases(ONE, ONE)
    assert engines_in_rotation(phases[0], tiers, urls) == {"http://d1:8200": "decode"}  # type: ignore[arg-type]
    assert engines_in_rotation(phases[5], tiers, urls) == {  # type: ignore[arg-type]
        "http://d1:8200": "decode",
        "http://p1:8100": "prefill",
    }


def test_the_path_shows_six_phases_with_the_endpoint_up_and_the_mode_of_each() -> None:
    path = up.choose(
        [object()],  # type: ignore[list-item]
        NEW_BUILD,
        ONE,
        ONE,
        blue_green=True,
        degraded=True,
    )
    assert path.kind == "degraded"
    assert "through degraded mode" in path.describe()
    assert "each have one engine" in path.why and "0.33.0 -> 0.33.0+nightly.1" in path.why
    assert [p.mode for p in path.phases] == [
        "decode_only",
        "decode_only",
        "prefill_only",
        "prefill_only",
        "prefill_only",
        "pd",
    ]
    assert [p.serving for p in path.phases] == ["blue", "blue", "green", "green", "green", "green"]
    assert all(p.endpoint_up for p in path.phases)
    assert "old decode tier alone" in path.phases[0].what
    assert "new prefill tier alone" in path.phases[2].what
    assert "P/D again" in path.phases[5].what
