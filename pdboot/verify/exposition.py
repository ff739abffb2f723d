"""Prometheus text exposition (what ``/metrics`` serves) -> samples, and histograms with the
quantile Prometheus' ``histogram_quantile`` computes. pdboot's one exposition parser.

Lenient on purpose: a scrape is evidence, not a contract, so comment and junk lines are
skipped rather than failing the whole read. ``tests/unit/verify/test_exposition.py`` holds it to
prometheus_client's own parser on real vLLM 0.33.0 output.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_exposition(text: str) -> list[Sample]:
    """Every sample line of a Prometheus text exposition; comments and junk lines skipped."""
    out: list[Sample] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = {
            k: v.replace('\\"', '"').replace("\\\\", "\\")
            for k, v in _LABEL.findall(m.group(2) or "")
        }
        out.append(Sample(m.group(1), labels, value))
    return out


@dataclass(frozen=True)
class Histogram:
    """Cumulative buckets as exported: (upper bound, count <= bound), +Inf last."""

    buckets: tuple[tuple[float, float], ...] = ()
    count: float = 0.0
    total: float = 0.0

    def __sub__(self, other: Histogram) -> Histogram:
        theirs = dict(other.buckets)
        return Histogram(
            tuple((le, c - theirs.get(le, 0.0)) for le, c in self.buckets),
            self.count - other.count,
            self.total - other.total,
        )

    def quantile(self, q: float) -> float | None:
        """Prometheus ``histogram_quantile``: linear inside the bucket holding rank q*count;
        the lowest bucket starts at 0; a rank in +Inf answers the highest finite bound."""
        if not self.buckets or self.buckets[-1][1] <= 0 or math.isinf(self.buckets[0][0]):
            return None  # nothing observed, or only a +Inf bucket: no bound to report
        rank = q * self.buckets[-1][1]
        lower, below = 0.0, 0.0
        for le, cum in self.buckets:
            if cum >= rank:
                if math.isinf(le):
                    return lower
                if cum == below:
                    return le
                return lower + (le - lower) * (rank - below) / (cum - below)
            lower, below = le, cum
        return lower


def histogram(samples: Iterable[Sample], base: str) -> Histogram:
    buckets: dict[float, float] = {}
    count = total = 0.0
    for s in samples:
        if s.name == f"{base}_bucket" and "le" in s.labels:
            le = float(s.labels["le"])
            buckets[le] = buckets.get(le, 0.0) + s.value
        elif s.name == f"{base}_count":
            count += s.value
        elif s.name == f"{base}_sum":
            total += s.value
    return Histogram(tuple(sorted(buckets.items())), count, total)


def histogram_sum(a: Histogram, b: Histogram) -> Histogram:
    sums: dict[float, float] = dict(a.buckets)
    for le, c in b.buckets:
        sums[le] = sums.get(le, 0.0) + c
    return Histogram(tuple(sorted(sums.items())), a.count + b.count, a.total + b.total)
