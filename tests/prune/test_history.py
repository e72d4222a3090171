"""The action journal (`prune --history`) and the retention of quarantine and warm logs (issue #13)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from neffcache.application.warm_logs import expired_runs
from neffcache.coordination.history import HISTORY_DIR, MAX_ITEMS, ActionItem, read_history, record
from neffcache.operations.verify import QUARANTINE_DIR, quarantine
from neffcache.prune import PrunePolicy, Reason, execute_plan, plan_prune
from neffcache.scan.report import load_entry, scan
from neffcache.stores import open_store
from neffcache.stores.base import Store
from tests.prune.helpers import NEW, TC_NEW, TC_OLD, future, published_a
from tests.prune.test_cli import run_cli


def _cli_env(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    if store.scheme == "s3":
        monkeypatch.setenv("AWS_ENDPOINT_URL", store.endpoint)  # type: ignore[attr-defined]


def test_history_shows_prune_and_verify_fix(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    _cli_env(store, monkeypatch)
    old = [published_a(store, f"MODULE_o{i}+abb26765", TC_OLD, size=512) for i in range(2)]
    new = [published_a(store, f"MODULE_n{i}+abb26765", TC_NEW, size=4096) for i in range(3)]
    pruned = run_cli("prune", "--store", store.url, "--keep-compiler", "current", "--compiler-version", NEW,
                     "--no-index", "--yes")
    assert pruned.returncode == 0, pruned.stderr
    store.put_file(f"{new[0]}/model.neff", b"NEFF-bitrot" + bytes(4096))  # no longer what the manifest says
    fixed = run_cli("verify", store.url, "--fix")
    assert fixed.returncode == 0, fixed.stderr

    listed = run_cli("prune", "--store", store.url, "--history", "--json")
    assert listed.returncode == 0, listed.stderr
    actions = json.loads(listed.stdout)["actions"]
    assert [a["kind"] for a in actions] == ["quarantine", "prune"]  # newest first
    q, p = actions
    user_host = f"@{os.uname().nodename}"
    for a in actions:
        assert a["who"].endswith(user_host) and a["pid"] > 0 and a["store"] == store.url
        assert time.time() - a["at"] < 600
    assert p["command"].startswith("neffcache prune --store") and "--keep-compiler current" in p["command"]
    assert p["why"] == f"--keep-compiler {NEW}"
    assert sorted(i["path"] for i in p["items"]) == sorted(old) and p["counts"]["compiler"]["items"] == 2
    assert all(i["reason"] == "compiler" and i["bytes"] > 0 and "not kept" in i["detail"] for i in p["items"])
    assert p["details"]["plan"] and p["details"]["forced"] == []
    assert q["command"].startswith("neffcache verify") and "--fix" in q["command"]
    assert [i["path"] for i in q["items"]] == [new[0]]
    assert "moved to .neffcache/quarantine/" in q["items"][0]["detail"] and "manifest" in q["items"][0]["detail"]

    text = run_cli("prune", "--store", store.url, "--history", "--since", "1h")
    assert text.returncode == 0
    assert f"prune {store.url} by " in text.stdout and "quarantine" in text.stdout and old[0] in text.stdout
    none = json.loads(run_cli("prune", "--store", store.url, "--history", "--since", "0s", "--json").stdout)
    assert none["actions"] == []
    # The journal is control data: not garbage, not foreign, never pruned by --garbage.
    report = scan(store)
    assert report.foreign == () and report.garbage == ()
    plan = plan_prune([store], PrunePolicy(garbage=True, stale_locks=True, grace=0), now=future(1))
    assert not [i for i in plan.items if i.path.startswith(HISTORY_DIR)]
    assert run_cli("prune", "--store", store.url, "--history", "--garbage").returncode == 2


def test_a_large_action_is_split_into_bounded_records(fs_store: Store) -> None:
    items = [ActionItem(f"ns/MODULE_{i}+0", "age", 10, "old") for i in range(MAX_ITEMS * 2 + 3)]
    action = record(fs_store, "prune", "--older-than 30d", items, command="neffcache prune")
    files = list(fs_store.iter_files(HISTORY_DIR))
    assert len(files) == 3 and all(f.size < 200 * MAX_ITEMS for f in files)
    [back] = read_history(fs_store)
    assert back.id == action.id and back.items == tuple(items) and back.total == len(items)
    fs_store.put_file(f"{HISTORY_DIR}/20990101T000000.000000Z-prune-x-1.json", b"not json")
    warnings: list[str] = []
    assert len(read_history(fs_store, warnings=warnings)) == 1 and "not a readable action record" in warnings[0]


def test_quarantine_retention_removes_only_expired_quarantine(store: Store) -> None:
    paths = [published_a(store, f"MODULE_q{i}+abb26765", TC_NEW) for i in range(3)]
    entries = [load_entry(store, p) for p in paths]
    assert all(e is not None for e in entries)
    quarantine(store, entries[0], stamp="20000101T000000Z")  # long ago (UTC)
    local_stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime(time.time() - 40 * 86400))  # an older name form
    quarantine(store, entries[1], stamp=local_stamp)
    quarantine(store, entries[2])  # now
    plan = plan_prune([store], PrunePolicy(garbage=True, grace=0))
    expired = [i for i in plan.items if i.reason is Reason.QUARANTINE_EXPIRED]
    assert expired and plan.guards == ()
    assert {i.path.split("/")[2] for i in expired} == {"20000101T000000Z", local_stamp}
    execute_plan(plan, [store])
    left = {f.path.split("/")[2] for f in store.iter_files(QUARANTINE_DIR)}
    assert len(left) == 1 and left.pop().endswith("Z")  # the one quarantined just now stays
    assert scan(store).entries == ()
    kinds = [a.kind for a in read_history(store)]
    assert kinds.count("quarantine") == 3 and kinds[0] == "prune"  # each quarantine and the prune journalled
    # quarantine_days is a setting: 0 lets the last one go too.
    assert any(i.reason is Reason.QUARANTINE_EXPIRED
               for i in plan_prune([store], PrunePolicy(garbage=True, quarantine_days=0), now=future(0.01)).items)


def test_history_retention(fs_store: Store) -> None:
    record(fs_store, "prune", "old", [ActionItem("a", "age", 1)], at=time.time() - 400 * 86400)
    record(fs_store, "prune", "recent", [ActionItem("b", "age", 1)])
    plan = plan_prune([fs_store], PrunePolicy(garbage=True))
    assert [i.reason for i in plan.items] == [Reason.HISTORY_EXPIRED]
    execute_plan(plan, [fs_store])
    assert [a.why for a in read_history(fs_store)] == ["--garbage", "recent"]


def _run_dir(home: Path, name: str, age_days: float) -> Path:
    run = home / name
    run.mkdir(parents=True)
    (run / "bucket-0.log").write_text("compile log\n")
    when = time.time() - age_days * 86400
    for p in (run / "bucket-0.log", run):
        os.utime(p, (when, when))
    return run


def test_warm_log_retention(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = Path(os.environ["XDG_CACHE_HOME"]) / "neffcache" / "warm-logs"
    old = _run_dir(home, "20200101-000000-123", 30)
    recent = _run_dir(home, "20200102-000000-456", 2)
    theirs = _run_dir(home, "notes", 30)  # not a name warm gives its runs: never touched
    store = tmp_path / "c"
    published_a(open_store(str(store)), "MODULE_1+abb26765")
    dry = run_cli("prune", "--store", str(store), "--garbage")
    assert dry.returncode == 0 and "warm logs: would remove 1 run" in dry.stdout and old.exists()
    done = run_cli("prune", "--store", str(store), "--garbage", "--yes", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["warm_logs"]["removed"] == 1
    assert not old.exists() and recent.exists() and theirs.exists()
    # warm_log_days is a setting (warm applies the same expired_runs when it starts).
    monkeypatch.setenv("NEFFCACHE_WARM_LOG_DAYS", "1")
    assert "warm logs: would remove 1 run" in run_cli("prune", "--store", str(store), "--garbage").stdout
    assert [r.path for r in expired_runs(home, 1)] == [recent]
