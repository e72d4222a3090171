"""Compile time in money at the operator's prices (`serve --price`): `neffcache stats` per team,
model, toolchain and instance type (text and --json), /metrics, and no money without prices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import ADMIN_SECRET, LiveServer, free_port
from tests.server.factories import COMPILER, TOOLCHAIN, TOOLCHAIN_LABEL, entry, event

PRICES = {"trn2.48xlarge": 40.0, "trn1.32xlarge": 20.0}
TRN1 = {"compiler_version": COMPILER, "target": "trn1", "lnc": 1}
TRN1_LABEL = f"trn1-lnc1/neuronxcc-{COMPILER}"

# (team, model, toolchain, instance type, kind, seconds): priced trn2 and trn1 events, a compile
# that reported no instance type and a hit on an instance type without a price.
EVENTS = [
    ("search", "llama3-8b", TOOLCHAIN, "trn2.48xlarge", "compile", 1800.0),
    ("search", "llama3-8b", TOOLCHAIN, "trn2.48xlarge", "hit", 3600.0),
    ("search", "llama3-8b", TOOLCHAIN, "trn2.48xlarge", "hit", 3600.0),
    ("ads", "bert-large", TRN1, "trn1.32xlarge", "compile", 3600.0),
    ("ads", "bert-large", TRN1, "trn1.32xlarge", "hit", 900.0),
    ("ads", "bert-large", TRN1, "", "compile", 7200.0),
    ("speech", "whisper", TRN1, "inf2.xlarge", "hit", 1800.0),
]
# By hand, hours x price per hour: (spent, saved, unpriced spent hours, unpriced saved hours).
BY_TEAM = {"search": (0.5 * 40, 2 * 40, 0.0, 0.0), "ads": (1 * 20, 0.25 * 20, 2.0, 0.0),
           "speech": (0.0, 0.0, 0.0, 0.5)}
BY_MODEL = {"llama3-8b": BY_TEAM["search"], "bert-large": BY_TEAM["ads"], "whisper": BY_TEAM["speech"]}
BY_TOOLCHAIN = {TOOLCHAIN_LABEL: BY_TEAM["search"], TRN1_LABEL: (20.0, 5.0, 2.0, 0.5)}
BY_INSTANCE = {"trn2.48xlarge": BY_TEAM["search"], "trn1.32xlarge": (20.0, 5.0, 0.0, 0.0),
               "(none)": (0.0, 0.0, 2.0, 0.0), "inf2.xlarge": (0.0, 0.0, 0.0, 0.5)}
TOTAL = (40.0, 85.0, 2.0, 0.5)


def _post_events(live: LiveServer) -> None:
    now = time.time()
    batch = [event(kind, team=team, model=model, toolchain=tc, instance_type=itype, compile_seconds=seconds,
                   ts=now - 600 - i, namespace="")
             for i, (team, model, tc, itype, kind, seconds) in enumerate(EVENTS)]
    with live.client(ADMIN_SECRET) as admin:
        admin.post("/v1/events", json=batch).raise_for_status()


def _stats(live: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEFFCACHE_")}
    return subprocess.run([sys.executable, "-m", "neffcache.cli.main", "stats", "--index-url", live.url,
                           "--token", ADMIN_SECRET, "--window", "1d", *args], env=env, capture_output=True,
                          text=True, timeout=60, check=True)


def _metrics(live: LiveServer) -> str:
    with live.client(ADMIN_SECRET) as client:
        return client.get("/metrics").raise_for_status().text


def _money(row: dict[str, Any]) -> tuple[float, float, float, float]:
    return (row["compile_cost"], row["saved_cost"], row["unpriced_compile_hours"], row["unpriced_saved_hours"])


@pytest.fixture
def priced(db_url: str, start_server: Callable[..., LiveServer]) -> LiveServer:
    live = start_server(db_url, prices=PRICES, currency="EUR")
    _post_events(live)
    return live


@pytest.mark.parametrize(("group_by", "expected"), [("team", BY_TEAM), ("model", BY_MODEL),
                                                     ("toolchain", BY_TOOLCHAIN), ("instance_type", BY_INSTANCE)])
def test_stats_json_prices_every_group(priced: LiveServer, group_by: str,
                                       expected: dict[str, tuple[float, ...]]) -> None:
    data = json.loads(_stats(priced, "--group-by", group_by, "--json").stdout)
    assert data["currency"] == "EUR"
    assert _money(data["totals"]) == pytest.approx(TOTAL)
    assert {g["name"]: _money(g) for g in data["groups"]} == {k: pytest.approx(v) for k, v in expected.items()}
    # Hours stay what they were: money is beside them, never instead.
    assert (data["totals"]["compile_hours"], data["totals"]["saved_hours"]) == pytest.approx((3.5, 2.75))


def test_stats_text_shows_the_money_per_group(priced: LiveServer) -> None:
    out = _stats(priced, "--group-by", "team").stdout
    assert "saved           85.00 EUR" in out and "spent on misses 40.00 EUR" in out
    assert "unpriced        0.5 h saved, 2.0 h spent" in out
    header = next(line for line in out.splitlines() if line.startswith("team"))
    assert header.split()[-4:] == ["saved", "EUR", "spent", "EUR"]
    search = next(line for line in out.splitlines() if line.startswith("search"))
    assert search.split()[-2:] == ["80.00", "20.00"]


def test_metrics_price_the_counters(priced: LiveServer) -> None:
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(_metrics(priced)) for s in f.samples}

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    job = {"source": "job"}  # the jobs' own compiles and hits (no warm-up in these events)
    assert value("neffcache_compile_cost_total", **job, toolchain=TOOLCHAIN_LABEL, team="search", currency="EUR") == 20
    assert value("neffcache_compile_cost_saved_total", **job, toolchain=TOOLCHAIN_LABEL, team="search",
                 currency="EUR") == 80.0
    assert value("neffcache_compile_cost_total", **job, toolchain=TRN1_LABEL, team="ads", currency="EUR") == 20.0
    assert value("neffcache_unpriced_seconds_total", **job, kind="compile", toolchain=TRN1_LABEL, team="ads") == 7200
    assert value("neffcache_unpriced_seconds_total", **job, kind="hit", toolchain=TRN1_LABEL, team="speech") == 1800


def test_without_prices_hours_only(db_url: str, start_server: Callable[..., LiveServer]) -> None:
    live = start_server(db_url)
    _post_events(live)
    data = json.loads(_stats(live, "--json").stdout)
    assert data["currency"] is None and data["totals"]["compile_cost"] is None
    assert all(g["compile_cost"] is None and g["saved_cost"] is None for g in data["groups"])
    assert "EUR" not in _stats(live).stdout and "spent on misses" not in _stats(live).stdout
    names = {f.name for f in text_string_to_metric_families(_metrics(live))}
    assert "neffcache_compile_seconds" in names
    assert not names & {"neffcache_compile_cost", "neffcache_compile_cost_saved", "neffcache_unpriced_seconds"}


def test_metrics_export_upgrade_readiness(db_url: str, start_server: Callable[..., LiveServer]) -> None:
    live = start_server(db_url)
    new = {**TOOLCHAIN, "compiler_version": "2.28.1001.0+0badc0de"}
    new_ns = "trn2-lnc2/neuronxcc-2.28.1001.0+0badc0de"
    old = [entry(i) for i in range(3)]
    with live.client(ADMIN_SECRET) as admin:
        admin.post("/v1/entries", json=[*old, entry(0, namespace=new_ns, toolchain=new)]).raise_for_status()
        admin.post("/v1/events", json=[event("hit", path=old[0]["path"]), event("hit", path=old[1]["path"])])
    samples = {tuple(sorted(s.labels.items())): s.value
               for f in text_string_to_metric_families(_metrics(live))
               if f.name == "neffcache_upgrade_readiness" for s in f.samples}
    # Entry 0 is ready: (1 hit + 0.1) / (2 hits + 3 x 0.1).
    assert samples == {(("from_toolchain", TOOLCHAIN_LABEL), ("to_toolchain", new_ns)): pytest.approx(1.1 / 2.3)}


@pytest.mark.parametrize(("args", "env", "words"), [
    (["--price", "trn2.48xlarge=cheap"], {}, "expected INSTANCE_TYPE=PRICE_PER_HOUR"),
    (["--price", "trn9.huge=1"], {}, "unknown instance type"),
    (["--price", "trn2.48xlarge=1", "--price", "trn2.48xlarge=2"], {}, "priced twice"),
    (["--price", "trn2.48xlarge=-3"], {}, "from 0 to"),
    ([], {"NEFFCACHE_SERVER_PRICES": '{"trn2.48xlarge": "NaN"}'}, "prices"),
    ([], {"NEFFCACHE_SERVER_PRICES": "not json"}, "prices"),
    (["--price", "trn2.48xlarge=1", "--currency", "US dollars"], {}, "currency"),
])
def test_bad_prices_are_one_line_and_start_nothing(tmp_path: Path, args: list[str], env: dict[str, str],
                                                   words: str) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("NEFFCACHE_")}
    argv = [sys.executable, "-m", "neffcache.cli.main", "serve", "--data-dir", str(tmp_path / "d"),
            "--port", str(free_port()), *args]
    proc = subprocess.run(argv, env={**base, **env}, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    (said,) = [line for line in proc.stderr.splitlines() if words in line]  # one line says it
    assert said.startswith(("neffcache: ", "Error: "))
    assert not (tmp_path / "d").exists()
