"""Property: whatever the inventory text, loading, planning and rendering either work or
raise InventoryError whose every issue carries a line. Nothing else escapes (issue 12).

Two generators: arbitrary text made of YAML's meta characters, and a valid inventory in
block style with one value (or key) replaced by something nasty. Bounded to a few seconds.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdboot.inventory.load import InventoryError, parse_inventory
from pdboot.plan.build import build_plan
from pdboot.plan.render import render_all, render_summary


def render(plan: Any, inv: Any) -> tuple[dict[str, str], str]:
    """render_all/render_summary take (plan, inv) before w8-plan's pure render lands and
    (plan) after it: these tests run on both sides of that merge."""
    if len(inspect.signature(render_all).parameters) == 2:
        return render_all(plan, inv), render_summary(plan, inv)  # type: ignore[call-arg]
    return render_all(plan), render_summary(plan)  # type: ignore[call-arg]


VALID = {
    "name": "demo",
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "served_model_name": "llama",
    "remote_dir": "/var/lib/pdboot",
    "ssh": {"user": "root", "port": 22, "connect_timeout": 10},
    "hosts": {
        "gpu-a": {"address": "192.0.2.10", "rdma_devices": ["mlx5_0"]},
        "gpu-b": {"address": "192.0.2.11", "net_interface": "ens1f0"},
    },
    "prefill": {"hosts": ["gpu-a"], "tensor_parallel_size": 1, "env": {"A": "b"}},
    "decode": {"hosts": ["gpu-b"], "gpus": [0], "extra_args": ["--max-model-len", "1024"]},
    "router": {"host": "gpu-a", "port": 8000},
    "kv_transfer": {"kv_connector_extra_config": {"backends": ["UCX"], "n": 4}, "rdma": "auto"},
    "container": {"shm_size": "16g", "ulimits": {"memlock": -1, "nofile": 1048576}},
    "secrets": {"hf_token": "env:HF_TOKEN", "api_key": "env:PD_KEY"},
    "requirements": {"min_driver": "580.65.06", "link_gbps": 100},
    "timeouts": {"ready_seconds": 1200, "poll_interval_seconds": 0.5},
}
VALID_LINES = yaml.safe_dump(VALID, sort_keys=False, default_flow_style=False).splitlines()

NASTY = [
    "", '""', "' '", "~", "null", "yes", "no", "on", ".inf", "-.inf", ".nan", "1e999", "1e10",
    "-2", "0", "2147483648", "18446744073709551616", "9" * 400, "0x7f", "0o17", "1_000",
    "2024-01-01", "2024-01-01T00:00:00Z", "!!set {a}", "!!binary aGk=", "!!str 1",
    "!!python/object:os.system x", '"\\0"', '"a\\x01b"', "&a [*a]", "*undefined", "&b x",
    "[" * 60 + "]" * 60, "{" * 40 + "}" * 40, "[1, [2, [3]]]", "{a: {b: {c: d}}}", "{1: 2}",
    "? [a]\n  : b", "|\n  text", ">-\n  folded", "'i-0abc;touch${IFS}PWNED;#'", "/", "/etc",
    "../..", "127.1", "'::ffff:127.0.0.1'", "local", "env:hf_abcdefghijklmnopqrstuvwxyz",
    "['--api-key', x]", "[--hf-token=x]", "{VLLM_API_KEY: x}", "{'': x}", "-", "- a\n- b",
    "{<<: {a: 1}}", "<<", "=", "!", "%", "@", "`", "'", '"', "\t", "#",
]  # fmt: skip

META = st.sampled_from([*"[]{}:,-?&*!|>'\"%@`#\n \t\\", "\n  ", "&a", "*a", "<<", "0"])


def check(text: str) -> None:
    try:
        inv = parse_inventory(text, file="inv.yaml")
    except InventoryError as e:
        assert e.issues
        for issue in e.issues:
            assert issue.line is not None, str(issue)
            assert str(issue).startswith("inv.yaml:"), str(issue)
        return
    plan = build_plan(inv)
    render(plan, inv)


BOUNDED = settings(
    # a few seconds in CI; PDBOOT_HYPOTHESIS_EXAMPLES=5000 for a deeper search by hand
    max_examples=int(os.environ.get("PDBOOT_HYPOTHESIS_EXAMPLES", "150")),
    deadline=None,  # a loaded CI machine must not turn slowness into a failure
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@BOUNDED
@given(st.lists(st.one_of(META, st.text(max_size=4)), max_size=60).map("".join))
def test_arbitrary_text(text: str) -> None:
    check(text)


@BOUNDED
@given(
    st.integers(0, len(VALID_LINES) - 1),
    st.one_of(st.sampled_from(NASTY), st.text(max_size=12)),
    st.booleans(),
)
def test_valid_inventory_with_one_nasty_value(index: int, nasty: str, as_key: bool) -> None:
    lines = list(VALID_LINES)
    line = lines[index]
    indent = line[: len(line) - len(line.lstrip())]
    if as_key and ":" in line:
        lines[index] = f"{indent}{nasty}:{line.split(':', 1)[1]}"
    elif ": " in line or line.endswith(":"):
        head = line.split(":", 1)[0]
        body = nasty.replace("\n", "\n" + indent + "  ")
        lines[index] = f"{head}: {body}"
    else:  # a list item
        lines[index] = f"{indent}- {nasty}"
    check("\n".join(lines) + "\n")


@BOUNDED
@given(st.sampled_from(NASTY), st.sampled_from(NASTY))
def test_nasty_values_in_free_form_sections(a: str, b: str) -> None:
    """kv_connector_extra_config and env take any shape: what reaches compose and argv."""
    text = "\n".join(VALID_LINES) + "\n"
    text = text.replace("    n: 4", f"    n: {a}\n    m: {b}".replace("\n", "\n      ", 0))
    check(text)
    text = "\n".join(VALID_LINES).replace("    A: b", f"    A: {a}") + "\n"
    check(text)


def test_the_valid_inventory_is_valid() -> None:
    inv = parse_inventory("\n".join(VALID_LINES) + "\n")
    assert render(build_plan(inv), inv)[0]
