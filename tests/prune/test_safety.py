"""The safety rules: a plan changes nothing, and execution re-checks every item right before it acts."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from neffcache.cli.main import cli
from neffcache.coordination.lease import LeaseRecord, acquire, lease_path
from neffcache.coordination.stamps import record_use
from neffcache.coordination.write_leases import publish_lease_name
from neffcache.operations.verify import CheckStatus, check_entry
from neffcache.prune import JOURNAL_DIR, ItemKind, PrunePolicy, Reason, execute_plan, plan_prune
from neffcache.scan.report import load_entry, scan
from neffcache.stores.base import Store
from tests.prune.helpers import (
    NEW,
    OLD,
    TC_NEW,
    TC_OLD,
    bare_b,
    future,
    listing,
    published_a,
    published_b,
    runtime_a,
    uncommitted_a,
)

EVERYTHING = PrunePolicy(keep_compilers=(NEW,), current=NEW, older_than=0, max_size={"*": 0}, failed=True,
                         stale_locks=True, garbage=True, grace=0, hit_grace=0, lock_age=0)


def messy_cache(store: Store) -> str:
    """A cache with something for every rule; returns an entry path a journal says was half-removed."""
    runtime_a(store, b"old-1")
    runtime_a(store, b"failed", version=NEW, state="FAILED")
    runtime_a(store, b"locked", version=NEW, state="LOCKED")
    published_a(store, "MODULE_1+abb26765")
    published_a(store, "MODULE_1+abb26765", TC_OLD)
    published_b(store, b"hlo-b")
    bare_b(store, "bare", TC_OLD)
    uncommitted_a(store)
    record_use(store, ["gone/neuronxcc-1.0/MODULE_0+0"])
    now = time.time()
    store.put_file(lease_path("compile:x"), LeaseRecord("compile:x", "h:1", "t", "h", 1, now - 9, now - 5).to_bytes())
    store.put_file("neuronxcc-2.21.33363.0+82129205/.tmp.neffcache-tmp-abc", b"partial")
    half = published_a(store, "MODULE_2+abb26765")
    files = sorted(f.path for f in store.iter_files(half))
    store.put_file(f"{JOURNAL_DIR}/0123456789abcdef-0.json", json.dumps({"entries": {half: files}}).encode())
    store.delete([f"{half}/model.done"])
    # Past their retention: a quarantined entry of 2000 and an action record of the same year.
    store.put_file(".neffcache/quarantine/20000101T000000Z/neuronxcc-1.0/MODULE_9+0/model.neff", b"NEFF-bad")
    store.put_file(".neffcache/history/20000101T000000.000000Z-prune-00000000000000ff-1.json", b"{}")
    return half


def test_dry_run_changes_nothing(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    half = messy_cache(store)
    before = listing(store)
    plan = plan_prune([store], EVERYTHING, now=future(1))
    by_size = plan_prune([store], dataclasses.replace(EVERYTHING, older_than=None), now=future(1))
    assert {i.reason for p in (plan, by_size) for i in p.items} == set(Reason)
    assert any(i.path == half and i.reason is Reason.INTERRUPTED for i in plan.items)
    if store.scheme == "s3":
        monkeypatch.setenv("AWS_ENDPOINT_URL", store.endpoint)  # type: ignore[attr-defined]
    args = ["prune", "--store", store.url, "--keep-compiler", "current", "--compiler-version", NEW, "--keep-last", "1",
            "--older-than", "0s", "--max-size", "0", "--failed", "--stale-locks", "--garbage", "--grace", "0",
            "--hit-grace", "0", "--lock-age", "0", "--entries"]
    for extra in ([], ["--json"]):
        result = CliRunner().invoke(cli, args + extra, catch_exceptions=False)
        assert result.exit_code == 0, result.output
    assert "dry run: nothing was changed" in CliRunner().invoke(cli, args).output
    assert json.loads(result.output)["executed"] is False
    assert listing(store) == before  # every path, size and sha256, byte for byte


def test_live_lease_protects_at_plan_and_at_execution(fs_store: Store) -> None:
    store = fs_store
    held_at_plan = published_a(store, "MODULE_1+abb26765", TC_OLD)
    held_later = published_a(store, "MODULE_2+abb26765", TC_OLD)
    lease = acquire(store, publish_lease_name(held_at_plan), ttl=60)
    plan = plan_prune([store], PrunePolicy(keep_compilers=(NEW,), current=NEW))
    assert [i.path for i in plan.items] == [held_later]
    assert [(p.path, "live lease" in p.why) for p in plan.protected] == [(held_at_plan, True)]
    later = acquire(store, publish_lease_name(held_later), ttl=60)
    result = execute_plan(plan, [store], force=True)
    assert not result.removed and "live lease" in result.skipped[0].why
    later.release()
    lease.release()
    assert {e.path for e in scan(store).entries} == {held_at_plan, held_later}


def test_entry_republished_after_the_plan_is_kept(store: Store) -> None:
    path = published_a(store, "MODULE_1+abb26765", TC_OLD)
    plan = plan_prune([store], PrunePolicy(keep_compilers=(NEW,), current=NEW))
    assert [i.path for i in plan.items] == [path]
    # Someone else removes it and publishes it again (a rewarm) before the plan runs.
    store.delete([f.path for f in store.iter_files(path)])
    time.sleep(1.05 if store.scheme == "s3" else 0.01)
    published_a(store, "MODULE_1+abb26765", TC_OLD)
    result = execute_plan(plan, [store], force=True)
    assert not result.removed and "changed since the plan" in result.skipped[0].why
    entry = load_entry(store, path)
    assert entry is not None and check_entry(store, entry).status is CheckStatus.OK


def test_use_after_the_plan_keeps_the_entry(fs_store: Store) -> None:
    path = published_a(fs_store, "MODULE_1+abb26765")
    plan = plan_prune([fs_store], PrunePolicy(older_than=86400, hit_grace=0), now=future(2))
    assert [i.path for i in plan.items] == [path]
    record_use(fs_store, [path])
    result = execute_plan(plan, [fs_store], force=True)
    assert [s.why for s in result.skipped] == ["used since the plan was made"]


def test_interrupted_prune_is_finished(store: Store) -> None:
    half = messy_cache(store)
    plan = plan_prune([store], PrunePolicy(failed=True))  # any rule: finishing old work comes with it
    interrupted = [i for i in plan.items if i.reason is Reason.INTERRUPTED]
    assert [(i.path, i.kind, i.state) for i in interrupted] == [(half, ItemKind.ENTRY, "UNCOMMITTED")]
    result = execute_plan(plan, [store], force=True)
    assert half in {i.path for i in result.removed}
    assert list(store.iter_files(half)) == [] and list(store.iter_files(JOURNAL_DIR)) == []


def test_plan_json_and_totals(tmp_path: Path) -> None:
    from neffcache.stores.local import LocalStore

    store = LocalStore(tmp_path / "c")
    old = [runtime_a(store, f"g{i}".encode()) for i in range(3)]
    plan = plan_prune([store], PrunePolicy(keep_last=1))
    assert plan.entries == 0  # one version only: it is the newest
    runtime_a(store, b"new", version=NEW)
    plan = plan_prune([store], PrunePolicy(keep_last=1))
    data = plan.to_json()
    assert data["entries"] == 3 and {i["path"] for i in data["items"]} == set(old)
    assert data["by_reason"] == {"compiler": {"items": 3, "bytes": plan.expected_freed_size}}
    assert data["by_toolchain"] == {f"neuronxcc-{OLD} (target not recorded)": data["by_reason"]["compiler"]}
    assert data["policy"]["keep_last"] == 1
    with pytest.raises(Exception, match="nothing to prune"):
        plan_prune([store], PrunePolicy())


def test_prune_group_lease_excludes_publishers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a store one host writes, a prune holds its chunk's group lease instead of each entry's
    publish lease: a publisher of an entry in that group waits for it (and gives up as BUSY)."""
    from neffcache.coordination import write_leases
    from neffcache.layouts import get_layout
    from neffcache.outcomes import PublishStatus
    from neffcache.stores.local import LocalStore
    from tests.prune.procs import publish_key

    store = LocalStore(tmp_path / "c")
    assert store.single_writer
    key = "MODULE_7+abb26765"
    path = f"{get_layout('neuronxcc').namespace_for(TC_NEW).path}/{key}"
    monkeypatch.setattr(write_leases, "PRUNE_GROUP_WAIT", 0.1)
    group = acquire(store, write_leases.prune_group_lease(path), ttl=60)
    assert publish_key(store, key) is PublishStatus.BUSY
    assert load_entry(store, path) is None
    group.release()
    assert publish_key(store, key) is PublishStatus.PUBLISHED
    # A prune killed while it held the group leaves the lease behind: publishers go on.
    stale = write_leases.prune_group_lease(f"{path[:-1]}x")
    store.put_file(lease_path(stale), LeaseRecord(stale, "h:1", "t", "h", 1, 0.0, 1.0).to_bytes())
    assert publish_key(store, f"{key[:-1]}x") is PublishStatus.PUBLISHED


def test_publish_lease_left_behind_is_taken_over(fs_store: Store) -> None:
    """A publisher killed with its lease held: once the lease is stale the prune takes it over
    (and removes it with the entry) rather than skipping the entry for ever."""
    path = published_a(fs_store, "MODULE_1+abb26765", TC_OLD)
    plan = plan_prune([fs_store], PrunePolicy(keep_compilers=(NEW,), current=NEW))
    name = publish_lease_name(path)
    fs_store.put_file(lease_path(name), LeaseRecord(name, "h:1", "t", "h", 1, 0.0, 1.0).to_bytes())
    result = execute_plan(plan, [fs_store], force=True)
    assert [i.path for i in result.removed] == [path] and not result.skipped
    assert list(fs_store.iter_files(path)) == []
    assert [f.path for f in fs_store.iter_files(".neffcache/leases")] == []
