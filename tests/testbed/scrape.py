"""What the e2e and testbed tests read of an engine's Prometheus text: one metric's samples
summed, over all label sets or per ``engine`` label (a data-parallel engine's ranks)."""

from __future__ import annotations

import re
import urllib.request


def metric(url: str, name: str) -> float:
    """The sum of ``name``'s samples at ``url`` (a /metrics endpoint), labelled or not."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return sum(
        float(ln.rsplit(" ", 1)[1])
        for ln in text.splitlines()
        if ln.startswith(name + "{") or ln.startswith(name + " ")
    )


def per_engine(text: str, name: str) -> dict[str, float]:
    """The sum of ``name``'s samples in exposition ``text`` per ``engine`` label."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            eng = re.search(r'engine="(\d+)"', line)
            assert eng, line
            out[eng.group(1)] = out.get(eng.group(1), 0.0) + float(line.rsplit(" ", 1)[1])
    return out
