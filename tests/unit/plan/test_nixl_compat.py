"""What enters NIXL's compatibility hash, and the path a change takes (pure:
pdboot/plan/nixl_compat.py, pdboot/plan/upgrade.py), with plain argv, environments and
versions; the probe that reads the versions: test_image_args.py."""

from __future__ import annotations

import json

import pytest

from pdboot.plan import nixl_compat as nc
from pdboot.plan import upgrade as up

KV = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_producer"})
BASE = ["/models/llama", "--port", "8100", "--kv-transfer-config", KV]
V32 = nc.ImageVersion("0.32.0", "15")


def inputs(argv: list[str], version: nc.ImageVersion | None = V32, **env: str) -> nc.HashInputs:
    return nc.hash_inputs(argv, env, version)


def test_the_same_build_and_arguments_are_compatible() -> None:
    a = inputs([*BASE, "--max-num-seqs", "8"])
    b = inputs([*BASE, "--max-num-seqs", "16"])  # not a hash input: the roll is right
    verdict = nc.classify({"decode@d1": (a, b)})
    assert verdict.compatible and not verdict.differences


@pytest.mark.parametrize(
    ("old", "new", "factor"),
    [
        (["--dtype", "bfloat16"], ["--dtype=float16"], "dtype"),
        ([], ["--kv-cache-dtype", "fp8"], "kv_cache_dtype"),
        ([], ["--attention-backend", "FLASHINFER"], "attention_backend"),
        ([], ["--attention-config", '{"backend": "TRITON_ATTN"}'], "attention_backend"),
        (["--block-size", "16"], ["--block_size", "64"], "block_size"),
        ([], ["--disable-hybrid-kv-cache-manager"], "hybrid_kv_cache_manager"),
        ([], ["-sc", '{"method": "eagle"}'], "speculative_config"),
    ],
)
def test_each_argument_that_enters_the_hash_makes_it_incompatible(
    old: list[str], new: list[str], factor: str
) -> None:
    verdict = nc.classify({"prefill@p1": (inputs(BASE + old), inputs(BASE + new))})
    assert not verdict.compatible
    assert [d.factor for d in verdict.differences] == [factor]
    assert verdict.differences[0].engine == "prefill@p1"


def test_another_model_string_and_connector_are_incompatible() -> None:
    push = [*BASE[:-1], json.dumps({"kv_connector": "NixlPushConnector"})]
    moved = ["/models/other", *BASE[1:]]
    assert [d.factor for d in nc.compare("e", inputs(BASE), inputs(push))] == ["transfer_mode"]
    assert [d.factor for d in nc.compare("e", inputs(BASE), inputs(moved))] == ["model"]


def test_push_by_transfer_mode_is_the_push_connector_and_pull_is_the_default() -> None:
    """0.34: NixlConnector with kv_connector_extra_config.transfer_mode "push" is the push
    connector, which real vLLM hashes apart from pull (tests/e2e/real_engine/
    test_contract_hash.py runs the real function); "pull" is what no mode says."""

    def kv(**extra: str) -> list[str]:
        cfg = {"kv_connector": "NixlConnector", "kv_connector_extra_config": extra}
        return [*BASE[:-1], json.dumps(cfg)]

    push, pull = inputs(kv(transfer_mode="push")), inputs(kv(transfer_mode="pull"))
    assert [d.factor for d in nc.compare("e", inputs(BASE), push)] == ["transfer_mode"]
    assert nc.compare("e", inputs(BASE), pull) == []
    by_name = [*BASE[:-1], json.dumps({"kv_connector": "NixlPushConnector"})]
    assert nc.compare("e", push, inputs(by_name)) == []


def test_the_attention_backend_variable_counts_where_no_argument_sets_it() -> None:
    a = inputs(BASE, VLLM_ATTENTION_BACKEND="FLASH_ATTN")
    b = inputs(BASE, VLLM_ATTENTION_BACKEND="XFORMERS")
    assert [d.factor for d in nc.compare("e", a, b)] == ["attention_backend"]


def test_a_version_string_that_differs_is_incompatible_and_named() -> None:
    """A nightly: the same release, another version string (what the issue measured)."""
    nightly = nc.ImageVersion("0.32.0+nightly", "15")
    verdict = nc.classify({"prefill@p1": (inputs(BASE), inputs(BASE, nightly))})
    assert not verdict.compatible
    assert verdict.why == "prefill@p1: vLLM version 0.32.0 -> 0.32.0+nightly"


def test_the_connector_version_counts_only_where_both_were_read() -> None:
    v16 = nc.ImageVersion("0.32.0", "16")
    unread = nc.ImageVersion("0.32.0", "")
    assert nc.compare("e", inputs(BASE), inputs(BASE, v16))[0].factor == "connector_version"
    assert nc.compare("e", inputs(BASE), inputs(BASE, unread)) == []


def test_an_unread_version_is_never_assumed_equal() -> None:
    diffs = nc.compare("e", inputs(BASE, None), inputs(BASE, None))
    assert [d.factor for d in diffs] == ["vllm_version"]
    assert diffs[0].describe() == "e: vLLM version ? -> ?"


def test_an_unchanged_image_keeps_its_build_even_unread() -> None:
    old, new = nc.same_image_version("img:a", "img:a", {}, None)
    assert old == new and old is not None
    old, new = nc.same_image_version("img:a", "img:b", {"img:b": V32}, None)
    assert (old, new) == (None, V32)  # the old one unread: a difference, as above
    running = nc.ImageVersion("0.31.0", "")
    assert nc.same_image_version("img:a", "img:b", {"img:b": V32}, running) == (running, V32)


BLUE = {"prefill": ["prefill@p1", "prefill@p2"], "decode": ["decode@d1", "decode@d2"]}
NIGHTLY = nc.classify(
    {"prefill@p1": (inputs(BASE), inputs(BASE, nc.ImageVersion("0.32.0+nightly", "15")))}
)
SAME = nc.classify({"prefill@p1": (inputs(BASE), inputs(BASE))})
REPLACED = [object()]  # choose only asks whether any engine is replaced


def test_a_compatible_change_rolls_and_says_why() -> None:
    path = up.choose(REPLACED, SAME, BLUE, BLUE, blue_green=True)  # type: ignore[arg-type]
    assert path.kind == "roll" and "keeps its vLLM version" in path.describe()


def test_an_incompatible_change_goes_blue_green_through_five_phases() -> None:
    path = up.choose(REPLACED, NIGHTLY, BLUE, BLUE, blue_green=True)  # type: ignore[arg-type]
    assert path.kind == "blue-green" and "0.32.0 -> 0.32.0+nightly" in path.why
    caps = [[c.describe() for c in p.capacity] for p in path.phases]
    assert caps == [
        ["prefill 1/2", "decode 1/2"],  # half of each blue tier drained
        ["prefill 1/2", "decode 1/2"],  # green starts and is proven; blue serves
        ["prefill 1/2", "decode 1/2"],  # the proxy switched: green serves
        ["prefill 1/2", "decode 1/2"],
        ["prefill 2/2", "decode 2/2"],  # green grew to the inventory
    ]
    assert all(p.endpoint_up for p in path.phases)
    assert [p.serving for p in path.phases] == ["blue", "blue", "green", "green", "green"]
    assert path.phases[0].running == ("blue: prefill@p1", "blue: decode@d1")
    assert "green: prefill@p2" in path.phases[1].running  # on the freed host
    assert not any(r.startswith("blue") for r in path.phases[3].running)


def test_a_tier_of_one_goes_through_degraded_mode_and_says_which() -> None:
    blue = {"prefill": ["prefill@p1"], "decode": ["decode@d1", "decode@d2"]}
    path = up.choose(REPLACED, NIGHTLY, blue, blue, blue_green=True, degraded=True)  # type: ignore[arg-type]
    assert path.kind == "degraded" and "the prefill tier has one engine" in path.why
    assert all(p.endpoint_up for p in path.phases)


def test_a_tier_of_one_without_degraded_mode_is_an_outage_and_says_which() -> None:
    """An engine kept as it runs (not every engine replaced): neither path may run."""
    blue = {"prefill": ["prefill@p1"], "decode": ["decode@d1", "decode@d2"]}
    path = up.choose(REPLACED, NIGHTLY, blue, blue, blue_green=True)  # type: ignore[arg-type]
    assert path.kind == "outage" and "the prefill tier has one engine" in path.why
    assert not path.phases[0].endpoint_up


def test_without_a_proxy_an_incompatible_change_goes_through_degraded_mode() -> None:
    path = up.choose(REPLACED, NIGHTLY, BLUE, BLUE, blue_green=False, degraded=True)  # type: ignore[arg-type]
    assert path.kind == "degraded" and "blue/green needs the proxy in front" in path.why


def test_without_blue_green_or_degraded_mode_an_incompatible_change_is_an_outage() -> None:
    path = up.choose(REPLACED, NIGHTLY, BLUE, BLUE, blue_green=False)  # type: ignore[arg-type]
    assert path.kind == "outage" and "blue/green needs the proxy" in path.why


def test_nothing_replaced_is_no_upgrade() -> None:
    assert up.choose([], NIGHTLY, BLUE, BLUE, blue_green=True).kind == "none"


def test_green_starts_in_the_freed_places_only_never_beside_blue_on_one_host() -> None:
    """Two prefills on one host: freeing one (the last by name, prefill@a) must not start
    green's prefill-1@a, which is blue's and still serving."""
    blue = {"prefill": ["prefill-1@a", "prefill@a"], "decode": ["decode-1@b", "decode@b"]}
    phases = up.blue_green_phases(blue, blue)
    assert phases[0].running == ("blue: prefill-1@a", "blue: decode-1@b")
    assert phases[1].running == (
        "blue: prefill-1@a",
        "blue: decode-1@b",
        "green: prefill@a",
        "green: decode@b",
    )
