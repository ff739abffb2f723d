"""Every engine command pdboot renders for the shipped example inventories, parsed by an
argparse parser built from the real `vllm serve` 0.34.0 dump (../shared/fixtures/vllm-0.34.0/
serve-args.json, copied under tests/): all accepted, each deployment with one explicit
--block-size. The examples name no image (the default, v0.34.0) or a CPU image; the CPU one is
rendered as if its image were a 0.34 one too, so its commands are checked the same way."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from pdboot.inventory.load import load_inventory
from pdboot.inventory.schema import DEFAULT_VLLM_IMAGE
from pdboot.plan.build import build_plan
from pdboot.plan.facts import PlanFacts
from tests.shared_data import SERVE_ARGS_034_JSON, SERVE_ARGS_JSON

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted([*(ROOT / "examples").glob("*.yaml"), ROOT / "inventory.example.yaml"])


class _EnableDisable(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, option_string == self.option_strings[0])


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would exit 2
        raise _Refused(message)


def parser(dump: Path) -> argparse.ArgumentParser:
    """The real parser's actions, types left to strings except where they matter (choices)."""
    p = _Parser(prog="vllm serve", add_help=False)
    for a in json.loads(dump.read_text())["actions"]:
        opts = a["option_strings"]
        if not opts:
            p.add_argument(a["dest"], nargs=a["nargs"])
            continue
        kw: dict[str, Any] = {"dest": a["dest"]}
        if a["action"] in ("_StoreTrueAction", "_StoreFalseAction", "_HelpAction"):
            kw["action"] = "store_true"
        elif a["action"] == "EnableDisableAction":
            kw.update(action=_EnableDisable, nargs=0)
        elif a["action"] == "_AppendAction":
            kw["action"] = "append"
        else:
            kw["nargs"] = a["nargs"] if a["nargs"] != 0 else None
            if a["choices"] and all(isinstance(c, str) for c in a["choices"]):
                kw["choices"] = a["choices"]
        p.add_argument(*opts, **kw)
    return p


def engine_commands(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    inv = load_inventory(path)
    if inv.image != DEFAULT_VLLM_IMAGE:  # the CPU example: its own image, as a 0.34 one
        inv = inv.model_copy(update={"image": "registry.example:5000/pdboot/vllm-cpu:0.34.0"})
    plan = build_plan(inv, PlanFacts(gpu_counts=dict.fromkeys(inv.hosts, 8)))
    return [(s.name, s.command) for s in plan.services() if s.is_engine]


def test_the_default_image_is_034() -> None:
    assert DEFAULT_VLLM_IMAGE == "vllm/vllm-openai:v0.34.0"
    assert json.loads(SERVE_ARGS_034_JSON.read_text())["vllm_version"] == "0.34.0"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_engine_command_parses_under_034_with_one_block_size(path: Path) -> None:
    p = parser(SERVE_ARGS_034_JSON)
    cmds = engine_commands(path)
    assert cmds
    sizes = set()
    for name, cmd in cmds:
        ns = p.parse_args(list(cmd))  # raises _Refused on anything 0.34.0 would refuse
        assert cmd.count("--block-size") == 1, (name, cmd)
        sizes.add(ns.block_size)
        if "--kv-transfer-config" in cmd:
            json.loads(ns.kv_transfer_config)
    assert len(sizes) == 1, sizes


def test_the_parser_refuses_what_vllm_refuses() -> None:
    """The check above can fail: 0.34.0's parser refuses a typo and an option 0.33.0 lacks
    is refused by the 0.33.0 dump."""
    with pytest.raises(_Refused, match="unrecognized arguments: --max-model-lenn"):
        parser(SERVE_ARGS_034_JSON).parse_args(["m", "--max-model-lenn", "1"])
    with pytest.raises(_Refused, match="--disable-extensible-kv-cache"):
        parser(SERVE_ARGS_JSON).parse_args(["m", "--disable-extensible-kv-cache"])
    parser(SERVE_ARGS_034_JSON).parse_args(["m", "--disable-extensible-kv-cache"])
