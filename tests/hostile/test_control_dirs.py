"""Control directories that are unreadable or symlinks, and a namespace swapped for a symlink
mid-run (issue 41 N11): each is the problem of the items it concerns — retried once, reported —
never the end of a prune, verify --fix or scan --manifests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

from neffcache.coordination.lease import lease_path
from neffcache.coordination.write_leases import prune_group_lease, publish_lease_name
from neffcache.entry import EntryState
from neffcache.operations.verify import CheckStatus, verify
from neffcache.scan.report import scan
from neffcache.stores.local import LocalStore
from neffcache.testing.store_contract import publish_a
from tests.hostile.trees import neffcache


def _store(tmp_path: Path, n: int = 3) -> tuple[LocalStore, list[str]]:
    store = LocalStore(tmp_path / "c")
    return store, [publish_a(store, key=f"MODULE_{i}+abb26765")[0] for i in range(n)]


def _left(store: LocalStore, paths: list[str]) -> set[str]:
    return {p for p in paths if (store.root / p).is_dir()}


def test_an_unreadable_lease_shard_fails_only_its_entries(tmp_path: Path) -> None:
    store, paths = _store(tmp_path)
    victim = paths[0]
    shards = {lease_path(name).split("/")[2] for name in (prune_group_lease(victim), publish_lease_name(victim))}
    others = {lease_path(n).split("/")[2] for p in paths[1:] for n in (prune_group_lease(p), publish_lease_name(p))}
    assert not shards & others, "pick entries whose leases live in other shards"
    for shard in shards:
        (store.root / ".neffcache" / "leases" / shard).mkdir(parents=True, exist_ok=True)
        (store.root / ".neffcache" / "leases" / shard).chmod(0)
    try:
        done = subprocess.run([sys.executable, "-m", "tests.hostile.nodac", "prune", "--store", str(store.root),
                               "--max-size", "1", "--yes", "--force"], capture_output=True, text=True, timeout=120)
    finally:
        for shard in shards:
            (store.root / ".neffcache" / "leases" / shard).chmod(0o755)
    if done.returncode == 99:
        pytest.skip("cannot drop CAP_DAC_OVERRIDE here (capset refused)")
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stdout + done.stderr  # some items failed; the rest removed
    assert f"FAILED {victim}" in done.stdout
    assert _left(store, paths) == {victim}


@pytest.mark.parametrize("planted", ["stamps", "staging", "leases", "prune", "history", "quarantine"])
def test_a_symlinked_control_directory_is_reported_not_fatal(tmp_path: Path, planted: str) -> None:
    store, paths = _store(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (store.root / ".neffcache").mkdir(exist_ok=True)
    link = store.root / ".neffcache" / planted
    if link.exists():
        os.rename(link, tmp_path / "was")
    link.symlink_to(elsewhere)
    for args in (("--garbage", "--grace", "0s"), ("--max-size", "1", "--force")):
        done = neffcache("prune", "--store", str(store.root), *args, "--yes")
        assert "Traceback" not in done.stderr, done.stderr
        assert done.returncode in (0, 1), done.stdout + done.stderr
        assert f".neffcache/{planted}" in done.stdout + done.stderr
    # Entries go where the coordination files they need can be written and read; where the
    # leases, the crash journal or the stamps cannot, each entry fails and stays.
    assert _left(store, paths) == (set(paths) if planted in ("leases", "prune", "stamps") else set())
    assert list(elsewhere.iterdir()) == []
    assert link.is_symlink()


class _Swapping(LocalStore):
    """A store whose namespace directory is swapped for a symlink out of the root while a
    manifest is opened (``times`` opens; None: every one), and swapped back after."""

    def __init__(self, root: Path, namespace: str, outside: Path, times: int | None) -> None:
        super().__init__(root)
        self.namespace, self.outside, self.times = namespace, outside, times
        self.lock = threading.Lock()  # the scan reads manifests in threads: one swap at a time

    @contextlib.contextmanager
    def open_read(self, path: str) -> Iterator[BinaryIO]:
        with self.lock:
            swap = path.endswith("neffcache.json") and (self.times is None or self.times > 0)
            if swap:
                if self.times is not None:
                    self.times -= 1
                real = self.root / self.namespace
                aside = real.with_name(real.name + ".aside")
                os.rename(real, aside)
                real.symlink_to(self.outside)
                try:
                    with super().open_read(path) as stream:
                        yield stream
                finally:
                    real.unlink()
                    os.rename(aside, real)
        if swap:
            return
        with super().open_read(path) as stream:
            yield stream


def test_a_namespace_swapped_for_a_symlink_for_a_moment_is_read_again(tmp_path: Path) -> None:
    store, paths = _store(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    namespace = paths[0].rsplit("/", 1)[0]
    brief = _Swapping(store.root, namespace, outside, times=1)
    report = scan(brief, read_manifests=True)
    assert [e.state for e in report.entries] == [EntryState.SUCCESS] * 3
    brief.times = 1
    checked = verify(brief, fix=True, workers=1)
    assert checked.count(CheckStatus.OK) == 3 and not checked.failed


def test_a_namespace_swapped_for_good_is_one_entry_problem_each(tmp_path: Path) -> None:
    store, paths = _store(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    swapped = _Swapping(store.root, paths[0].rsplit("/", 1)[0], outside, times=None)
    report = scan(swapped, read_manifests=True)
    assert len(report.entries) == 3 and all("cannot read its manifest" in " ".join(e.problems)
                                            for e in report.entries)
    checked = verify(swapped, fix=True, workers=1)
    assert checked.count(CheckStatus.FAILED) == 3 and not checked.corrupt
    assert not (store.root / ".neffcache" / "quarantine").exists()
    assert _left(store, paths) == set(paths)
