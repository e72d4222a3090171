"""Guard rails: a prune that looks like a mistake is refused and changes nothing (issue #13)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from neffcache.errors import ConfigError, RefusedPlan
from neffcache.prune import PrunePolicy, execute_plan, plan_prune
from neffcache.stores import open_store
from neffcache.stores.base import Store
from neffcache.toolchain import Toolchain
from tests.prune.helpers import NEW, OLD, TC_NEW, TC_OLD, listing, published_a, runtime_a
from tests.prune.test_cli import run_cli

NEWER = "2.28.1001.0+0badc0de"


def _entries(store: Store, n: int, toolchain: Toolchain, size: int, tag: str) -> None:
    for i in range(n):
        published_a(store, f"MODULE_{tag}{i}+abb26765", toolchain, size=size)


def test_partial_version_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    """`--keep-compiler 2.27` once planned to remove every entry of 2.27.5334.0+f702b353."""
    store = open_store(str(tmp_path / "c"))
    for i in range(2):
        runtime_a(store, f"old{i}".encode())
    _entries(store, 2, TC_NEW, 4096, "n")
    before = listing(store)
    for args in (["--yes"], ["--yes", "--force"], ["--json"]):
        got = run_cli("prune", "--store", str(tmp_path / "c"), "--keep-compiler", "2.27", *args)
        assert got.returncode == 2, got.stderr
        line = got.stderr.strip()
        assert len(line.splitlines()) == 1 and line.startswith("neffcache: configuration error: --keep-compiler 2.27")
        assert f"versions present: {OLD}, {NEW}" in line and "'current'" in line
        assert got.stdout == ""
    assert listing(store) == before
    # The library refuses it the same way; an exact version and 'current' are accepted.
    with pytest.raises(ConfigError, match="matches no entry"):
        plan_prune([store], PrunePolicy(keep_compilers=("2.27",)))
    assert plan_prune([store], PrunePolicy(keep_compilers=(NEW,))).entries == 2
    assert plan_prune([store], PrunePolicy(keep_compilers=(NEWER,), current=NEWER)).entries == 4
    ok = run_cli("prune", "--store", str(tmp_path / "c"), "--keep-compiler", NEW, "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["plan"]["entries"] == 2


@pytest.mark.parametrize("kind", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_a_plan_that_empties_a_store_needs_force(kind: str, tmp_path: Path, request: pytest.FixtureRequest,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.prune.conftest import make_store

    store = make_store(kind, tmp_path, request)
    if kind == "s3":
        monkeypatch.setenv("AWS_ENDPOINT_URL", store.endpoint)  # type: ignore[attr-defined]
    _entries(store, 3, TC_OLD, 2048, "o")
    before = listing(store)
    # Right after a compiler bump 'current' has no entries yet: allowed as a filter, but the plan
    # removes every entry of the store.
    base = ["prune", "--store", store.url, "--keep-compiler", "current", "--compiler-version", NEW, "--no-index"]
    dry = run_cli(*base)
    assert dry.returncode == 0, dry.stderr
    assert "guard (empties-store): the plan removes every entry of" in dry.stdout and "--force" in dry.stdout
    data = json.loads(run_cli(*base, "--json").stdout)
    rules = {g["rule"] for g in data["plan"]["guard"]}
    assert rules == {"empties-store", "max-share"}
    empties = next(g for g in data["plan"]["guard"] if g["rule"] == "empties-store")
    assert empties["entries"] == empties["of_entries"] == 3 and empties["store"] == store.url
    refused = run_cli(*base, "--yes")
    assert refused.returncode == 9, refused.stderr
    assert refused.stderr.strip().splitlines()[-1].startswith("neffcache: refused: the plan removes every entry")
    assert listing(store) == before
    as_json = run_cli(*base, "--yes", "--json")
    assert as_json.returncode == 9 and json.loads(as_json.stdout)["refused"] is True
    assert listing(store) == before
    assert run_cli(*base, "--force").returncode == 2  # --force alone is a usage mistake too
    done = run_cli(*base, "--yes", "--force", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"]["removed_entries"] == 3
    # The library: the same plan raises unless forced.
    _entries(store, 1, TC_OLD, 2048, "p")
    plan = plan_prune([store], PrunePolicy(keep_compilers=(NEW,), current=NEW))
    with pytest.raises(RefusedPlan):
        execute_plan(plan, [store])
    assert execute_plan(plan, [store], force=True).removed


def test_removing_every_entry_of_the_newest_toolchain_is_refused(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "c"))
    _entries(store, 6, TC_OLD, 8192, "o")
    _entries(store, 2, TC_NEW, 1024, "n")  # a few small entries of the new compiler
    before = listing(store)
    base = ["prune", "--store", str(tmp_path / "c"), "--keep-compiler", OLD]  # the two versions swapped
    data = json.loads(run_cli(*base, "--json").stdout)
    assert [g["rule"] for g in data["plan"]["guard"]] == ["empties-newest-toolchain"]
    assert data["plan"]["guard"][0]["toolchain"] == f"neuronxcc-{NEW} trn2 lnc=2"
    refused = run_cli(*base, "--yes")
    assert refused.returncode == 9 and "newest toolchain" in refused.stderr
    assert listing(store) == before
    # Removing the old toolchain instead is not the newest (its share is the share rule's business).
    fine = plan_prune([store], PrunePolicy(keep_compilers=(NEW,), max_share=1.0))
    assert fine.guards == () and fine.entries == 6
    # Newest by version order, not by name: 2.9 < 2.10.
    other = open_store(str(tmp_path / "d"))
    _entries(other, 2, Toolchain("2.10.1.0+aaaaaaaa", "trn2", 2), 1024, "t")
    _entries(other, 2, Toolchain("2.9.1.0+aaaaaaaa", "trn2", 2), 1024, "n")
    plan = plan_prune([other], PrunePolicy(keep_compilers=("2.9.1.0+aaaaaaaa",), max_share=1.0))
    assert [g.rule for g in plan.guards] == ["empties-newest-toolchain"]
    assert not plan_prune([other], PrunePolicy(keep_compilers=("2.10.1.0+aaaaaaaa",), max_share=1.0)).guards


def test_more_than_half_of_the_bytes_needs_force(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(str(tmp_path / "c"))
    _entries(store, 3, TC_OLD, 16384, "o")
    _entries(store, 3, TC_NEW, 1024, "n")
    before = listing(store)
    base = ["prune", "--store", str(tmp_path / "c"), "--keep-last", "1"]
    data = json.loads(run_cli(*base, "--json").stdout)
    [guard] = data["plan"]["guard"]
    assert guard["rule"] == "max-share" and guard["share"] > 0.8 and guard["entries"] == 3
    refused = run_cli(*base, "--yes")
    assert refused.returncode == 9 and "more than --max-share 0.5" in refused.stderr
    assert listing(store) == before
    assert json.loads(run_cli(*base, "--max-share", "0.95", "--json").stdout)["plan"]["guard"] == []
    monkeypatch.setenv("NEFFCACHE_PRUNE_MAX_SHARE", "0.95")  # the setting, as a flag would
    done = run_cli(*base, "--yes", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"]["removed_entries"] == 3
    monkeypatch.setenv("NEFFCACHE_PRUNE_MAX_SHARE", "1.5")
    assert run_cli(*base).returncode == 2


def test_a_guarded_dry_run_ends_with_the_flags_that_carry_it_out(tmp_path: Path) -> None:
    """The last line of a dry run the guard would refuse names --yes --force (a plain --yes
    is refused), and adding exactly those flags removes what the plan listed."""
    store = open_store(str(tmp_path / "c"))
    _entries(store, 3, TC_OLD, 16384, "o")
    _entries(store, 3, TC_NEW, 1024, "n")
    base = ["prune", "--store", str(tmp_path / "c"), "--keep-last", "1", "--no-index"]
    dry = run_cli(*base)
    assert dry.returncode == 0, dry.stderr
    last = dry.stdout.strip().splitlines()[-1]
    assert last == "dry run: nothing was changed. Add --yes --force to remove these items (the guard refuses " \
                   "--yes alone)."
    flags = last.split("Add ", 1)[1].split(" to remove", 1)[0].split()
    assert run_cli(*base, "--yes").returncode == 9
    done = run_cli(*base, *flags, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"]["removed_entries"] == 3
    # Without a guard the last line names --yes alone, and that runs.
    _entries(store, 1, TC_OLD, 1024, "p")
    plain = ["prune", "--store", str(tmp_path / "c"), "--keep-compiler", NEW, "--no-index"]
    assert run_cli(*plain).stdout.strip().splitlines()[-1] == \
        "dry run: nothing was changed. Add --yes to remove these items."
    assert json.loads(run_cli(*plain, "--yes", "--json").stdout)["result"]["removed_entries"] == 1


def test_failed_garbage_and_locks_are_never_guarded(tmp_path: Path) -> None:
    """A plan that removes no committed entry with compiled work trips no rule, even when it
    takes everything there is: every failed compile of a store, say."""
    store = open_store(str(tmp_path / "c"))
    for i in range(3):
        runtime_a(store, f"bad{i}".encode(), version=NEW, state="FAILED")
    plan = plan_prune([store], PrunePolicy(failed=True, garbage=True, stale_locks=True, grace=0, lock_age=0))
    assert plan.entries == 3 and plan.guards == ()
    done = run_cli("prune", "--store", str(tmp_path / "c"), "--failed", "--garbage", "--yes")
    assert done.returncode == 0, done.stderr
