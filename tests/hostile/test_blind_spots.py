"""What verify did not see, and what verify --fix did not do (issue 41 N3, N7): a namespace or
top-level directory the listing would not enter is a reported problem and a non-zero exit,
never "0 ok, 0 corrupt"; an entry whose directory cannot be moved is "cannot quarantine",
with no journal record and no evict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from neffcache.coordination.history import HISTORY_DIR
from neffcache.stores.local import LocalStore
from neffcache.testing.store_contract import publish_a
from tests.hostile.trees import json_of, neffcache


def _nodac(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "tests.hostile.nodac", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "NEFFCACHE_INDEX_URL": ""})
    if done.returncode == 99:
        pytest.skip("cannot drop CAP_DAC_OVERRIDE here (capset refused)")
    assert "Traceback" not in done.stderr, done.stderr
    return done


def _attacker_tree(tmp_path: Path) -> LocalStore:
    evil = LocalStore(tmp_path / "evil")
    publish_a(evil, key="MODULE_9+abb26765")
    return evil


@pytest.mark.parametrize("level", ["namespace", "top"])
def test_verify_of_a_symlinked_namespace_is_not_all_ok(tmp_path: Path, level: str) -> None:
    store = LocalStore(tmp_path / "c")
    path, _ = publish_a(store, key="MODULE_1+abb26765")
    evil = _attacker_tree(tmp_path)
    parts = path.split("/")
    rel = "/".join(parts[:2] if level == "namespace" else parts[:1])
    (store.root / rel).rename(tmp_path / "moved-away")
    (store.root / rel).symlink_to(evil.root / rel)
    for args in (("verify", str(store.root)), ("verify", str(store.root), "--fix")):
        text = neffcache(*args)
        assert text.returncode == 1, text.stdout + text.stderr
        assert f"NOT CHECKED {rel}: a symlink pointing outside the root" in text.stdout, text.stdout
        assert "Traceback" not in text.stderr
    data = json_of(neffcache("verify", str(store.root), "--json"))
    assert data["ok"] == 0 and [p.split(":")[0] for p in data["listing_problems"]] == [rel]
    assert (evil.root / path.replace("MODULE_1", "MODULE_9")).is_dir() and not (store.root / HISTORY_DIR).exists()


def test_verify_of_an_unreadable_namespace_is_not_all_ok(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "c")
    path, _ = publish_a(store, key="MODULE_1+abb26765")
    namespace = store.root / path.rsplit("/", 1)[0]
    namespace.chmod(0)
    try:
        done = _nodac("verify", str(store.root), "--json")
        assert done.returncode == 1, done.stdout + done.stderr
        problems = json.loads(done.stdout)["listing_problems"]
        assert len(problems) == 1 and "unreadable directory" in problems[0], problems
    finally:
        namespace.chmod(0o755)


def test_verify_fix_does_not_claim_to_quarantine_what_it_cannot_move(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "c")
    good, _ = publish_a(store, key="MODULE_0+abb26765")
    linked, _ = publish_a(store, key="MODULE_1+abb26765")
    locked, _ = publish_a(store, key="MODULE_2+abb26765")
    (store.root / linked).rename(tmp_path / "outside")
    (store.root / linked).symlink_to(tmp_path / "outside")
    (store.root / locked).chmod(0)
    try:
        done = _nodac("verify", str(store.root), "--fix", "--json")
    finally:
        (store.root / locked).chmod(0o755)
    assert done.returncode == 5, done.stdout + done.stderr  # corrupt entries remain
    report = json.loads(done.stdout)
    by_path = {p["path"]: p for p in report["problems"]}
    assert set(by_path) == {linked, locked}
    for path in (linked, locked):
        assert by_path[path]["quarantined_to"] is None
        assert by_path[path]["error"].startswith("cannot quarantine"), by_path[path]
    assert "quarantined " not in done.stderr
    assert not (store.root / HISTORY_DIR).exists(), "journaled a quarantine that did not happen"
    assert (store.root / linked).is_symlink() and (store.root / locked).is_dir() and (store.root / good).is_dir()
