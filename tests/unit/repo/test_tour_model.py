"""The README's tour works without a Hugging Face token: its example serves a model no
organisation gates, and every example that serves a gated model names secrets.hf_token."""

from __future__ import annotations

import re

import yaml

from tests.unit.paths import ROOT

# organisations whose models on the Hub ask for a licence click (a token then): Meta's Llama,
# Google's Gemma, Mistral's newer models
GATED = ("meta-llama/", "google/gemma", "mistralai/")


def _tour_example() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"^\$ pdboot render (examples/\S+\.yaml) --out", readme, re.M)
    assert m, "the README's tour renders an example with --out"
    return m.group(1)


def test_the_tour_serves_a_model_that_is_not_gated() -> None:
    doc = yaml.safe_load((ROOT / _tour_example()).read_text())
    assert not str(doc["model"]).startswith(GATED), doc["model"]


def test_an_example_with_a_gated_model_names_a_token() -> None:
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if str(doc["model"]).startswith(GATED):
            assert (doc.get("secrets") or {}).get("hf_token"), path.name
