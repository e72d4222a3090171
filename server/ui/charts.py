"""Server-rendered SVG charts for the dashboard: no JavaScript library, no CDN, works offline.

Each chart is a self-contained ``<svg>`` with a viewBox, so it scales with the page; hover text
comes from ``<title>`` elements. Colours are CSS variables set by the page's stylesheet.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

from markupsafe import Markup

_PAD_LEFT, _PAD_RIGHT, _PAD_TOP, _PAD_BOTTOM = 52, 16, 14, 28


@dataclass(frozen=True)
class Line:
    name: str
    points: Sequence[tuple[float, float | None]]  # (epoch seconds, value); None breaks the line
    css_class: str
    area: bool = False
    dashed: bool = False


def nice_ceiling(value: float) -> float:
    """The next "round" number at or above ``value`` (1, 2, 2.5, 5 x 10^n) for an axis top."""
    if value <= 0:
        return 1.0
    exp = math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        candidate = step * 10**exp
        if candidate >= value * 0.999:
            return float(candidate)
    return float(10 ** (exp + 1))


def time_ticks(start: float, end: float, max_ticks: int = 8) -> tuple[list[float], str]:
    span = max(1.0, end - start)
    steps = ((3600, "%H:%M"), (3 * 3600, "%H:%M"), (6 * 3600, "%a %H:%M"), (12 * 3600, "%a %H:%M"),
             (86400, "%a %d"), (2 * 86400, "%b %d"), (7 * 86400, "%b %d"), (30 * 86400, "%b %Y"))
    step, fmt = next((s for s in steps if span / s[0] <= max_ticks), steps[-1])
    first = math.ceil(start / step) * step
    return [float(t) for t in range(int(first), int(end) + 1, step)], fmt


def _fmt_time(ts: float, fmt: str) -> str:
    return time.strftime(fmt, time.gmtime(ts))


def _svg(width: int, height: int, name: str, body: list[str], label: str) -> Markup:
    return Markup(  # noqa: S704 - every interpolated text went through escape()
        f'<svg class="chart" data-chart="{escape(name)}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(label)}" preserveAspectRatio="xMidYMid meet" xmlns="http://www.w3.org/2000/svg">'
        + "".join(body) + "</svg>"
    )


def _empty(width: int, height: int, name: str, message: str) -> Markup:
    return _svg(width, height, name, [
        f'<text class="empty" x="{width / 2}" y="{height / 2}" text-anchor="middle">{escape(message)}</text>'
    ], message)


def line_chart(name: str, lines: Sequence[Line], *, start: float, end: float, y_max: float | None = None,
               y_format: Callable[[float], str] = lambda v: f"{v:g}", width: int = 760, height: int = 240,
               label: str = "") -> Markup:
    values = [v for line in lines for _, v in line.points if v is not None]
    if not values:
        return _empty(width, height, name, "no data in this window")
    top = y_max if y_max is not None else nice_ceiling(max(values))
    plot_w, plot_h = width - _PAD_LEFT - _PAD_RIGHT, height - _PAD_TOP - _PAD_BOTTOM

    def x(ts: float) -> float:
        return _PAD_LEFT + (ts - start) / max(1.0, end - start) * plot_w

    def y(v: float) -> float:
        return _PAD_TOP + plot_h - (min(v, top) / top) * plot_h

    body = _axes(width, height, top, y_format, start, end)
    for line in lines:
        for segment in _segments(line.points):
            coords = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in segment)
            if line.area and len(segment) > 1:
                base = _PAD_TOP + plot_h
                body.append(f'<path class="area {line.css_class}" d="M{x(segment[0][0]):.1f},{base:.1f} '
                            f'L{coords.replace(" ", " L")} L{x(segment[-1][0]):.1f},{base:.1f} Z"/>')
            dash = ' stroke-dasharray="5 4"' if line.dashed else ""
            if len(segment) > 1:
                body.append(f'<path class="line {line.css_class}"{dash} d="M{coords.replace(" ", " L")}"/>')
            else:
                t, single = segment[0]
                body.append(f'<circle class="dot {line.css_class}" cx="{x(t):.1f}" cy="{y(single):.1f}" r="2.5"/>')
        # Invisible hover targets: one per point, with its exact value.
        for t, v in line.points:
            if v is not None:
                body.append(f'<circle class="hover" cx="{x(t):.1f}" cy="{y(v):.1f}" r="6"><title>'
                            f'{escape(line.name)} {_fmt_time(t, "%a %d %b %H:%M")} UTC: {escape(y_format(v))}'
                            "</title></circle>")
    body.append(_legend(lines, width))
    return _svg(width, height, name, body, label or name)


def _segments(points: Sequence[tuple[float, float | None]]) -> list[list[tuple[float, float]]]:
    out: list[list[tuple[float, float]]] = [[]]
    for t, v in points:
        if v is None:
            if out[-1]:
                out.append([])
        else:
            out[-1].append((t, v))
    return [seg for seg in out if seg]


def _axes(width: int, height: int, top: float, y_format: Callable[[float], str], start: float,
          end: float) -> list[str]:
    plot_w, plot_h = width - _PAD_LEFT - _PAD_RIGHT, height - _PAD_TOP - _PAD_BOTTOM
    body = []
    for i in range(5):
        value = top * i / 4
        yy = _PAD_TOP + plot_h - plot_h * i / 4
        body.append(f'<line class="grid" x1="{_PAD_LEFT}" x2="{width - _PAD_RIGHT}" y1="{yy:.1f}" y2="{yy:.1f}"/>')
        body.append(f'<text class="tick" x="{_PAD_LEFT - 6}" y="{yy + 4:.1f}" text-anchor="end">'
                    f"{escape(y_format(value))}</text>")
    ticks, fmt = time_ticks(start, end)
    for t in ticks:
        xx = _PAD_LEFT + (t - start) / max(1.0, end - start) * plot_w
        body.append(f'<line class="grid vertical" x1="{xx:.1f}" x2="{xx:.1f}" y1="{_PAD_TOP}" '
                    f'y2="{_PAD_TOP + plot_h}"/>')
        body.append(f'<text class="tick" x="{xx:.1f}" y="{height - 8}" text-anchor="middle">'
                    f"{escape(_fmt_time(t, fmt))}</text>")
    return body


def _legend(lines: Sequence[Line], width: int) -> str:
    parts, x = [], width - _PAD_RIGHT
    for line in reversed(lines):
        x -= 14 + 7 * len(line.name)
        parts.append(f'<g class="legend"><rect class="swatch {line.css_class}" x="{x}" y="2" width="10" '
                     f'height="10" rx="2"/><text x="{x + 14}" y="11">{escape(line.name)}</text></g>')
    return "".join(parts)


def stacked_bars(name: str, starts: Sequence[float], stacks: Sequence[tuple[str, str, Sequence[float]]], *,
                 start: float, end: float, bucket: float, width: int = 760, height: int = 240,
                 label: str = "") -> Markup:
    """Bars per time bucket; ``stacks`` is (legend name, css class, values per bucket), bottom first."""
    totals = [sum(stack[2][i] for stack in stacks) for i in range(len(starts))]
    if not any(totals):
        return _empty(width, height, name, "no events in this window")
    top = nice_ceiling(max(totals))
    plot_w, plot_h = width - _PAD_LEFT - _PAD_RIGHT, height - _PAD_TOP - _PAD_BOTTOM
    body = _axes(width, height, top, lambda v: f"{v:,.0f}", start, end)
    bar_w = max(1.0, bucket / max(1.0, end - start) * plot_w - 1)
    for i, t in enumerate(starts):
        base = float(_PAD_TOP + plot_h)
        xx = _PAD_LEFT + (t - start) / max(1.0, end - start) * plot_w
        if xx + bar_w > width - _PAD_RIGHT + 0.5 or xx < _PAD_LEFT - 0.5:
            continue
        for legend, css_class, values in stacks:
            h = values[i] / top * plot_h
            if h <= 0:
                continue
            base -= h
            body.append(f'<rect class="bar {css_class}" x="{xx:.1f}" y="{base:.1f}" width="{bar_w:.1f}" '
                        f'height="{h:.1f}"><title>{escape(legend)} {_fmt_time(t, "%a %d %b %H:%M")} UTC: '
                        f"{values[i]:,.0f}</title></rect>")
    body.append(_legend([Line(n, [], c) for n, c, _ in stacks], width))
    return _svg(width, height, name, body, label or name)


def hbars(name: str, rows: Sequence[tuple[str, float, str, str]], *, width: int = 460, label_width: int = 170,
          row_height: int = 28, label: str = "", empty: str = "nothing yet",
          short: Callable[[str], str] = lambda text: text) -> Markup:
    """Horizontal bars: (label, value, text shown at the bar's end, css class); ``short`` makes the
    visible label (the full one is the hover text)."""
    if not rows or not any(value for _, value, _, _ in rows):
        return _empty(width, 80, name, empty)
    top = max(value for _, value, _, _ in rows)
    label_w, text_w = label_width, 80
    plot_w = width - label_w - text_w
    height = row_height * len(rows) + 6
    body = []
    for i, (text, value, shown, css_class) in enumerate(rows):
        y = 3 + i * row_height
        w = max(1.5, value / top * plot_w) if value else 0
        body.append(f'<text class="label" x="{label_w - 8}" y="{y + row_height * 0.62:.1f}" text-anchor="end">'
                    f"<title>{escape(text)}</title>{escape(short(text))}</text>")
        body.append(f'<rect class="bar {css_class}" x="{label_w}" y="{y + 4}" width="{w:.1f}" '
                    f'height="{row_height - 8}" rx="3"><title>{escape(text)}: {escape(shown)}</title></rect>')
        body.append(f'<text class="value" x="{label_w + w + 6:.1f}" y="{y + row_height * 0.62:.1f}">'
                    f"{escape(shown)}</text>")
    return _svg(width, height, name, body, label or name)
