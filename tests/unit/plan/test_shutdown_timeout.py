"""Engines that stop safely: vLLM's --shutdown-timeout defaults to 0 (abort every request in
flight on SIGTERM); pdboot gives each engine timeouts.drain_seconds where the release's own
`vllm serve` parser has the flag, and Docker a stop grace beyond it. Neither is in the config
hash: pdboot's upgrade adding them replaces no running engine (for a tier of one, an outage)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pdboot.inventory.optionlists import VLLM_SERVE_BY_VERSION
from pdboot.plan import vllm_args
from pdboot.plan.build import _with_hash, build_plan
from pdboot.plan.model import STOP_GRACE_S, Service
from pdboot.plan.render import service_definition
from tests.unit.builders import inventory
from tests.unit.paths import ROOT

FLAG = "--shutdown-timeout"
# copies of the real wheels' parser dumps (the stand-in's; a contract test keeps them so)
CAPTURES = {
    "0.33.0": ROOT / "tests/testbed/standin/serve-args.json",
    "0.34.0": ROOT / "tests/testbed/standin/serve-args-0.34.0.json",
}


def _value(command: tuple[str, ...], flag: str) -> list[str]:
    return [command[i + 1] for i, a in enumerate(command[:-1]) if a == flag]


def _engines(plan: object) -> list[Service]:
    return [s for s in plan.services() if s.is_engine]  # type: ignore[attr-defined]


@pytest.mark.parametrize("release", sorted(CAPTURES))
def test_the_real_parsers_take_the_flag_as_seconds_defaulting_to_abort(release: str) -> None:
    actions = json.loads(CAPTURES[release].read_text())["actions"]
    (flag,) = [a for a in actions if FLAG in a["option_strings"]]
    assert (flag["type"], flag["default"]) == ("int", 0)  # 0 = abort
    assert FLAG in VLLM_SERVE_BY_VERSION[release]


@pytest.mark.parametrize("image", ["vllm/vllm-openai:v0.33.0", "vllm/vllm-openai:v0.34.0"])
def test_every_engine_waits_drain_seconds_and_docker_waits_longer(image: str) -> None:
    plan = build_plan(inventory(image=image, overrides={"timeouts.drain_seconds": 90.5}))
    engines = _engines(plan)
    assert {s.role for s in engines} == {"prefill", "decode"}
    for s in engines:
        assert _value(s.command, FLAG) == ["91"], s.key  # whole seconds, rounded up
        assert s.stop_grace_s == 91 + vllm_args.STOP_MARGIN_S
        assert service_definition(s)["stop_grace_period"] == f"{s.stop_grace_s}s"
    assert plan.router.stop_grace_s is None
    assert "stop_grace_period" not in service_definition(plan.router)
    assert plan.stop_grace_s == 121 > STOP_GRACE_S


def test_no_flag_where_the_release_parser_lacks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    older = tuple(o for o in VLLM_SERVE_BY_VERSION["0.34.0"] if o != FLAG)
    monkeypatch.setitem(VLLM_SERVE_BY_VERSION, "0.34.0", older)
    plan = build_plan(inventory(image="vllm/vllm-openai:v0.34.0"))
    for s in _engines(plan):
        assert FLAG not in s.command, s.key


def test_the_tiers_own_value_wins_and_docker_still_waits_longer() -> None:
    inv = inventory(overrides={"decode.extra_args": [f"{FLAG}=600"]})
    by_role = {s.role: s for s in _engines(build_plan(inv))}
    assert by_role["decode"].command.count(f"{FLAG}=600") == 1
    assert FLAG not in by_role["decode"].command  # not twice
    assert _value(by_role["prefill"].command, FLAG) == ["120"]
    assert {s.stop_grace_s for s in by_role.values()} == {600 + vllm_args.STOP_MARGIN_S}


def test_neither_is_in_the_config_hash() -> None:
    """The hash is the one pdboot computed before it rendered them (no engine replaced by
    pdboot's upgrade) and a new drain_seconds replaces none; any other change still does."""
    base = {s.key: s for s in _engines(build_plan(inventory()))}
    longer = build_plan(inventory(overrides={"timeouts.drain_seconds": 300}))
    for s in _engines(longer):
        assert s.config_hash == base[s.key].config_hash, s.key
        i = s.command.index(FLAG)
        before = replace(s, command=s.command[:i] + s.command[i + 2 :], stop_grace_s=None)
        assert _with_hash(before).config_hash == s.config_hash
        moved = replace(s, command=(*s.command, "--max-num-seqs", "8"))
        assert _with_hash(moved).config_hash != s.config_hash
