"""The dashboard at ``/``: one server-rendered page a platform team can leave open on a screen.

Charts are inline SVG (``neffcache.server.ui.charts``); a small first-party script refreshes the
page body in place and the page falls back to a meta refresh without JavaScript. A token can be
handed over once as ``/?token=...``: it is moved into a SameSite=Strict, HttpOnly cookie and the
URL is cleaned, so the secret does not stay in the address bar or in shared links.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from neffcache import __version__
from neffcache.readiness import UNUSED_WEIGHT
from neffcache.server.api.deps import TOKEN_COOKIE, BearerDep, StateDep, check_access, presented_token
from neffcache.server.api.routes.common import QText
from neffcache.server.api.routes.stats import build_query
from neffcache.server.services import leases as lease_table
from neffcache.server.services.prices import prices_of
from neffcache.server.services.readiness import pair_readiness, upgrade_pairs
from neffcache.server.services.stats import GroupBy, StatsOut, compute_stats
from neffcache.server.ui.charts import Line, hbars, line_chart, stacked_bars
from neffcache.units import human_bytes as decimal_bytes
from neffcache.units import plural

router = APIRouter(include_in_schema=False)
TEMPLATES_DIR = Path(__file__).with_name("templates")
STATIC_DIR = Path(__file__).with_name("static")
WINDOWS = (("24h", "24 hours"), ("7d", "7 days"), ("30d", "30 days"))
_STATE_CLASS = {"SUCCESS": "ok", "FAILED": "bad", "LOCKED": "warn", "EMPTY": "muted", "CORRUPT": "alert"}


def human_bytes(n: float) -> str:
    """Sizes in the CLI's units (neffcache.units: decimal kB/MB/GB), with thousands separators."""
    return decimal_bytes(n, grouped=True)


def hours(h: float) -> str:
    return f"{h:,.0f} h" if h >= 100 else f"{h:,.1f} h"


def money(amount: float | None) -> str:
    """An amount at the operator's prices (the tile names the currency): whole units from 1,000
    on (``12,346``), cents below (``812.40``); "-" without prices."""
    if amount is None:
        return "-"
    return f"{amount:,.0f}" if abs(amount) >= 1000 else f"{amount:,.2f}"


def pct(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:.1f}%"


def ago(ts: float, now: float) -> str:
    delta = max(0.0, now - ts)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if delta >= size:
            return f"{delta / size:.0f} {unit} ago"
    return "just now"


def short_toolchain(label: str) -> str:
    """"trn2-lnc2/neuronxcc-2.27.5334.0+f702b353" -> "trn2 lnc2 · 2.27.5334.0" (hash in the hover text)."""
    target, _, compiler = label.partition("/neuronxcc-")
    if not compiler:
        return label
    return f"{target.replace('-', ' ')} · {compiler.split('+', 1)[0]}"


def charts(stats: StatsOut) -> dict[str, Any]:
    start, end, bucket = stats.window.start, stats.window.end, stats.window.bucket_seconds
    points = stats.series
    saved_total, spent_total, ahead_total = 0.0, 0.0, 0.0
    saved, spent, ahead = [], [], []
    for p in points:
        saved_total += p.saved_hours
        spent_total += p.compile_hours
        ahead_total += p.ahead_hours
        saved.append((p.start, saved_total))
        spent.append((p.start, spent_total))
        ahead.append((p.start, ahead_total))
    sizes = stats.size_by_toolchain[:8]
    return {
        "hit_rate": line_chart(
            "hit-rate", [Line("job hit rate", [(p.start, None if p.hit_rate is None else p.hit_rate * 100)
                                               for p in points], "hit", area=True)],
            start=start, end=end, y_max=100, y_format=lambda v: f"{v:.0f}%", label="job hit rate over time"),
        "lookups": stacked_bars(
            "lookups", [p.start for p in points],
            [("hits", "hit", [float(p.hits) for p in points]), ("misses", "miss", [float(p.misses) for p in points])],
            start=start, end=end, bucket=bucket, label="hits and misses per bucket"),
        "saved": line_chart(
            "saved", [Line("compile hours saved", saved, "saved", area=True),
                      Line("compile hours spent by jobs", spent, "spent", dashed=True),
                      Line("compiled ahead by warm-ups", ahead, "ahead", dashed=True)],
            start=start, end=end, y_format=lambda v: f"{v:,.0f} h", label="cumulative compile hours"),
        "sizes": hbars("size-by-toolchain", [(s.toolchain, float(s.bytes), f"{human_bytes(s.bytes)}", "size")
                                             for s in sizes], label="cache size by toolchain",
                       empty="no entries registered", short=short_toolchain, label_width=180, width=620, row_height=26),
        "states": hbars("entries-by-state", [(state, float(n), f"{n:,}", _STATE_CLASS.get(state, "muted"))
                                             for state, n in stats.entries_by_state.items()],
                        label="entries by state", empty="no entries registered", label_width=180, width=620,
                        row_height=26),
    }


def _login_page(request: Request, state: StateDep, error: HTTPException) -> HTMLResponse:
    page = state.templates.get_template("login.html").render(detail=error.detail, version=__version__)
    return HTMLResponse(page, status_code=error.status_code, headers=error.headers)


@router.get("/", name="dashboard", response_model=None)
def dashboard(
    request: Request,
    state: StateDep,
    credentials: BearerDep,
    window: Annotated[str, Query(pattern=r"^(24h|7d|30d)$")] = "7d",
    team: QText = None,
    model: QText = None,
    group_by: GroupBy = "team",
    # Printable ASCII: what every token is, and what a cookie header can carry (a character
    # beyond Latin-1 could not be encoded into one: that was a 500).
    token: Annotated[str | None, Query(max_length=256, pattern=r"^[\x21-\x7e]+$")] = None,
) -> Response:
    if token:
        params = {k: v for k, v in request.query_params.items() if k != "token"}
        response = RedirectResponse("/" + (f"?{urlencode(params)}" if params else ""), status_code=303)
        response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict",
                            secure=request.url.scheme == "https", max_age=30 * 86400)
        return response
    try:
        check_access(state, presented_token(request, credentials, "read"), "read",
                     request.client.host if request.client else None)
    except HTTPException as exc:
        return _login_page(request, state, exc)
    query = build_query(window, None, group_by, team, model, None, None, top=12)
    with state.db.read() as session:
        stats = compute_stats(session, query, prices_of(state.settings))
        held = lease_table.active(session, limit=4)
        upgrades = [pair_readiness(session, old, new, query.start, query.end, top=3)
                    for old, new in upgrade_pairs(session)]
    now = time.time()
    page = state.templates.get_template("dashboard.html").render(
        stats=stats, charts=charts(stats), windows=WINDOWS, window=window, window_label=dict(WINDOWS)[window],
        team=team or "", model=model or "", group_by=group_by, refresh=state.settings.dashboard_refresh_seconds,
        now=now, updated=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now)), version=__version__,
        human_bytes=human_bytes, hours=hours, pct=pct, ago=lambda ts: ago(ts, now),
        money=money, plural=plural, upgrades=upgrades, unused_weight=UNUSED_WEIGHT,
        state_class=_STATE_CLASS, leases=held, database=state.db.dialect, tc=short_toolchain,
        total_bytes=sum(s.bytes for s in stats.size_by_toolchain),
        total_entries=sum(stats.entries_by_state.values()),
        problems=sum(n for s, n in stats.entries_by_state.items() if s in ("FAILED", "LOCKED", "CORRUPT")),
    )
    return HTMLResponse(page, headers={"Cache-Control": "no-store"})

