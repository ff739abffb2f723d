"""The bench chart: one self-contained SVG (opens in any browser), no plotting library.

Read at a glance: the verdict is the title (P/D against the same GPUs serving as independent
engines, goodput per GPU), the first panel is that goodput per GPU against concurrency, then
output tokens/s per GPU and TTFT/ITL p50 with their targets dashed. One line for P/D through
the router, one for the engine serving alone (per GPU: what the same GPUs give as independent
engines). Refused runs are left out (a gap, not a zero) and listed under the panels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

from pdboot.bench.goodput import Targets, Verdict
from pdboot.bench.results import Cell

W, H, PAD = 400, 230, 48
TOP = 104  # the verdict and what "per GPU" means
COLORS = {"pd": "#1f77b4", "baseline": "#d62728"}
Metric = Callable[[Cell], float | None]
# (title, metric, the target's attribute on Targets drawn dashed, or "")
PANELS: tuple[tuple[str, Metric, str], ...] = (
    ("goodput per GPU (good requests/s)", lambda c: c.point().goodput_per_gpu, ""),
    ("output tokens/s per GPU", lambda c: c.point().tok_s_per_gpu or None, ""),
    ("TTFT p50 (ms)", lambda c: c.result.ttft_ms.get("p50"), "ttft_ms"),
    ("ITL p50 (ms)", lambda c: c.result.itl_ms.get("p50"), "itl_ms"),
)


def _series(cells: Sequence[Cell], role: str, metric: Metric) -> list[tuple[int, float]]:
    pts = []
    for c in sorted((c for c in cells if c.role == role), key=lambda c: c.concurrency):
        v = None if c.refused else metric(c)
        if v is not None:
            pts.append((c.concurrency, v))
    return pts


def _panel(
    x0: int,
    y0: int,
    title: str,
    cells: Sequence[Cell],
    metric: Metric,
    target: float | None,
    labels: dict[str, str],
) -> list[str]:
    levels = sorted({c.concurrency for c in cells}) or [1]
    series = {role: _series(cells, role, metric) for role in COLORS}
    values = [v for pts in series.values() for _, v in pts] + ([target] if target else [])
    top = max(values or [1.0]) * 1.1 or 1.0

    def px(level: int) -> float:
        i = levels.index(level)
        return x0 + PAD + (i / max(1, len(levels) - 1)) * (W - 2 * PAD)

    def py(v: float) -> float:
        return y0 + H - PAD - v / top * (H - 2 * PAD)

    bottom = y0 + H - PAD
    out = [
        f'<text x="{x0 + W / 2}" y="{y0 + 18}" text-anchor="middle" font-weight="bold">'
        f"{escape(title)}</text>",
        f'<line x1="{x0 + PAD}" y1="{bottom}" x2="{x0 + W - PAD}" y2="{bottom}" stroke="#444"/>',
        f'<line x1="{x0 + PAD}" y1="{y0 + PAD}" x2="{x0 + PAD}" y2="{bottom}" stroke="#444"/>',
        f'<text x="{x0 + PAD - 4}" y="{y0 + PAD + 4}" text-anchor="end">{_num(top)}</text>',
        f'<text x="{x0 + PAD - 4}" y="{bottom}" text-anchor="end">0</text>',
        f'<text x="{x0 + W / 2}" y="{y0 + H - 12}" text-anchor="middle">concurrency</text>',
    ]
    out += [
        f'<text x="{px(lv):.1f}" y="{bottom + 16}" text-anchor="middle">{lv}</text>'
        for lv in levels
    ]
    if target:
        out.append(
            f'<line x1="{x0 + PAD}" y1="{py(target):.1f}" x2="{x0 + W - PAD}" '
            f'y2="{py(target):.1f}" stroke="#888" stroke-dasharray="4 3"/>'
            f'<text x="{x0 + W - PAD}" y="{py(target) - 3:.1f}" text-anchor="end" '
            f'fill="#666">target {target:g}</text>'
        )
    for role, pts in series.items():
        if not pts:
            continue
        path = " ".join(f"{px(c):.1f},{py(v):.1f}" for c, v in pts)
        out.append(
            f'<polyline fill="none" stroke="{COLORS[role]}" stroke-width="2" points="{path}"/>'
        )
        out += [
            f'<circle cx="{px(c):.1f}" cy="{py(v):.1f}" r="3" fill="{COLORS[role]}">'
            f"<title>{escape(labels[role])} c={c}: {v:.3g}</title></circle>"
            for c, v in pts
        ]
    return out


def _num(v: float) -> str:
    """An axis label without exponents: 2480, not 2.48e+03."""
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _gpus(cells: Sequence[Cell], role: str) -> int:
    return next((c.gpus for c in cells if c.role == role), 0)


def verdict_color(v: Verdict | None) -> str:
    """Green when P/D pays off, red when it does not, grey when even or undecided."""
    if v is None or v.pd is None or v.baseline is None:
        return "#555"
    if v.ratio is None:
        return "#2a7d2a" if v.pd.goodput_per_gpu > 0 else "#555"
    return "#2a7d2a" if v.ratio >= 1.05 else "#b22222" if v.ratio <= 0.95 else "#555"


def svg_chart(
    cells: Sequence[Cell],
    title: str,
    verdict: Verdict | None = None,
    targets: Targets | None = None,
) -> str:
    """The whole chart as SVG text: the verdict on top, then four panels in a 2x2 grid."""
    tg = targets or Targets()
    pd_g, base_g = _gpus(cells, "pd"), _gpus(cells, "baseline")
    labels = {
        "pd": f"P/D through the router ({pd_g} GPUs)",
        "baseline": f"independent engines ({base_g} GPU(s) measured, per GPU)",
    }
    width = 2 * W
    body: list[str] = []
    for i, (name, metric, attr) in enumerate(PANELS):
        target = float(getattr(tg, attr)) if attr else None
        body += _panel((i % 2) * W, TOP + (i // 2) * H, name, cells, metric, target, labels)
    legend_y = TOP + 2 * H + 8
    legend = [
        f'<rect x="{10 + i * W}" y="{legend_y}" width="12" height="12" '
        f'fill="{COLORS[role]}"/><text x="{26 + i * W}" y="{legend_y + 11}">'
        f"{escape(labels[role])}</text>"
        for i, role in enumerate(COLORS)
    ]
    refused = [c for c in cells if c.refused]
    notes = [
        f'<text x="10" y="{legend_y + 32 + 14 * i}" fill="#a00">refused: {escape(c.role)} '
        f"c={c.concurrency}: {escape(_clip(c.refused or '', 110))}</text>"
        for i, c in enumerate(refused)
    ]
    height = legend_y + 24 + 14 * len(refused)
    line = verdict.text if verdict else "no verdict"
    head = [
        f'<text x="10" y="24" font-size="15" font-weight="bold" '
        f'fill="{verdict_color(verdict)}">{escape(line)}</text>',
        f'<text x="10" y="42">{escape(verdict.detail if verdict else "")}</text>',
        f'<text x="10" y="62" fill="#555">{escape(title)}; goodput: requests/s that met '
        f"{escape(str(tg))}</text>",
        f'<text x="10" y="78" fill="#555">per GPU: P/D over all {pd_g} engine GPUs (prefill '
        f"+ decode); the engine(s) serving alone over their {base_g}:</text>",
        '<text x="10" y="92" fill="#555">its rate per GPU is what the same GPUs give as '
        "independent engines behind a load balancer</text>",
    ]
    return "\n".join(
        [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'font-family="sans-serif" font-size="11">',
            f"<title>{escape(line)} | {escape(title)}</title>",
            f'<rect width="{width}" height="{height}" fill="white"/>',
            *head,
            *body,
            *legend,
            *notes,
            "</svg>",
            "",
        ]
    )
