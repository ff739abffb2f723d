"""Port rules per host cover every listener pdboot starts (issue 32, item 4): the watch
service and the weights seed beside the engines, their side channels, the router and its
metrics; refused at load with file:line like the other rules."""

from __future__ import annotations

import re

import pytest

from pdboot.inventory.load import InventoryError, parse_inventory
from tests.unit.builders import TWO_HOSTS_TEXT

BASE = TWO_HOSTS_TEXT


def refusal(extra: str) -> str:
    with pytest.raises(InventoryError) as exc:
        parse_inventory(BASE + extra, file="inv.yaml")
    return str(exc.value)


@pytest.mark.parametrize(
    ("extra", "line", "key", "words"),
    [
        ("watch: {image: reg/w:1, port: 8000}\n", 9, "watch.port",
         "port 8000 on host 'gpu-a' is already used by the proxy (public endpoint)"),
        ("watch: {image: reg/w:1, port: 29000}\n", 9, "watch.port", "router metrics"),
        ("watch: {image: reg/w:1, port: 8200}\n", 9, "watch.port", "prefill HTTP"),
        ("watch: {image: reg/w:1, port: 5600}\n", 9, "watch.port",
         "prefill NIXL side channel"),
        ("weights: {seed: first_host, seed_port: 8200}\n", 9, "weights.seed_port",
         "port 8200 on host 'gpu-a' is already used by prefill HTTP"),
        ("weights: {seed: first_host, seed_port: 29000}\n", 9, "weights.seed_port",
         "router metrics"),
        ("watch: {image: reg/w:1, port: 8765}\nweights: {seed: first_host}\n", 10,
         "weights.seed_port", "already used by the watch service"),
    ],
)  # fmt: skip
def test_a_listener_on_a_taken_port_is_refused_at_its_line(
    extra: str, line: int, key: str, words: str
) -> None:
    text = refusal(extra)
    assert re.search(rf"^inv\.yaml:{line}: {re.escape(key)}: .*{re.escape(words)}", text, re.M), (
        text
    )


def test_listeners_on_other_hosts_or_not_started_are_fine() -> None:
    # the seed serves on the first engine host (gpu-a): gpu-b's decode port is free there
    parse_inventory(BASE + "weights: {seed: first_host, seed_port: 8201}\n")
    # no watch service (no image): `pdboot watch` listens on the operator's machine
    parse_inventory(BASE + "watch: {port: 8000}\n")
    # no seed without staging, nor with one engine host
    parse_inventory(BASE + "weights: {stage: false, seed: first_host, seed_port: 8200}\n")
    one = BASE.replace("decode: {hosts: [gpu-b]}", "decode: {hosts: [gpu-a], gpus: [1]}")
    one = one.replace("prefill: {hosts: [gpu-a]}", "prefill: {hosts: [gpu-a], gpus: [0]}")
    parse_inventory(one + "weights: {seed: first_host, seed_port: 8200}\n")


def test_watch_image_follows_the_reference_grammar() -> None:
    """Found by the fuzzer's watch: section (scripts/fuzz_sections.py, seed 4242): an
    upper-case repository passed the safe-token check, and Docker refuses it at the pull."""
    text = refusal("watch: {image: Bad/Img:1}\n")
    assert re.search(r"^inv\.yaml:9: watch\.image: .*Docker refuses upper case", text, re.M), text
    parse_inventory(BASE + "watch: {image: 'reg.example:5000/pdboot/watch:1'}\n")
