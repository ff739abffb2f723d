"""pdboot's Prometheus text parser (verify/exposition.py) read against prometheus_client's
own parser -- the reference implementation of the format, a test dependency only -- on real
/metrics captures: vLLM 0.33.0's names and labels, and the testbed's stand-in engine."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdboot.verify.exposition import parse_exposition
from tests.unit.paths import FIXTURES

FIX = FIXTURES
CAPTURES = sorted([*(FIX / "vllm").glob("*.txt"), *(FIX / "deploy").glob("*metrics*.txt")])


def _key(
    name: str, labels: dict[str, str], value: float
) -> tuple[str, tuple[tuple[str, str], ...], str]:
    return name, tuple(sorted(labels.items())), "nan" if math.isnan(value) else repr(value)


def test_the_captures_are_there() -> None:
    assert len(CAPTURES) >= 5


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_sample_as_the_reference_parser_reads_it(capture: Path) -> None:
    text = capture.read_text()
    reference = sorted(
        _key(s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    )
    ours = sorted(_key(s.name, s.labels, s.value) for s in parse_exposition(text))
    assert reference and ours == reference


def test_junk_lines_are_skipped_where_the_reference_parser_refuses_the_text() -> None:
    good = (FIX / "vllm" / "decode-metrics-before.txt").read_text()
    text = good + "this is not a sample line\n"
    with pytest.raises(ValueError):
        list(text_string_to_metric_families(text))
    assert [s.name for s in parse_exposition(text)] == [s.name for s in parse_exposition(good)]
