"""Small self-contained SVG plots for the HTML report (no JavaScript, no external resources).

Four charts: :func:`pareto` (success vs cost across runs, with both intervals and the Pareto frontier),
:func:`forest` (interval plots: one row per metric, one point per run or comparison, each row on its own
scale), :func:`cdf` (empirical CDFs, log-scaled x axis) and :func:`lines` (learning curves: y per x, a polyline
per series). Every label is XML-escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

__all__ = ["PALETTE", "Interval", "cdf", "forest", "lines", "nice_ticks", "pareto"]

PALETTE: tuple[str, ...] = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
                            "#17becf", "#7f7f7f", "#bcbd22")
_FONT = 'font-family="system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif"'


@dataclass(frozen=True)
class Interval:
    """A point with its interval; nan bounds draw the point alone."""

    label: str
    estimate: float
    low: float
    high: float
    color: str = PALETTE[0]


def _ok(*xs: float) -> bool:
    return all(isinstance(x, int | float) and math.isfinite(x) for x in xs)


def fmt(x: float) -> str:
    """A compact number for axis ticks and labels."""
    if not _ok(x):
        return "n/a"
    if x == 0:
        return "0"
    a = abs(x)
    if a >= 1e4 or a < 1e-3:
        return f"{x:.2e}"
    return f"{x:.4g}"


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering ``[lo, hi]``."""
    if not _ok(lo, hi):
        return []
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    t = first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    return ticks


def _span(values: Sequence[float], pad: float = 0.08, include_zero: bool = False) -> tuple[float, float]:
    vals = [v for v in values if _ok(v)]
    if include_zero:
        vals.append(0.0)
    if not vals:
        return 0.0, 1.0
    lo, hi = min(vals), max(vals)
    if hi == lo:
        d = abs(lo) * 0.1 or 1.0
        return lo - d, hi + d
    d = (hi - lo) * pad
    return lo - d, hi + d


def _svg(width: int, height: int, body: list[str], title: str) -> str:
    # Inline SVG in HTML5 needs no xmlns: the report holds no URL at all.
    return (f'<svg width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" {_FONT} font-size="11">'
            f"<title>{escape(title)}</title>" + "".join(body) + "</svg>")


def _text(x: float, y: float, s: str, anchor: str = "start", extra: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" {extra}>{escape(s)}</text>'


def pareto(points: Sequence[tuple[Interval, Interval]], *, x_label: str, y_label: str,
           title: str = "success vs cost") -> str:
    """Scatter of runs: ``(x interval, y interval)`` per run (lower x and higher y are better), whiskers for
    both intervals, and the Pareto frontier (runs no other run beats on both axes) joined by a dashed line."""
    w, h, ml, mr, mt, mb = 640, 380, 70, 150, 30, 50
    xs = [v for px, _ in points for v in (px.estimate, px.low, px.high)]
    ys = [v for _, py in points for v in (py.estimate, py.low, py.high)]
    x0, x1 = _span(xs)
    y0, y1 = _span(ys)

    def sx(v: float) -> float:
        return ml + (v - x0) / (x1 - x0) * (w - ml - mr)

    def sy(v: float) -> float:
        return h - mb - (v - y0) / (y1 - y0) * (h - mt - mb)

    body = [_text(ml, 18, title, extra='font-weight="bold" font-size="13"')]
    body += _axes(ml, w - mr, mt, h - mb, nice_ticks(x0, x1), nice_ticks(y0, y1), sx, sy)
    body.append(_text((ml + w - mr) / 2, h - 12, x_label, "middle"))
    body.append(_text(14, (mt + h - mb) / 2, y_label, "middle",
                      f'transform="rotate(-90 14 {(mt + h - mb) / 2:.1f})"'))
    finite = [(px, py) for px, py in points if _ok(px.estimate, py.estimate)]
    frontier = [(px, py) for px, py in finite
                if not any((qx.estimate <= px.estimate and qy.estimate >= py.estimate)
                           and (qx.estimate < px.estimate or qy.estimate > py.estimate) for qx, qy in finite)]
    frontier.sort(key=lambda p: p[0].estimate)
    if len(frontier) > 1:
        pts = " ".join(f"{sx(px.estimate):.1f},{sy(py.estimate):.1f}" for px, py in frontier)
        body.append(f'<polyline points="{pts}" fill="none" stroke="#555" stroke-dasharray="4 3"/>')
    for i, (px, py) in enumerate(points):
        if not _ok(px.estimate, py.estimate):
            continue
        cx, cy = sx(px.estimate), sy(py.estimate)
        if _ok(px.low, px.high):
            body.append(f'<line x1="{sx(px.low):.1f}" y1="{cy:.1f}" x2="{sx(px.high):.1f}" y2="{cy:.1f}" '
                        f'stroke="{px.color}" stroke-width="1.5"/>')
        if _ok(py.low, py.high):
            body.append(f'<line x1="{cx:.1f}" y1="{sy(py.low):.1f}" x2="{cx:.1f}" y2="{sy(py.high):.1f}" '
                        f'stroke="{px.color}" stroke-width="1.5"/>')
        on = any(px is f[0] for f in frontier)
        body.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="{px.color if on else "white"}" '
                    f'stroke="{px.color}" stroke-width="2"/>')
        body.append(_text(cx + 8, cy - 6, px.label))
        ly = mt + 14 + 16 * i
        body.append(f'<circle cx="{w - mr + 16}" cy="{ly - 4}" r="4" fill="{px.color}"/>')
        body.append(_text(w - mr + 26, ly, px.label + (" (frontier)" if on else "")))
    return _svg(w, h, body, title)


def _axes(left: float, right: float, top: float, bottom: float, xt: list[float], yt: list[float],
          sx: object, sy: object) -> list[str]:
    fx = sx if callable(sx) else None
    fy = sy if callable(sy) else None
    out = [f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" fill="none" '
           f'stroke="#999"/>']
    if fx is not None:
        for t in xt:
            x = fx(t)
            if left - 0.5 <= x <= right + 0.5:
                out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="#eee"/>')
                out.append(_text(x, bottom + 14, fmt(t), "middle"))
    if fy is not None:
        for t in yt:
            y = fy(t)
            if top - 0.5 <= y <= bottom + 0.5:
                out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#eee"/>')
                out.append(_text(left - 6, y + 4, fmt(t), "end"))
    return out


def forest(rows: Sequence[tuple[str, Sequence[Interval]]], *, title: str, zero_line: bool = False) -> str:
    """Interval plot: one row per ``(metric, intervals)``, each row on its own x scale (metrics have different
    units); the numbers are printed at the right. ``zero_line`` marks 0 (for differences)."""
    labels = [f"{it.label}: {fmt(it.estimate)}" + (f" [{fmt(it.low)}, {fmt(it.high)}]" if _ok(it.low, it.high)
                                                   else "") for _, items in rows for it in items]
    # the numbers at the right get the room they need (~6.5 px a character at font-size 11), so none is clipped
    ml, row_h, pad = 190, 22, 6
    mr = max(230, 16 + int(6.5 * max((len(t) for t in labels), default=0)))
    w = 530 + mr
    n_items = sum(max(1, len(items)) for _, items in rows)
    h = 34 + n_items * row_h + pad * len(rows) + 10
    body = [_text(10, 18, title, extra='font-weight="bold" font-size="13"')]
    y = 34.0
    for metric, items in rows:
        block = max(1, len(items)) * row_h
        vals = [v for it in items for v in (it.estimate, it.low, it.high)]
        lo, hi = _span(vals, include_zero=zero_line)

        def sx(v: float, lo: float = lo, hi: float = hi) -> float:
            return ml + (v - lo) / (hi - lo) * (w - ml - mr)

        body.append(f'<rect x="{ml}" y="{y:.1f}" width="{w - ml - mr}" height="{block}" fill="#fafafa" '
                    f'stroke="#ddd"/>')
        body.append(_text(ml - 8, y + block / 2 + 4, metric, "end", 'font-weight="bold"'))
        if zero_line and lo <= 0 <= hi:
            body.append(f'<line x1="{sx(0):.1f}" y1="{y:.1f}" x2="{sx(0):.1f}" y2="{y + block:.1f}" '
                        f'stroke="#888" stroke-dasharray="3 3"/>')
        for j, it in enumerate(items):
            cy = y + row_h * j + row_h / 2
            if _ok(it.low, it.high):
                body.append(f'<line x1="{sx(it.low):.1f}" y1="{cy:.1f}" x2="{sx(it.high):.1f}" y2="{cy:.1f}" '
                            f'stroke="{it.color}" stroke-width="2"/>')
            if _ok(it.estimate):
                body.append(f'<circle cx="{sx(it.estimate):.1f}" cy="{cy:.1f}" r="4" fill="{it.color}"/>')
            interval = f" [{fmt(it.low)}, {fmt(it.high)}]" if _ok(it.low, it.high) else ""
            body.append(_text(w - mr + 8, cy + 4, f"{it.label}: {fmt(it.estimate)}{interval}",
                              extra=f'fill="{it.color}"'))
        y += block + pad
    return _svg(w, int(h), body, title)


def cdf(series: Sequence[tuple[str, Sequence[Sequence[float]], str]], *, x_label: str, title: str,
        log_x: bool = True) -> str:
    """Empirical CDFs: ``(label, [[x, F(x)], ...], color)`` per series, drawn as steps; log x axis when every
    x is positive and ``log_x``."""
    w, h, ml, mr, mt, mb = 640, 320, 60, 150, 30, 50
    xs = [p[0] for _, pts, _ in series for p in pts if _ok(p[0])]
    use_log = log_x and bool(xs) and min(xs) > 0
    tr = (lambda v: math.log10(v)) if use_log else (lambda v: v)
    x0, x1 = _span([tr(x) for x in xs], pad=0.02)

    def sx(v: float) -> float:
        return ml + (tr(v) - x0) / (x1 - x0) * (w - ml - mr)

    def sy(v: float) -> float:
        return h - mb - v * (h - mt - mb)

    xt = [10.0 ** e for e in range(math.floor(x0), math.ceil(x1) + 1)] if use_log else nice_ticks(x0, x1)
    body = [_text(ml, 18, title, extra='font-weight="bold" font-size="13"')]
    body += _axes(ml, w - mr, mt, h - mb, xt, [0.0, 0.25, 0.5, 0.75, 1.0], sx, sy)
    body.append(_text((ml + w - mr) / 2, h - 12, x_label + (" (log scale)" if use_log else ""), "middle"))
    for i, (label, pts, color) in enumerate(series):
        good = [(float(x), float(p)) for x, p in pts if _ok(x, p)]
        if good:
            seg = [f"{sx(good[0][0]):.1f},{sy(0.0):.1f}"]
            prev_p = 0.0
            for x, p in good:
                seg.append(f"{sx(x):.1f},{sy(prev_p):.1f}")
                seg.append(f"{sx(x):.1f},{sy(p):.1f}")
                prev_p = p
            body.append(f'<polyline points="{" ".join(seg)}" fill="none" stroke="{color}" stroke-width="1.8"/>')
        ly = mt + 14 + 16 * i
        body.append(f'<line x1="{w - mr + 10}" y1="{ly - 4}" x2="{w - mr + 24}" y2="{ly - 4}" stroke="{color}" '
                    f'stroke-width="2"/>')
        body.append(_text(w - mr + 28, ly, label))
    return _svg(w, h, body, title)


def lines(series: Sequence[tuple[str, Sequence[tuple[float, float]], str]], *, x_label: str, y_label: str,
          title: str, y_range: tuple[float, float] | None = None) -> str:
    """Line chart: ``(label, [(x, y), ...], color)`` per series, points marked, the legend at the right
    (learning curves: success per iteration). ``y_range`` fixes the y axis (e.g. (0, 1) for a rate)."""
    w, h, ml, mr, mt, mb = 640, 320, 60, 150, 30, 50
    xs = [x for _, pts, _ in series for x, y in pts if _ok(x, y)]
    ys = [y for _, pts, _ in series for x, y in pts if _ok(x, y)]
    x_lo, x_hi = _span(xs or [0.0, 1.0], pad=0.02)
    y_lo, y_hi = y_range if y_range is not None else _span(ys or [0.0, 1.0])

    def sx(v: float) -> float:
        return ml + (v - x_lo) / (x_hi - x_lo) * (w - ml - mr)

    def sy(v: float) -> float:
        return h - mb - (v - y_lo) / (y_hi - y_lo) * (h - mt - mb)

    body = [_text(10, 18, title, extra='font-weight="bold" font-size="13"')]
    body += _axes(ml, w - mr, mt, h - mb, nice_ticks(x_lo, x_hi), nice_ticks(y_lo, y_hi), sx, sy)
    body.append(_text((ml + w - mr) / 2, h - 12, x_label, "middle"))
    body.append(_text(14, (mt + h - mb) / 2, y_label, "middle", f'transform="rotate(-90 14 {(mt + h - mb) / 2})"'))
    for i, (label, pts, color) in enumerate(series):
        good = [(x, y) for x, y in pts if _ok(x, y)]
        if len(good) > 1:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in good)
            body.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        body += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"/>' for x, y in good]
        ly = mt + 14 + 18 * i
        body.append(f'<line x1="{w - mr + 10}" y1="{ly - 4}" x2="{w - mr + 28}" y2="{ly - 4}" stroke="{color}" '
                    f'stroke-width="2"/>')
        body.append(_text(w - mr + 34, ly, label))
    return _svg(w, h, body, title)
