"""Prune and reconcile with the index server (SQLite, uvicorn on 127.0.0.1): evict events, last
hits from the index, plans from the index's rows, and the catalog compared with the stores."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from neffcache.cli.main import cli
from neffcache.errors import ConfigError, RefusedPlan
from neffcache.index import IndexClient, open_index
from neffcache.index.records import entry_record
from neffcache.prune import PrunePolicy, Reason, execute_plan, plan_prune
from neffcache.replication.reconcile import plan_reconcile
from neffcache.scan.report import load_entry, scan
from neffcache.stores.local import LocalStore
from tests.prune.helpers import NEW, TC_OLD, published_a, runtime_a
from tests.prune.test_cli import run_cli
from tests.server.conftest import LiveServer, Tokens, make_tokens

pytestmark = pytest.mark.slow


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[LiveServer, Tokens]]:
    from neffcache.server.config import ServerSettings

    settings = ServerSettings(data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path / 'index.db'}",
                        admin_token="admin-secret-for-lifecycle-tests", token_cache_seconds=0.0)
    with LiveServer(settings) as server:
        yield server, make_tokens(server.db)


@pytest.fixture
def index(live: tuple[LiveServer, Tokens], tmp_path: Path) -> Iterator[IndexClient]:
    server, tokens = live
    client = open_index(server.url, tokens.write, spool_root=tmp_path / "spool")
    assert isinstance(client, IndexClient)
    yield client
    client.close()


def register(index: IndexClient, store: LocalStore, *paths: str, state: str | None = None) -> None:
    records = []
    for path in paths:
        entry = load_entry(store, path)
        assert entry is not None
        record = entry_record(entry, store.url, entry.manifest)
        if state:
            record["state"] = state  # type: ignore[typeddict-item]
        records.append(record)
    index.register_entries(records)
    assert index.flush().error is None


def age(store: LocalStore, path: str, days: float) -> None:
    when = time.time() - days * 86400
    for info in store.iter_files(path):
        os.utime(store.root / info.path, (when, when))


def test_prune_reports_evictions_to_the_index(index: IndexClient, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "c")
    old = published_a(store, "MODULE_1+abb26765", TC_OLD)
    new = published_a(store, "MODULE_1+abb26765")
    register(index, store, old, new)
    plan = plan_prune([store], PrunePolicy(keep_compilers=(NEW,), current=NEW), index=index)
    assert [i.path for i in plan.items] == [old]
    execute_plan(plan, [store], index=index, force=True)
    assert index.lookup(old) is None  # its only location was evicted: the record went with it
    found = index.lookup(new)
    assert found is not None and found["stores"] == [store.url]


def test_age_counts_hits_the_index_recorded(index: IndexClient, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "c")
    hit = published_a(store, "MODULE_1+abb26765")
    cold = published_a(store, "MODULE_2+abb26765")
    for path in (hit, cold):
        age(store, path, 60)
    register(index, store, hit, cold)
    index.record("hit", path=hit, store=store.url, ts=time.time() - 86400)
    assert index.flush().error is None
    plan = plan_prune([store], PrunePolicy(older_than=30 * 86400), index=index)
    assert [(i.path, i.basis.value if i.basis else None) for i in plan.items] == [(cold, "created")]
    without = plan_prune([store], PrunePolicy(older_than=30 * 86400))
    assert {i.path for i in without.items} == {hit, cold}  # no index: only the files' dates
    assert [i.path for i in execute_plan(plan, [store], index=index, force=True).removed] == [cold]


def test_plan_from_the_index_rows(index: IndexClient, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "c")
    old = [published_a(store, f"MODULE_{i}+abb26765", TC_OLD) for i in range(3)]
    register(index, store, *old)
    store.delete([f.path for f in store.iter_files(old[2])])  # the index does not know yet
    plan = plan_prune([store], PrunePolicy(keep_compilers=(NEW,), current=NEW), index=index, source="index")
    # Each row is checked against the store: the one it no longer holds is a note, not an item,
    # and the items carry the store's own listing (re-checked file by file at execution).
    assert sorted(i.path for i in plan.items) == sorted(old[:2]) and all(i.files for i in plan.items)
    assert any("1 index records name entries not in the store" in n for n in plan.notes), plan.notes
    result = execute_plan(plan, [store], index=index, force=True)
    assert sorted(i.path for i in result.removed) == sorted(old[:2]) and result.skipped == ()
    assert scan(store).entries == ()
    with pytest.raises(Exception, match="need a listing"):
        plan_prune([store], PrunePolicy(garbage=True), index=index, source="index")


def test_reconcile_both_directions(index: IndexClient, live: tuple[LiveServer, Tokens], tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "c")
    known = published_a(store, "MODULE_1+abb26765")
    unknown = runtime_a(store, b"written-by-a-runtime", version=NEW)
    lost = published_a(store, "MODULE_2+abb26765")
    wrong = published_a(store, "MODULE_3+abb26765")
    register(index, store, known, lost)
    register(index, store, wrong, state="FAILED")
    store.delete([f.path for f in store.iter_files(lost)])  # removed by hand: the index never heard
    plan = plan_reconcile([store], index)
    assert [m.path for m in plan.missing_in_store] == [lost]
    assert [m.path for m in plan.missing_in_index] == [unknown]
    assert [m.path for m in plan.differ] == [wrong]
    assert plan.matched == 1 and plan.fixes == 3
    assert plan_reconcile([store], index, fix="forget").to_register == ()
    applied = plan.execute(index)
    assert (applied.forgotten, applied.registered, applied.errors) == (1, 2, ())
    again = plan_reconcile([store], index)
    assert again.fixes == 0 and again.matched == 3

    # The command: a report without --yes, the same fixes with it.
    server, tokens = live
    store.delete([f.path for f in store.iter_files(known)])
    env = {"NEFFCACHE_INDEX_URL": server.url, "NEFFCACHE_TOKEN": tokens.write,
           "NEFFCACHE_SPOOL_DIR": str(tmp_path / "spool2")}
    runner = CliRunner(env=env)
    report = runner.invoke(cli, ["reconcile", "--store", str(store.root), "--json"], catch_exceptions=False)
    assert report.exit_code == 0, report.output
    data = json.loads(report.output)
    assert [m["path"] for m in data["plan"]["missing_in_store"]] == [known] and data["applied"] is None
    text = runner.invoke(cli, ["reconcile", "--store", str(store.root), "--yes"], catch_exceptions=False)
    assert text.exit_code == 0 and "1 record forgotten" in text.output
    assert index.lookup(known) is None


def test_reconcile_needs_the_index(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["reconcile", "--store", str(tmp_path)])
    assert isinstance(result.exception, ConfigError) and "NEFFCACHE_INDEX_URL" in str(result.exception)


def test_interrupted_reason_stays_visible_in_json(index: IndexClient, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "c")
    path = runtime_a(store, b"g", version=NEW, state="FAILED")
    plan = plan_prune([store], PrunePolicy(failed=True), index=index)
    assert plan.to_json()["by_reason"] == {Reason.FAILED.value: {"items": 1, "bytes": plan.expected_freed_size}}
    assert [i.path for i in execute_plan(plan, [store], index=index, force=True).removed] == [path]


def test_reconcile_refuses_to_forget_a_store_that_is_not_there(index: IndexClient, tmp_path: Path) -> None:
    """An FSx mount that did not come up is an empty directory: reconcile must not forget every
    record of it (the index would then tell every job its NEFFs are gone)."""
    store = LocalStore(tmp_path / "mnt")
    paths = [published_a(store, f"MODULE_{i}+abb26765") for i in range(1, 4)]
    register(index, store, *paths)
    os.rename(tmp_path / "mnt", tmp_path / "mnt.real")  # the mount is gone; the path is an empty dir
    (tmp_path / "mnt").mkdir()
    plan = plan_reconcile([store], index)
    assert len(plan.missing_in_store) == 3 and len(plan.guards) == 1
    assert "holds no entry while the index lists 3" in plan.guards[0]
    with pytest.raises(RefusedPlan, match="Nothing was changed"):
        plan.execute(index, journal=[store])
    assert all(index.lookup(p) is not None for p in paths), "a refused plan forgot records"

    env = {"NEFFCACHE_INDEX_URL": str(index.url), "NEFFCACHE_TOKEN": _token(index),
           "NEFFCACHE_SPOOL_DIR": str(tmp_path / "spool-cli")}
    refused = run_cli("reconcile", "--store", str(store.root), "--yes", env={**os.environ, **env})
    assert refused.returncode == 9, refused.stderr
    assert "unmounted store or a wrong URL" in refused.stderr.strip().splitlines()[-1]
    assert all(index.lookup(p) is not None for p in paths)
    runner = CliRunner(env=env)
    forced = runner.invoke(cli, ["reconcile", "--store", str(store.root), "--yes", "--force"],
                           catch_exceptions=False)
    assert forced.exit_code == 0, forced.output
    assert all(index.lookup(p) is None for p in paths)
    history = runner.invoke(cli, ["prune", "--history", "--store", str(store.root), "--json"],
                            catch_exceptions=False)
    actions = json.loads(history.output)["actions"]
    assert [(a["kind"], a["items_total"], a["details"]["forced"]) for a in actions] == [("reconcile", 3, True)]
    assert sorted(i["path"] for i in actions[0]["items"]) == sorted(paths)


def test_reconcile_forgetting_more_than_the_share_needs_force(index: IndexClient, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "c")
    paths = [published_a(store, f"MODULE_{i}+abb26765") for i in range(1, 5)]
    register(index, store, *paths)
    for path in paths[:3]:  # three of four removed by hand
        store.delete([f.path for f in store.iter_files(path)])
    plan = plan_reconcile([store], index)
    assert plan.guards and "3 of the 4 records" in plan.guards[0]
    with pytest.raises(RefusedPlan):
        plan.execute(index)
    assert plan_reconcile([store], index, max_share=0.8).guards == ()
    # Registering alone never loses anything: not refused.
    assert plan_reconcile([store], index, fix="register").execute(index).forgotten == 0
    assert plan.execute(index, force=True).forgotten == 3


def _token(index: IndexClient) -> str:
    header = index._http.headers["Authorization"]
    return header.removeprefix("Bearer ")
