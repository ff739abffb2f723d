"""Rendering (issue 18, item 9, the review's reproduction): extra_args with odd characters read
back identically from the rendered compose YAML."""

from __future__ import annotations

import pytest
import yaml

from pdboot.inventory.load import parse_inventory
from pdboot.plan.build import build_plan
from pdboot.plan.render import render_all
from tests.unit.builders import TWO_HOSTS_TEXT

GOOD = TWO_HOSTS_TEXT


ODD = ["a\u2028b", "x\x85y", "p\u2029q", "\ufeffbom", "tab\there", "é–ü", "$HOME ${X}", "a\nb"]  # noqa: RUF001


@pytest.mark.parametrize("value", ODD)
def test_extra_args_read_back_identically_from_the_rendered_yaml(value: str) -> None:
    import json

    text = GOOD.replace(
        "decode: {hosts: [gpu-b]}",
        f"decode: {{hosts: [gpu-b], extra_args: [--chat-template-content-format, {json.dumps(value)}]}}",
    )
    plan = build_plan(parse_inventory(text))
    rendered = render_all(plan)["gpu-b"]
    cmd = yaml.safe_load(rendered)["services"]["decode"]["command"]
    # compose un-doubles $$ (render's interpolation escape); nothing else may change
    assert [c.replace("$$", "$") for c in cmd][-1] == value
    assert [c.replace("$$", "$") for c in cmd] == list(plan.hosts["gpu-b"].services[0].command)
