"""One tree of good entries among bad names, crafted manifests and an undeletable file: push,
pull, scan, verify, verify --fix and prune (the CLI, as subprocesses) each get through it with
exactly the bad entries reported, every good one handled, and exit code 1 ("some entries
failed"; verify keeps its 5 for corrupt entries left in place)."""

from __future__ import annotations

from pathlib import Path

import pytest

from neffcache.stores.local import LocalStore
from tests.hostile.trees import (
    BAD,
    BAD_NAME_ENTRY,
    GOOD,
    build_tree,
    chattr_works,
    immutable,
    json_of,
    neffcache,
    plant_bad_names,
)


@pytest.fixture(params=["local", "shared"])
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, LocalStore, dict[str, str]]:
    shared = request.param == "shared"
    store = LocalStore(tmp_path / "src", shared=shared)
    paths = build_tree(store)
    plant_bad_names(store.root, paths)
    url = f"fsx://{store.root}" if shared else str(store.root)
    return url, store, paths


def _names(paths: dict[str, str], keys: list[str]) -> set[str]:
    return {paths[k] for k in keys}


def test_push_and_pull_copy_every_good_entry_and_report_the_bad(tree: tuple[str, LocalStore, dict[str, str]],
                                                                 tmp_path: Path) -> None:
    url, _store, paths = tree
    for verb, dst in (("push", tmp_path / "pushed"), ("pull", tmp_path / "pulled")):
        result = neffcache(verb, url, str(dst), "--json")
        assert result.returncode == 1, result.stderr[-2000:]
        report = json_of(result)
        assert set(report["copied_paths"]) == _names(paths, GOOD), report
        assert {f["path"] for f in report["failures"]} == _names(paths, BAD), report
        # Every file that is no entry's is reported and not copied (planted at the root and in an entry).
        assert set(report["foreign"]["paths"]) == {f"{paths[BAD_NAME_ENTRY]}/notes (1).txt", "notes (1).txt",
                                                   "tab\there.txt"}
        assert "Traceback" not in result.stderr
        copied = LocalStore(dst)
        assert not (dst / paths[BAD_NAME_ENTRY] / "notes (1).txt").exists()
        # The copies verify, and serve (their manifests cover model.neff and model.done).
        verified = neffcache("verify", str(copied.root), "--json")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert json_of(verified)["ok"] == len(GOOD)


def test_scan_and_verify_report_exactly_the_bad_entries(tree: tuple[str, LocalStore, dict[str, str]]) -> None:
    url, _store, paths = tree
    scanned = neffcache("scan", url, "--manifests", "--entries", "--json")
    assert scanned.returncode == 1, scanned.stderr[-2000:]
    data = json_of(scanned)
    states = {e["path"]: e["state"] for e in data["entry_list"]}
    assert {p for p, s in states.items() if s == "CORRUPT"} == _names(paths, BAD)
    assert {p for p, s in states.items() if s == "SUCCESS"} == _names(paths, GOOD)
    assert len(data["warnings"]) == len(BAD)
    problems = {e["path"]: " ".join(e["problems"]) for e in data["entry_list"]}
    assert "1e400" in problems[paths["MODULE_4+abb26765"]]
    assert "deeper" in problems[paths["MODULE_5+abb26765"]]
    assert "model.neff is not covered" in problems[paths["MODULE_6+abb26765"]]
    assert "NaN" in problems[paths["MODULE_7+abb26765"]]
    assert "not a JSON object" in problems[paths["MODULE_8+abb26765"]]

    verified = neffcache("verify", url, "--json")
    assert verified.returncode == 5, verified.stderr[-2000:]
    report = json_of(verified)
    assert report["ok"] == len(GOOD) and report["corrupt"] == len(BAD)
    assert {p["path"] for p in report["problems"]} == _names(paths, BAD)


def test_verify_fix_quarantines_the_bad_and_goes_on_past_one_it_cannot_move(
        tree: tuple[str, LocalStore, dict[str, str]], tmp_path: Path) -> None:
    if not chattr_works(tmp_path / "probe"):
        pytest.skip("needs root and a filesystem with the immutable flag (chattr +i)")
    url, store, paths = tree
    stuck = paths["MODULE_4+abb26765"]
    with immutable(store.root / stuck / "model.done"):
        fixed = neffcache("verify", url, "--fix", "--json")
    assert fixed.returncode == 5, fixed.stderr[-2000:]  # one corrupt entry could not be moved aside
    report = json_of(fixed)
    moved = {p["path"] for p in report["problems"] if p["quarantined_to"]}
    assert moved == _names(paths, BAD) - {stuck}
    left = [p for p in report["problems"] if p["path"] == stuck]
    assert left and "cannot quarantine" in left[0]["error"]
    for key in GOOD:
        assert (store.root / paths[key] / "model.done").exists()
    again = neffcache("verify", url, "--fix", "--json")
    assert again.returncode == 0, again.stdout + again.stderr


def test_prune_removes_every_entry_but_the_undeletable_one(tree: tuple[str, LocalStore, dict[str, str]],
                                                           tmp_path: Path) -> None:
    if not chattr_works(tmp_path / "probe"):
        pytest.skip("needs root and a filesystem with the immutable flag (chattr +i)")
    url, store, paths = tree
    stuck = paths["MODULE_2+abb26765"]
    with immutable(store.root / stuck / "model.hlo_module.pb"):
        pruned = neffcache("prune", "--store", url, "--keep-compiler", "current",
                           "--compiler-version", "9.9.9.9+aaaaaaaa", "--force", "--no-index",
                           "--hit-grace", "0s", "--workers", "1", "--yes", "--json")
    assert pruned.returncode == 1, pruned.stderr[-2000:]
    result = json_of(pruned)["result"]
    assert isinstance(result, dict)
    assert [f["path"] for f in result["failed"]] == [stuck]
    assert "Operation not permitted" in result["failed"][0]["why"]
    assert result["removed_entries"] == len(paths) - 1
    for key, path in paths.items():
        assert (store.root / path).exists() == (path == stuck) or key == BAD_NAME_ENTRY
    # The stuck entry reads as uncommitted (its marker went first) and a rerun can finish it.
    assert not (store.root / stuck / "model.done").exists()
