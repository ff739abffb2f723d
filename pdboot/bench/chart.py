"""The bench chart: one self-contained SVG (opens in any browser), no plotting library.

Three panels against concurrency: TTFT p50, ITL p50, output tokens/s; one line for P/D through
the router, one for the engine serving alone. Refused runs are left out (a gap, not a zero).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

from pdboot.bench.results import Cell, RunResult

W, H, PAD = 300, 220, 44
COLORS = {"pd": "#1f77b4", "baseline": "#d62728"}
LABELS = {"pd": "P/D (router)", "baseline": "one engine alone"}
PANELS: tuple[tuple[str, Callable[[RunResult], float | None]], ...] = (
    ("TTFT p50 (ms)", lambda r: r.ttft_ms.get("p50")),
    ("ITL p50 (ms)", lambda r: r.itl_ms.get("p50")),
    ("output tokens/s", lambda r: r.output_tok_s or None),
)


def _series(
    cells: Sequence[Cell], role: str, metric: Callable[[RunResult], float | None]
) -> list[tuple[int, float]]:
    pts = []
    for c in sorted((c for c in cells if c.role == role), key=lambda c: c.concurrency):
        v = None if c.refused else metric(c.result)
        if v is not None:
            pts.append((c.concurrency, v))
    return pts


def _panel(
    x0: int, title: str, cells: Sequence[Cell], metric: Callable[[RunResult], float | None]
) -> list[str]:
    levels = sorted({c.concurrency for c in cells}) or [1]
    series = {role: _series(cells, role, metric) for role in COLORS}
    top = max([v for pts in series.values() for _, v in pts] or [1.0]) * 1.1 or 1.0

    def px(level: int) -> float:
        i = levels.index(level)
        return x0 + PAD + (i / max(1, len(levels) - 1)) * (W - 2 * PAD)

    def py(v: float) -> float:
        return H - PAD - v / top * (H - 2 * PAD)

    out = [
        f'<text x="{x0 + W / 2}" y="18" text-anchor="middle" font-weight="bold">'
        f"{escape(title)}</text>",
        f'<line x1="{x0 + PAD}" y1="{H - PAD}" x2="{x0 + W - PAD}" y2="{H - PAD}" stroke="#444"/>',
        f'<line x1="{x0 + PAD}" y1="{PAD}" x2="{x0 + PAD}" y2="{H - PAD}" stroke="#444"/>',
        f'<text x="{x0 + PAD - 4}" y="{PAD + 4}" text-anchor="end">{top:.3g}</text>',
        f'<text x="{x0 + PAD - 4}" y="{H - PAD}" text-anchor="end">0</text>',
        f'<text x="{x0 + W / 2}" y="{H - 8}" text-anchor="middle">concurrency</text>',
    ]
    out += [
        f'<text x="{px(lv):.1f}" y="{H - PAD + 16}" text-anchor="middle">{lv}</text>'
        for lv in levels
    ]
    for role, pts in series.items():
        if not pts:
            continue
        path = " ".join(f"{px(c):.1f},{py(v):.1f}" for c, v in pts)
        out.append(
            f'<polyline fill="none" stroke="{COLORS[role]}" stroke-width="2" points="{path}"/>'
        )
        out += [
            f'<circle cx="{px(c):.1f}" cy="{py(v):.1f}" r="3" fill="{COLORS[role]}">'
            f"<title>{escape(LABELS[role])} c={c}: {v:.3g}</title></circle>"
            for c, v in pts
        ]
    return out


def svg_chart(cells: Sequence[Cell], title: str) -> str:
    """The whole chart as SVG text."""
    width = W * len(PANELS)
    body: list[str] = []
    for i, (name, metric) in enumerate(PANELS):
        body += _panel(i * W, name, cells, metric)
    legend = [
        f'<rect x="{10 + i * 170}" y="{H + 8}" width="12" height="12" '
        f'fill="{COLORS[role]}"/><text x="{26 + i * 170}" y="{H + 19}">'
        f"{escape(LABELS[role])}</text>"
        for i, role in enumerate(COLORS)
    ]
    refused = [c for c in cells if c.refused]
    notes = [
        f'<text x="10" y="{H + 40 + 14 * i}" fill="#a00">refused: {escape(c.role)} '
        f"c={c.concurrency}: {escape(c.refused or '')}</text>"
        for i, c in enumerate(refused)
    ]
    height = H + 40 + 14 * len(refused)
    return "\n".join(
        [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'font-family="sans-serif" font-size="11">',
            f"<title>{escape(title)}</title>",
            f'<rect width="{width}" height="{height}" fill="white"/>',
            *body,
            *legend,
            *notes,
            "</svg>",
            "",
        ]
    )
