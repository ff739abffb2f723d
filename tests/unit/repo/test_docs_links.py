"""The front door holds (issue 33): README says what pdboot is before any command and stays
short; every relative link in README, CONTRIBUTING and docs/ resolves inside the repository
(a clone has no ../shared)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit.paths import ROOT

DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_resolves_inside_the_repository(doc: Path) -> None:
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue  # an absolute URL (http:, https:, mailto:)
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        assert dest.exists(), f"{doc.name}: {target}"
        assert ROOT in dest.parents or dest == ROOT, f"{doc.name}: {target} leaves the repository"
        if anchor and dest.suffix == ".md":
            headings = [_anchor(h) for h in re.findall(r"^#+ (.*)$", dest.read_text(), re.M)]
            assert anchor in headings, f"{doc.name}: {target}: no such heading"


def test_no_doc_points_at_the_shared_folder_outside_the_clone() -> None:
    for doc in DOCS:
        assert "../shared" not in doc.read_text(), doc.name


def test_readme_is_a_front_door() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    first_make = text.index("make demo")
    assert "prefill/decode" in text[:first_make] and "vLLM" in text[:first_make]
    assert "make test" in text[first_make : first_make + 400]
