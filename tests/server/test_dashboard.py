"""The dashboard, filled with a realistic week of events, rendered by headless Chromium.

Checks what a person would look at: the charts have data in them (SVG paths with as many points
as hours, bars for hits and misses, one bar per toolchain), the numbers match the stats API, and
filters narrow the page. The screenshot lands in tmp (and in docs/images with
NEFFCACHE_UPDATE_DOCS_IMAGES=1).
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import ADMIN_SECRET, LiveServer
from tests.server.week import make_week
from tests.services import chromium_executable, service_missing

DOCS_IMAGE = Path(__file__).resolve().parents[2] / "docs" / "images" / "dashboard.png"
# Read at import: the suite's autouse fixture clears NEFFCACHE_* variables before each test.
UPDATE_DOCS_IMAGE = os.environ.get("NEFFCACHE_UPDATE_DOCS_IMAGES") == "1"
pytestmark = [pytest.mark.chromium, pytest.mark.slow]


def _chromium(url: str, tmp_path: Path, *mode: str, size: str = "1400,1520") -> subprocess.CompletedProcess[str]:
    exe = chromium_executable()
    if exe is None:
        service_missing("Chromium", "no chromium on PATH (apt-get install chromium)")
    profile = tmp_path / f"profile-{time.monotonic_ns()}"
    profile.mkdir()
    command = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--hide-scrollbars", f"--user-data-dir={profile}", f"--window-size={size}", *mode, url]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)  # type: ignore[arg-type]


def _svg(dom: str, name: str) -> str:
    match = re.search(rf'<svg class="chart" data-chart="{name}".*?</svg>', dom, re.S)
    assert match, f"chart {name} missing"
    return match.group(0)


def _png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    return int(width), int(height)


# What an hour of each instance type of the week costs the operator (figures of the test, not AWS's).
PRICES = {"trn2.48xlarge": 44.70, "trn1.32xlarge": 21.50}


@pytest.fixture
def week_server(sqlite_url: str, start_server: Callable[..., LiveServer]) -> LiveServer:
    live = start_server(sqlite_url, anonymous_read=True, prices=PRICES, currency="USD")
    week = make_week(time.time())
    with live.client(ADMIN_SECRET) as admin:
        admin.post("/v1/entries", json=week.entries).raise_for_status()
        for start in range(0, len(week.events), 2500):
            admin.post("/v1/events", json=week.events[start:start + 2500]).raise_for_status()
        for i, owner in enumerate(("ip-10-0-12-7:4114:ab12cd34", "warm-3:977:0c1d2e3f")):
            admin.post("/v1/leases/acquire", json={"name": week.entries[-1 - i]["path"], "owner": owner,
                                                   "ttl": 900 - 300 * i}).raise_for_status()
    return live


def test_dashboard_renders_a_week_in_chromium(week_server: LiveServer, tmp_path: Path) -> None:
    stats = httpx.get(f"{week_server.url}/v1/stats", params={"window": "7d"}).json()
    dom = _chromium(f"{week_server.url}/", tmp_path, "--dump-dom").stdout

    hit_rate = _svg(dom, "hit-rate")
    line = re.search(r'<path class="line hit" d="([^"]+)"', hit_rate)
    assert line and line.group(1).count("L") > 120  # ~168 hourly points over a week
    assert len(re.findall(r'<rect class="bar hit"', _svg(dom, "lookups"))) > 120
    assert len(re.findall(r'<rect class="bar miss"', _svg(dom, "lookups"))) > 100
    saved = _svg(dom, "saved")
    assert 'class="line saved"' in saved and 'class="line spent"' in saved
    assert len(re.findall(r'<rect class="bar size"', _svg(dom, "size-by-toolchain"))) == 3
    assert 'class="bar bad"' in _svg(dom, "entries-by-state")
    assert "no data" not in dom and "no events" not in dom

    assert f"{stats['totals']['hit_rate'] * 100:.1f}%" in dom
    # The money tiles: the stats API's figures at the operator's prices, currency in the label.
    for tile, figure in (("kpi-saved-money", "saved_cost"), ("kpi-spent-money", "compile_cost")):
        match = re.search(rf'id="{tile}"><div class="v">([^<]+)</div><div class="k">([^<]+)</div>', dom)
        assert match, tile
        assert match.group(1) == f"{stats['totals'][figure]:,.0f}" and match.group(2).endswith("· USD")
        assert stats["totals"][figure] > 1000
    # Upgrade readiness: the week's compiler bump on trn2, as /v1/upgrades/readiness counts it.
    (pair,) = httpx.get(f"{week_server.url}/v1/upgrades/readiness", params={"window": "7d"}).json()["pairs"]
    upgrades = re.findall(r'<table class="upgrades">.*?</table>', dom, re.S)[0]
    assert upgrades.count("<tr>") == 2 and "2.26.8123.0 → 2.27.5334.0" in upgrades
    assert f'{pair["readiness"] * 100:.1f}%' in upgrades and 0.9 < pair["readiness"] < 1.0
    assert pair["missing"][0]["path"].rsplit("/", 1)[-1] in upgrades
    misses = re.findall(r'<table class="misses">.*?</table>', dom, re.S)[0]
    assert misses.count("<tr>") == 1 + min(8, len(stats["top_misses"]))
    for team in ("search", "ads", "speech", "research"):
        assert f'title="{team}"' in dom
    assert 'src="/static/dashboard.js"' in dom and "http://" not in dom.split("<footer")[0].replace(
        'xmlns="http://www.w3.org/2000/svg"', "")  # nothing loaded from elsewhere

    shot = tmp_path / "dashboard.png"
    _chromium(f"{week_server.url}/", tmp_path, f"--screenshot={shot}")
    assert _png_size(shot) == (1400, 1520)
    assert shot.stat().st_size > 100_000  # a blank page compresses to a few kB
    if UPDATE_DOCS_IMAGE:
        DOCS_IMAGE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, DOCS_IMAGE)


def test_dashboard_filters_narrow_the_page(week_server: LiveServer, tmp_path: Path) -> None:
    dom = _chromium(f"{week_server.url}/?team=speech&window=24h&group_by=model", tmp_path, "--dump-dom").stdout
    stats = httpx.get(f"{week_server.url}/v1/stats",
                      params={"window": "24h", "team": "speech", "group_by": "model"}).json()
    assert "team <b>speech</b>" in dom
    assert '<option selected="">speech</option>' in dom or "<option selected>speech</option>" in dom
    groups = re.findall(r'<td class="name" title="([^"]+)"', dom)
    assert groups == ["whisper-large-v3"] == [g["name"] for g in stats["groups"]]
    points = len(re.findall(r'<circle class="hover"', _svg(dom, "hit-rate")))
    assert 10 < points <= 25  # hourly points of one day (quiet hours have none)


def test_without_prices_the_dashboard_stays_in_hours(sqlite_url: str,
                                                     start_server: Callable[..., LiveServer]) -> None:
    live = start_server(sqlite_url, anonymous_read=True)
    week = make_week(time.time(), scale=0.05)
    with live.client(ADMIN_SECRET) as admin:
        admin.post("/v1/entries", json=week.entries).raise_for_status()
        admin.post("/v1/events", json=week.events[:2500]).raise_for_status()
    page = httpx.get(f"{live.url}/").text
    stats = httpx.get(f"{live.url}/v1/stats").json()
    assert stats["currency"] is None and stats["totals"]["compile_cost"] is None
    assert "kpi-saved-money" not in page and "kpi-spent-money" not in page and 'class="kpis"' in page
    assert "compile time saved" in page
    # The job hit rate, and the warm-ups' compiles apart from it (the week has nightly warm-ups).
    assert f'id="kpi-hit-rate"><div class="v">{stats["hit_rate"] * 100:.1f}%</div>' in page
    assert stats["warm_ups"]["compiles"] > 0
    assert f'id="kpi-ahead"><div class="v">{stats["warm_ups"]["compiles"]:,}</div>' in page


def test_dashboard_shows_the_eviction_regret(sqlite_url: str, start_server: Callable[..., LiveServer],
                                             tmp_path: Path) -> None:
    from neffcache.index.records import eviction_message
    from tests.server.factories import entry, event

    live = start_server(sqlite_url, anonymous_read=True)
    with live.client(ADMIN_SECRET) as admin:
        quiet = _chromium(f"{live.url}/", tmp_path, "--dump-dom").stdout
        now = time.time()
        evicted = [entry(i)["path"] for i in range(3)]
        admin.post("/v1/events", json=[
            *(event("evict", path=p, ts=now - 600, compile_seconds=5400.0,
                    message=eviction_message("size", "value", "over the budget")) for p in evicted),
            event("miss", path=evicted[0], ts=now - 60)]).raise_for_status()
    dom = _chromium(f"{live.url}/", tmp_path, "--dump-dom").stdout
    assert "eviction regret: no budget eviction in this window" in quiet
    line = re.search(r'<p class="more" id="regret">(.*?)</p>', dom, re.S)
    assert line and re.sub(r"<[^>]+>", "", line.group(1)).startswith(
        "eviction regret: policy value 1 of 3 budget evictions missed again (1.5 h to recompile)")
