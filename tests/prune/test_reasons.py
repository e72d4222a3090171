"""Every prune reason, planned and executed, on a local store, a shared mount and S3 (moto)."""

from __future__ import annotations

import time

import boto3
import pytest

from neffcache.coordination.lease import LeaseRecord, lease_path, read_lease
from neffcache.coordination.stamps import record_use, stamp_path
from neffcache.entry import EntryState
from neffcache.errors import RefusedPlan
from neffcache.operations.verify import CheckStatus, verify
from neffcache.prune import ItemKind, PrunePolicy, Reason, execute_plan, plan_prune
from neffcache.prune.value import Retention
from neffcache.scan.report import load_entry, scan
from neffcache.stores.base import Store
from tests.prune.helpers import (
    LEGACY,
    NEW,
    OLD,
    TC_NEW,
    TC_OLD,
    TC_OLD_TRN1,
    bare_b,
    future,
    published_a,
    published_b,
    runtime_a,
    uncommitted_a,
)
from tests.stores.conftest import BUCKET


def paths(store: Store) -> set[str]:
    return {e.path for e in scan(store).entries}


def test_compiler_bump_both_layouts_and_runtime_written(store: Store) -> None:
    """Everything of a toolchain that is not kept goes: layout A as libneuronxla writes it (2.15+
    and the 2.12 legacy form), layout A and B as neffcache publishes them, bare layout-B NEFFs by
    their manifest. A bare NEFF without manifest has no known toolchain and stays."""
    old = {runtime_a(store, b"graph-1"), runtime_a(store, b"graph-2", state="FAILED"),
           runtime_a(store, b"graph-3", version=LEGACY, legacy=True),
           published_a(store, "MODULE_1+abb26765", TC_OLD), published_b(store, b"hlo-1", TC_OLD),
           bare_b(store, "bare-old", TC_OLD)}
    new = {runtime_a(store, b"graph-1", version=NEW), published_a(store, "MODULE_1+abb26765", TC_NEW),
           published_b(store, b"hlo-1", TC_NEW)}
    unknown = bare_b(store, "bare-unknown")
    assert paths(store) == old | new | {unknown}

    plan = plan_prune([store], PrunePolicy(keep_compilers=(NEW,), current=NEW))
    assert {i.path for i in plan.items} == old
    assert {i.reason for i in plan.items} == {Reason.COMPILER}
    assert plan.expected_freed_size == sum(e.size for e in scan(store).entries if e.path in old)
    assert set(plan.by_toolchain()) == {f"neuronxcc-{OLD} (target not recorded)", f"neuronxcc-{OLD} trn2 lnc=2",
                                        f"neuronxcc-{LEGACY} (target not recorded)"}
    assert any("unknown toolchain" in n for n in plan.notes)
    result = execute_plan(plan, [store], force=True)
    assert {i.path for i in result.removed} == old and not result.skipped
    assert result.freed_bytes == plan.expected_freed_size
    assert paths(store) == new | {unknown}
    report = scan(store)
    assert report.garbage == () and report.uncommitted == ()
    assert verify(store).count(CheckStatus.CORRUPT) == 0


def test_keep_last_counts_each_target(store: Store) -> None:
    trn1_old = published_a(store, "MODULE_1+abb26765", TC_OLD_TRN1)
    trn2_old = published_a(store, "MODULE_1+abb26765", TC_OLD)
    trn2_new = published_a(store, "MODULE_1+abb26765", TC_NEW)
    plan = plan_prune([store], PrunePolicy(keep_last=1))
    assert [i.path for i in plan.items] == [trn2_old]  # trn1's only (newest) version stays
    execute_plan(plan, [store], force=True)
    assert paths(store) == {trn1_old, trn2_new}


def test_failed_entries(store: Store) -> None:
    failed = runtime_a(store, b"bad", version=NEW, state="FAILED")
    ok = runtime_a(store, b"good", version=NEW)
    plan = plan_prune([store], PrunePolicy(failed=True))
    assert [(i.path, i.reason, i.state) for i in plan.items] == [(failed, Reason.FAILED, "FAILED")]
    execute_plan(plan, [store], force=True)
    assert paths(store) == {ok}


def test_age_by_stamp_or_created_time(store: Store) -> None:
    used = published_a(store, "MODULE_1+abb26765")
    unused = published_a(store, "MODULE_2+abb26765")
    record_use(store, [used])
    # Thirty days from now the stamp is 30 days old too: only its absence makes `unused` older.
    plan = plan_prune([store], PrunePolicy(older_than=29 * 86400), now=future(30))
    by_path = {i.path: i for i in plan.items}
    assert set(by_path) == {used, unused}
    assert by_path[used].basis.value == "stamp" and by_path[unused].basis.value == "created"
    assert any("no last-use record" in n for n in plan.notes)
    assert not plan_prune([store], PrunePolicy(older_than=31 * 86400), now=future(30)).items
    # Executed now, the stamp is seconds old: the hit grace period keeps `used` whatever the plan said.
    result = execute_plan(plan, [store], force=True)
    assert [i.path for i in result.removed] == [unused]
    assert [(s.path, s.why.split(" ago")[0]) for s in result.skipped] == [(used, "used 0m")]
    assert paths(store) == {used}
    assert store.stat(stamp_path(used)) is not None


def test_size_budget_lru(store: Store) -> None:
    # S3 keeps LastModified in whole seconds: space the writes so the order is visible there too.
    gap = 1.05 if store.scheme == "s3" else 0.02
    entries = []
    for i in range(3):
        entries.append(published_a(store, f"MODULE_{i}+abb26765", size=10_000))
        time.sleep(gap)
    record_use(store, [entries[0]])  # the oldest entry is the most recently used one
    sizes = {e.path: e.size for e in scan(store).entries}
    budget = sizes[entries[0]] + sizes[entries[2]] + 100
    plan = plan_prune([store], PrunePolicy(max_size={store.url: budget}, hit_grace=0, retention=Retention.LRU))
    assert [i.path for i in plan.items] == [entries[1]]  # least recently used first
    (b,) = plan.budgets
    assert b.met and b.size_before == sum(sizes.values()) and b.size_after <= budget
    assert execute_plan(plan, [store], force=True).freed_bytes == sizes[entries[1]]
    assert paths(store) == {entries[0], entries[2]}
    # A budget only removing a recently used entry could meet is reported as not met, not forced.
    tight = plan_prune([store], PrunePolicy(max_size={"*": 1}))
    assert [i.path for i in tight.items] == [entries[2]]
    assert [p.path for p in tight.protected] == [entries[0]]
    assert not tight.budgets[0].met and any("cannot be met" in n for n in tight.notes)
    # ... and removing entries for a budget that stays unmet is refused unless forced.
    assert "budget-unmet" in {g.rule for g in tight.guards}
    with pytest.raises(RefusedPlan, match="cannot meet the budget"):
        execute_plan(tight, [store])
    assert paths(store) == {entries[0], entries[2]}


def test_stale_leases(store: Store) -> None:
    now = time.time()
    expired = LeaseRecord("compile:g1", "gone-host:1", "tok1", "gone-host", 1, now - 600, now - 300)
    live = LeaseRecord("compile:g2", "busy-host:2", "tok2", "busy-host", 2, now, now + 600)
    for record in (expired, live):
        store.put_file(lease_path(record.name), record.to_bytes())
    plan = plan_prune([store], PrunePolicy(stale_locks=True))
    assert [(i.kind, i.path) for i in plan.items] == [(ItemKind.LEASE, lease_path("compile:g1"))]
    assert "expired" in plan.items[0].detail
    execute_plan(plan, [store], force=True)
    assert read_lease(store, "compile:g1") is None
    assert read_lease(store, "compile:g2") == live


def test_runtime_locks(store: Store) -> None:
    locked = runtime_a(store, b"locked", version=NEW, state="LOCKED")
    lock = f"{locked}/model.hlo_module.pb.lock"
    # A fresh runtime lock is a compile in progress as far as anyone can tell.
    fresh = plan_prune([store], PrunePolicy(stale_locks=True))
    assert not fresh.items and [p.path for p in fresh.protected] == [lock]
    later = plan_prune([store], PrunePolicy(stale_locks=True), now=time.time() + 7 * 3600)
    assert [(i.kind, i.path) for i in later.items] == [(ItemKind.LOCK, lock)]
    # Executed now the lock is young again, so the execution keeps it...
    assert execute_plan(later, [store], force=True).skipped
    # ...and with --lock-age 0 every lock without a lease or holder is stale.
    execute_plan(plan_prune([store], PrunePolicy(stale_locks=True, lock_age=0)), [store], force=True)
    entry = load_entry(store, locked)
    assert entry is not None and entry.state is EntryState.EMPTY and store.stat(lock) is None


def test_garbage(store: Store) -> None:
    keep = published_a(store, "MODULE_1+abb26765")
    partial = uncommitted_a(store)
    ns = keep.rsplit("/", 1)[0]
    temp = f"{keep}/.model.neff.neffcache-tmp-0123456789ab"
    orphan = f"{ns}/stray.txt"
    outside = "notes/readme.txt"
    staging = ".neffcache/staging/neffcache-tmp-00ff/model.neff"
    for path in (temp, orphan, outside, staging):
        store.put_file(path, b"x" * 10)
    record_use(store, [f"{ns}/MODULE_9+abb26765"])  # a stamp whose entry is long gone
    # Within the grace period everything may be a write in flight.
    assert not plan_prune([store], PrunePolicy(garbage=True)).items
    plan = plan_prune([store], PrunePolicy(garbage=True, grace=0))
    got = {(i.kind, i.path) for i in plan.items}
    assert got == {(ItemKind.ENTRY, partial), (ItemKind.FILE, temp), (ItemKind.FILE, staging),
                   (ItemKind.FILE, stamp_path(f"{ns}/MODULE_9+abb26765"))}
    # Files neffcache did not write are foreign, inside a namespace or not: shown, kept.
    (foreign,) = plan.foreign
    assert (foreign.files, foreign.bytes, set(foreign.paths)) == (2, 20, {orphan, outside})
    result = execute_plan(plan, [store], force=True)
    assert not result.skipped
    report = scan(store)
    assert [e.path for e in report.entries] == [keep]
    assert report.garbage == () and report.uncommitted == ()
    assert [f.path for f in report.foreign] == sorted([orphan, outside])  # not neffcache's to remove


@pytest.mark.s3
def test_abandoned_multipart_uploads(s3_endpoint: str) -> None:
    from neffcache.stores import open_store

    store = open_store(f"s3://{BUCKET}/cache", endpoint_url=s3_endpoint)
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    up = client.create_multipart_upload(Bucket=BUCKET, Key="cache/trn2-lnc2/neuronxcc-2.27/MODULE_1+x/model.neff")
    # moto dates every upload's start in 2010: a grace period reaching back past it keeps the upload.
    (listed,) = client.list_multipart_uploads(Bucket=BUCKET)["Uploads"]
    age = time.time() - listed["Initiated"].timestamp()
    assert not plan_prune([store], PrunePolicy(garbage=True, grace=age + 3600)).items
    plan = plan_prune([store], PrunePolicy(garbage=True, grace=max(age - 3600, 0)))
    assert [(i.kind, i.token) for i in plan.items] == [(ItemKind.UPLOAD, up["UploadId"])]
    execute_plan(plan, [store], force=True)
    assert client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []
    store.close()


def test_tiers_get_their_own_budget(fs_store: Store, tmp_path: object) -> None:
    from neffcache.stores.local import LocalStore

    big = LocalStore(str(fs_store.url).split("://", 1)[1] + "-big")
    for store in (fs_store, big):
        for i in range(3):
            published_a(store, f"MODULE_{i}+abb26765", size=10_000)
            time.sleep(0.01)
    size = scan(fs_store).size
    plan = plan_prune([fs_store, big], PrunePolicy(max_size={fs_store.url: size // 2, big.url: size * 10},
                                                   hit_grace=0))
    assert set(plan.by_store()) == {fs_store.url}
    assert {b.store: b.met for b in plan.budgets} == {fs_store.url: True, big.url: True}
    execute_plan(plan, [fs_store, big], force=True)
    assert scan(fs_store).size <= size // 2 and len(scan(big).entries) == 3


def test_stale_locked_entry_of_an_old_toolchain_goes_whole(store: Store) -> None:
    locked = runtime_a(store, b"died-compiling", state="LOCKED")
    live = plan_prune([store], PrunePolicy(keep_compilers=(NEW,), current=NEW, stale_locks=True))
    assert not live.items and {p.path for p in live.protected} >= {locked}  # the lock is fresh
    plan = plan_prune([store], PrunePolicy(keep_compilers=(NEW,), current=NEW, stale_locks=True, lock_age=0))
    assert [(i.kind, i.path) for i in plan.items] == [(ItemKind.ENTRY, locked)]  # its lock goes with it
    result = execute_plan(plan, [store], force=True)
    assert not result.skipped and list(store.iter_files(locked)) == []
