"""``prune --max-size`` by value (issue 40): what a budget keeps, what the plan shows, pins.

The stores are written as neffcache publishes them (manifests with compile seconds), their
commit times set on disk, and ``neffcache`` runs as a real subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from neffcache.layouts import get_layout
from neffcache.operations.ingest import build_manifest
from neffcache.operations.publish import publish
from neffcache.outcomes import PublishStatus
from neffcache.prune import PrunePolicy, plan_prune
from neffcache.prune.costs import hits_of, seconds_of
from neffcache.prune.value import (
    DEFAULT_COMPILE_SECONDS,
    Retention,
    ValuePolicy,
    eviction_order,
    log_priority,
    score,
)
from neffcache.scan.report import scan
from neffcache.stores import open_store
from neffcache.stores.base import Store
from neffcache.toolchain import Toolchain
from tests.prune.helpers import NEW, OLD, TC_NEW

DAY = 86400.0


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``neffcache *args`` in its own process; without ``env``, with no index configured."""
    if env is None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NEFFCACHE_INDEX")}
    return subprocess.run([sys.executable, "-m", "neffcache.cli.main", *args], capture_output=True, text=True,
                          env=env, check=False, timeout=120)


def entry(root: Path, store: Store, number: int, *, size: int, seconds: float | None, age_days: float,
          toolchain: Toolchain = TC_NEW) -> str:
    """A published layout-A entry of ``size`` NEFF bytes whose manifest records ``seconds``,
    committed ``age_days`` ago (its files' mtimes: what the scan takes for the commit time)."""
    ns = get_layout("neuronxcc").namespace_for(toolchain)
    key = f"MODULE_{number}+abb26765"
    files = {"model.hlo_module.pb": b"HLO:" + key.encode(), "compile_flags.json": b"[]",
             "model.neff": b"NEFF" + os.urandom(size), "model.done": b""}
    manifest = build_manifest("neuronxcc", key, files, toolchain=toolchain, compile_seconds=seconds)
    assert publish(store, ns, key, files, manifest).status is PublishStatus.PUBLISHED
    when = time.time() - age_days * DAY + number  # distinct, ordered by number within an age
    for f in (root / ns.path / key).iterdir():
        os.utime(f, (when, when))
    return f"{ns.path}/{key}"


@pytest.fixture
def slow_old_fast_new(tmp_path: Path) -> tuple[Path, list[str], list[str]]:
    """The issue's store: the oldest entries small and slow to compile (30 min), the newest
    large and fast (2 s)."""
    root = tmp_path / "cache"
    store = open_store(str(root))
    slow = [entry(root, store, i, size=20_000, seconds=1800, age_days=10) for i in range(4)]
    fast = [entry(root, store, 10 + i, size=200_000, seconds=2, age_days=1) for i in range(4)]
    return root, slow, fast


def _plan(root: Path, *extra: str) -> dict[str, object]:
    """The plan's JSON; a later ``--max-size`` in ``extra`` overrides the 700K budget."""
    done = run_cli("prune", "--store", str(root), "--max-size", "700K", "--no-index", "--json", *extra)
    assert done.returncode == 0, done.stderr
    plan: dict[str, object] = json.loads(done.stdout)["plan"]
    return plan


def test_value_keeps_every_slow_entry_and_lru_does_not(slow_old_fast_new: tuple[Path, list[str], list[str]]) -> None:
    root, slow, fast = slow_old_fast_new
    by_value = _plan(root)
    items = by_value["items"]
    assert isinstance(items, list)
    assert {i["path"] for i in items} <= set(fast) and items and by_value["budgets"][0]["met"]  # type: ignore[index]
    first = items[0]
    assert first["policy"] == "value" and first["compile_seconds"] == 2.0 and not first["compile_seconds_default"]
    assert first["score"] > 0 and first["weighed_use"] and first["bytes"] > 200_000
    by_lru = _plan(root, "--policy", "lru")
    gone = {i["path"] for i in by_lru["items"]}  # type: ignore[attr-defined]
    assert set(slow) <= gone  # recency alone throws away two hours of compiles to save 80 kB
    # LRU orders without costs; what it evicts still shows (and is tombstoned with) its own.
    assert {i["path"]: i["compile_seconds"] for i in by_lru["items"]} == {  # type: ignore[attr-defined]
        p: 1800.0 if p in slow else 2.0 for p in gone}

    text = run_cli("prune", "--store", str(root), "--max-size", "700K", "--no-index")
    assert "evicted for the budget, policy value" in text.stdout
    header = next(line for line in text.stdout.splitlines() if line.startswith("entry "))
    assert header.split() == ["entry", "size", "compile", "s", "hits", "last", "use", "(UTC)", "score"]

    done = run_cli("prune", "--store", str(root), "--max-size", "700K", "--no-index", "--yes", "--json")
    assert done.returncode == 0, done.stderr
    left = {e.path for e in scan(open_store(str(root))).entries}
    assert set(slow) <= left and len(left & set(fast)) == 3


def test_entries_without_a_compile_time_are_costed_at_the_stated_default(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    store = open_store(str(root))
    unknown = entry(root, store, 1, size=50_000, seconds=None, age_days=3)
    entry(root, store, 2, size=50_000, seconds=DEFAULT_COMPILE_SECONDS * 10, age_days=3)
    plan = plan_prune([store], PrunePolicy(max_size={"*": 80_000}, hit_grace=0))
    (item,) = plan.items
    assert item.path == unknown and item.cost is not None
    assert item.cost.compile_seconds is None and item.cost.costed_seconds == DEFAULT_COMPILE_SECONDS
    assert item.to_json()["compile_seconds_default"] is True
    assert any(f"costed at the default of {DEFAULT_COMPILE_SECONDS:g} s" in n for n in plan.notes)


def test_a_superseded_toolchain_goes_before_the_newest(tmp_path: Path) -> None:
    """After a compiler bump the old toolchain's entries go first, however valuable they were."""
    root = tmp_path / "cache"
    store = open_store(str(root))
    old = entry(root, store, 1, size=10_000, seconds=3600, age_days=0.5, toolchain=Toolchain(OLD, "trn2", 2))
    new = entry(root, store, 2, size=100_000, seconds=5, age_days=2)
    plan = plan_prune([store], PrunePolicy(max_size={"*": 110_000}, hit_grace=0))
    assert [i.path for i in plan.items] == [old] and plan.items[0].cost and plan.items[0].cost.superseded
    lru = plan_prune([store], PrunePolicy(max_size={"*": 110_000}, hit_grace=0, retention=Retention.LRU))
    assert [i.path for i in lru.items] == [new]
    assert NEW not in old


def test_pinned_graphs_survive_the_budget_up_to_their_cap(slow_old_fast_new: tuple[Path, list[str], list[str]],
                                                          tmp_path: Path) -> None:
    root, slow, fast = slow_old_fast_new
    wanted = fast[2:]  # what tomorrow's scheduled job needs (a `plan --json` of it)
    report = tmp_path / "plan.json"
    # Also a name no entry has and one that is not a store path at all: neither pins anything.
    report.write_text(json.dumps({"graphs": [{"path": p, "status": "hit"} for p in wanted]
                                  + [{"path": "../../etc/passwd"}, {"path": "nope/MODULE_9+abb26765"}, 7]}))
    unpinned = _plan(root, "--max-size", "450K")
    assert set(wanted) & {i["path"] for i in unpinned["items"]}  # type: ignore[attr-defined]

    plan = _plan(root, "--max-size", "450K", "--pin-from-report", str(report), "--pin-max-share", "1")
    gone = {i["path"] for i in plan["items"]}  # type: ignore[attr-defined]
    assert not gone & set(wanted) and gone & set(slow) and plan["budgets"][0]["met"]  # type: ignore[index]
    assert {p["path"] for p in plan["protected"] if p["why"].startswith("pinned")} == set(wanted)  # type: ignore
    assert plan["policy"]["pins"] == 3  # the paths named; "../../etc/passwd" is not one
    text = run_cli("prune", "--store", str(root), "--max-size", "450K", "--no-index", "--pin-from-report",
                   str(report), "--pin-max-share", "1")
    assert "pinned, kept under the budget: 2 graphs" in text.stdout

    # Half of 450 kB holds one of the two 200 kB graphs: the other is ranked as usual.
    capped = _plan(root, "--max-size", "450K", "--pin-from-report", str(report))
    assert len({i["path"] for i in capped["items"]} & set(wanted)) == 1  # type: ignore[attr-defined]
    assert any("1 of 2 pinned graphs" in n and "exceed the pin cap" in n for n in capped["notes"])  # type: ignore


def test_bad_pin_reports_are_refused_and_change_nothing(slow_old_fast_new: tuple[Path, list[str], list[str]],
                                                        tmp_path: Path) -> None:
    root, _, _ = slow_old_fast_new
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    for body, message in ((b"{not json", "not a JSON report"), (b'{"graphs": 3}', "no 'graphs' list")):
        bad = tmp_path / "bad.json"
        bad.write_bytes(body)
        done = run_cli("prune", "--store", str(root), "--max-size", "700K", "--no-index", "--yes",
                       "--pin-from-report", str(bad))
        assert done.returncode == 2 and message in done.stderr, done.stderr
    alone = run_cli("prune", "--store", str(root), "--garbage", "--pin-from-report", str(tmp_path / "x.json"))
    assert alone.returncode == 2 and "goes with --max-size" in alone.stderr
    missing = run_cli("prune", "--store", str(root), "--max-size", "1K", "--pin-from-report", str(tmp_path / "no"))
    assert missing.returncode == 2, missing.stderr
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


@dataclass
class Held:
    size: int
    compile_seconds: float | None
    hits: int
    used: float


def test_the_value_order_does_not_depend_on_when_it_is_computed() -> None:
    """Why the bench can keep the order in a heap and two prunes a day apart agree."""
    policy = ValuePolicy()
    items = [Held(10_000 * (i % 7 + 1), 5.0 * (i % 5 + 1), i % 3, 1_700_000_000 + 3600 * i) for i in range(40)]
    ranks = [sorted(items, key=lambda h, t=t: score(h, policy, t)) for t in (1_700_200_000, 1_800_000_000)]
    assert ranks[0] == ranks[1] == eviction_order(items, Retention.VALUE, policy)
    assert eviction_order(items, Retention.LRU) == sorted(items, key=lambda h: h.used)
    # Twice the compile time, twice the hits-plus-one, or half the size: the same log step.
    base = Held(1000, 10.0, 0, 0.0)
    step = log_priority(Held(1000, 20.0, 0, 0.0), policy) - log_priority(base, policy)
    assert step == pytest.approx(log_priority(Held(1000, 10.0, 1, 0.0), policy) - log_priority(base, policy))
    assert step == pytest.approx(log_priority(Held(500, 10.0, 0, 0.0), policy) - log_priority(base, policy))
    assert step == pytest.approx(log_priority(Held(1000, 10.0, 0, policy.half_life), policy)
                                 - log_priority(base, policy))


def test_recorded_costs_from_untrusted_sources() -> None:
    assert seconds_of(12.5) == 12.5 and seconds_of(3) == 3.0
    for bad in (None, True, "60", -1, 0, float("nan"), float("inf"), 1e12, [1]):
        assert seconds_of(bad) is None
    assert hits_of(5) == 5
    for junk in (-1, 2.5, "9", True, 1 << 60, None):
        assert hits_of(junk) == 0
    with pytest.raises(ValueError):
        ValuePolicy(half_life=0)
