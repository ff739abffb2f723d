"""The vLLM release an inventory targets and what it refuses at load/render
(pdboot/inventory/vllm_target.py, vllm_rules.py), on the real option lists of 0.33.0 and 0.34.0
(inventory/optionlists.py, generated from the shared dumps of the real wheels)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdboot.cli.main import app
from pdboot.inventory import optionlists
from pdboot.inventory.load import InventoryError, parse_inventory
from pdboot.inventory.vllm_rules import block_size
from pdboot.inventory.vllm_target import extra_args_problems, refused_env, tag_version, target
from tests.shared_data import SERVE_ARGS_034_JSON, SERVE_ARGS_JSON

BASE = """\
name: demo
model: meta-llama/Llama-3.1-8B-Instruct
image: {image}
hosts:
  gpu-a: {{address: 192.0.2.10}}
  gpu-b: {{address: 192.0.2.11}}
prefill: {{hosts: [gpu-a], extra_args: {pargs}, env: {penv}}}
decode: {{hosts: [gpu-b], extra_args: {dargs}}}
router: {{host: gpu-a{router}}}
kv_transfer: {kv}
"""


def inv_text(
    image: str = "vllm/vllm-openai:v0.34.0",
    pargs: object = (),
    dargs: object = (),
    penv: object = None,
    router: str = "",
    kv: object = None,
) -> str:
    return BASE.format(
        image=image,
        pargs=json.dumps(list(pargs)),  # type: ignore[call-overload]
        dargs=json.dumps(list(dargs)),  # type: ignore[call-overload]
        penv=json.dumps(penv or {}),
        router=router,
        kv=json.dumps(kv or {}),
    )


def messages(text: str) -> list[str]:
    with pytest.raises(InventoryError) as exc:
        parse_inventory(text, file="inv.yaml")
    return [str(i) for i in exc.value.issues]


@pytest.mark.parametrize(
    ("image", "tagged", "version"),
    [
        ("vllm/vllm-openai:v0.34.0", "0.34.0", "0.34.0"),
        ("vllm/vllm-openai:v0.33.0", "0.33.0", "0.33.0"),
        ("10.77.2.1:5000/vllm/vllm-openai:v0.34.2", "0.34.2", "0.34.0"),  # a patch: its minor
        ("vllm/vllm-openai:nightly", None, "0.34.0"),  # no release named: the newest known
        ("vllm/vllm-openai@sha256:" + "a" * 64, None, "0.34.0"),
        ("pdboot/vllm-cpu:0.32.0", "0.32.0", "0.33.0"),  # older than any known: the oldest
        ("vllm/vllm-openai:v0.40.1", "0.40.1", "0.34.0"),
        ("localhost:5000/vllm:v0.33.0-cu130", "0.33.0", "0.33.0"),
    ],
)
def test_the_release_comes_from_the_tag(image: str, tagged: str | None, version: str) -> None:
    assert tag_version(image) == tagged
    t = target(image)
    assert t.version == version and t.tagged == tagged
    assert ("pdboot knows" in t.describe() or "no list" in t.describe()) == (not t.exact)


def test_the_lists_are_the_real_dumps() -> None:
    for version, path in (("0.33.0", SERVE_ARGS_JSON), ("0.34.0", SERVE_ARGS_034_JSON)):
        doc = json.loads(path.read_text())
        real = {o for a in doc["actions"] for o in a["option_strings"]}
        assert set(optionlists.VLLM_SERVE_BY_VERSION[version]) == real
    assert len(json.loads(SERVE_ARGS_034_JSON.read_text())["actions"]) == 328


@pytest.mark.parametrize(
    ("args", "index", "words"),
    [
        (
            ["--max-model-lenn", "32768"],
            0,
            r"--max-model-lenn is not an option.*did you mean --max-model-len\?",
        ),
        (["--max-model-len 32768"], 0, r"holds a space.*'--max-model-len', '32768'"),
        (
            ["--enforce-eager", "--gpu-memory-utilisation=0.8"],
            1,
            r"did you mean --gpu-memory-utilization",
        ),
        (["--max-num"], 0, r"ambiguous abbreviation"),
        (["--max_model_lenn=9"], 0, r"did you mean --max-model-len"),
    ],
)
def test_extra_args_refused_with_did_you_mean(args: list[str], index: int, words: str) -> None:
    found = extra_args_problems(args, optionlists.VLLM_SERVE_BY_VERSION["0.34.0"], "vLLM 0.34.0")
    assert [i for i, _ in found] == [index], found
    assert re.search(words, found[0][1]), found


def test_values_are_not_options() -> None:
    ok = [
        "--max-model-len",
        "32768",
        "--compilation-config",
        '{"level": 3, "a b": 1}',
        "--seed",
        "-1",
        "--enforce-eager",
        "--max-model-len=4096",
        "-O3",
        "--max-mod",
        "1",
        "--compilation-config.level=3",
    ]
    assert extra_args_problems(ok, optionlists.VLLM_SERVE_BY_VERSION["0.34.0"], "x") == []


def test_an_option_only_034_knows_is_refused_for_033_and_taken_for_034() -> None:
    args = ["--max-num-inflight-kv-loads", "8"]
    assert messages(inv_text("vllm/vllm-openai:v0.33.0", dargs=args)) == [
        "inv.yaml:8: decode.extra_args[0]: --max-num-inflight-kv-loads is not an option of "
        "vLLM 0.33.0's `vllm serve`; vLLM 0.34.0 has it (the engine image's tag decides the "
        "release)"
    ]
    inv = parse_inventory(inv_text("vllm/vllm-openai:v0.34.0", dargs=args))
    assert inv.decode.extra_args == args


def test_render_refuses_a_typo_with_did_you_mean(tmp_path: Path) -> None:
    f = tmp_path / "inv.yaml"
    f.write_text(inv_text(dargs=["--max-model-lenn", "32768", "--max-model-len 32768"]))
    res = CliRunner().invoke(app, ["render", str(f)])
    assert res.exit_code == 2, res.output
    assert "decode.extra_args[0]: --max-model-lenn is not an option of vLLM 0.34.0's" in res.output
    assert "did you mean --max-model-len?" in res.output
    assert "decode.extra_args[2]: '--max-model-len 32768' holds a space" in res.output


def test_env_034_refuses_at_start_is_refused_at_load() -> None:
    for env, key in (
        ({"VLLM_USE_V2_MODEL_RUNNER": "0"}, "VLLM_USE_V2_MODEL_RUNNER"),
        ({"VLLM_MARLIN_INPUT_DTYPE": "fp8"}, "VLLM_MARLIN_INPUT_DTYPE"),
    ):
        found = messages(inv_text(penv=env))
        assert len(found) == 1 and f"prefill.env.{key}:" in found[0] and "0.34" in found[0]
        parse_inventory(inv_text("vllm/vllm-openai:v0.33.0", penv=env))  # 0.33 still takes it
    parse_inventory(inv_text(penv={"VLLM_USE_V2_MODEL_RUNNER": "1"}))
    assert refused_env("VLLM_USE_V2_MODEL_RUNNER", "1", "0.34.0") is None
    assert refused_env("VLLM_MARLIN_INPUT_DTYPE", "", "0.33.0") is None


@pytest.mark.parametrize(
    ("image", "kv", "words"),
    [
        (
            "vllm/vllm-openai:v0.34.0",
            {"kv_connector_extra_config": {"transfer_mode": "pul"}},
            "Invalid NixlConnector transfer_mode: 'pul'",
        ),
        (
            "vllm/vllm-openai:v0.33.0",
            {"kv_connector_extra_config": {"transfer_mode": "push"}},
            "ignores transfer_mode",
        ),
        (
            "vllm/vllm-openai:v0.34.0",
            {
                "kv_connector": "NixlPushConnector",
                "kv_connector_extra_config": {"transfer_mode": "pull"},
            },
            "NixlPushConnector pushes",
        ),
    ],
)
def test_transfer_mode_is_checked(image: str, kv: dict[str, object], words: str) -> None:
    found = messages(inv_text(image, kv=kv))
    assert any(
        "kv_transfer.kv_connector_extra_config.transfer_mode" in m and words in m for m in found
    ), found
    parse_inventory(inv_text(kv={"kv_connector_extra_config": {"transfer_mode": "push"}}))


def test_one_block_size_per_deployment() -> None:
    # defaults: the release's own, 16 for the router's kv_aware, the other tier's own value
    assert block_size(parse_inventory(inv_text())) == 64
    assert block_size(parse_inventory(inv_text("vllm/vllm-openai:v0.33.0"))) == 16
    assert block_size(parse_inventory(inv_text(router=", prefill_policy: kv_aware"))) == 16
    assert block_size(parse_inventory(inv_text(dargs=["--block-size", "32"]))) == 32
    # 0.34: different sizes refused (push at the handshake, pull without remote_num_tokens)
    found = messages(inv_text(pargs=["--block-size", "16"], dargs=["--block-size=32"]))
    assert (
        len(found) == 1
        and "one block size on both tiers" in found[0]
        and "remote_num_tokens" in found[0]
    )
    push = {"kv_connector": "NixlPushConnector"}
    found = messages(inv_text(pargs=["--block-size", "16"], dargs=["--block-size=32"], kv=push))
    assert "push connector refuses" in found[0]
    # 0.33 maps a ratio: still taken
    parse_inventory(
        inv_text(
            "vllm/vllm-openai:v0.33.0", pargs=["--block-size", "16"], dargs=["--block-size=32"]
        )
    )
    # kv_aware reads 16-token blocks
    found = messages(
        inv_text(
            dargs=["--block-size", "64"],
            pargs=["--block-size", "64"],
            router=", decode_policy: kv_aware",
        )
    )
    assert len(found) == 2 and all("kv_aware" in m for m in found)


def test_a_non_compact_layout_is_refused_with_the_extensible_kv_cache() -> None:
    found = messages(
        inv_text(pargs=["--enable-extensible-kv-cache"], penv={"VLLM_KV_CACHE_LAYOUT": "HND"})
    )
    assert len(found) == 1 and "block-compact" in found[0]
    parse_inventory(inv_text(penv={"VLLM_KV_CACHE_LAYOUT": "HND"}))  # pdboot disables it
