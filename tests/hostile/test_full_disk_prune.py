"""A prune frees space on a full disk (N9): the room its leases and journal need comes from the
space reserve the previous prune left (neffcache/prune/reserve.py). On a real full tmpfs, and
with an injected ENOSPC."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from neffcache.errors import NoSpace
from neffcache.manifest import FileDigest
from neffcache.prune import PrunePolicy, execute_plan, plan_prune
from neffcache.prune.reserve import RESERVE, RESERVE_BYTES
from neffcache.stores.base import FileSource
from neffcache.stores.local import LocalStore
from neffcache.testing.store_contract import publish_a
from tests.hostile.trees import neffcache

ENTRIES = 12


@contextlib.contextmanager
def _tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (the injected-ENOSPC test covers the logic): "
                    f"{mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _fill(root: Path) -> int:
    """Write a filler file until the filesystem is full; returns the bytes left (a page or less)."""
    with open(root / "filler", "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(bytes(4096))
    st = os.statvfs(root)
    return st.f_bavail * st.f_frsize


def _entries(store: LocalStore) -> list[str]:
    return [publish_a(store, key=f"MODULE_{i}+abb26765", neff=os.urandom(200_000))[0] for i in range(ENTRIES)]


@pytest.mark.parametrize("shared", [False, True])
def test_prune_frees_a_full_tmpfs(tmp_path: Path, shared: bool) -> None:
    with _tmpfs(tmp_path / "fs", "8m") as fs:
        store = LocalStore(fs / "c", shared=shared)
        paths = _entries(store)
        url = f"fsx://{store.root}" if shared else str(store.root)
        # Any prune that runs with room leaves the reserve (this one finds nothing to remove).
        first = neffcache("prune", "--store", url, "--stale-locks", "--yes")
        assert first.returncode == 0, first.stderr
        assert (store.root / RESERVE).stat().st_size == RESERVE_BYTES
        assert _fill(fs) < 64 << 10
        done = neffcache("prune", "--store", url, "--older-than", "0d", "--yes", "--force")
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"removed {ENTRIES} items ({ENTRIES} entries)" in done.stdout
        assert all(store.stat(f"{p}/model.neff") is None for p in paths)


def test_without_a_reserve_a_full_disk_prune_says_so_and_removes_nothing(tmp_path: Path) -> None:
    with _tmpfs(tmp_path / "fs", "8m") as fs:
        store = LocalStore(fs / "c")
        paths = _entries(store)
        _fill(fs)
        done = neffcache("prune", "--store", str(store.root), "--older-than", "0d", "--yes", "--force")
        assert done.returncode == 12, done.stderr
        assert "free 1024 KiB by hand" in done.stderr and "Traceback" not in done.stderr
        assert all(store.stat(f"{p}/model.neff") is not None for p in paths)


class FullUntilReleased(LocalStore):
    """A store that is "full" (every write fails with ENOSPC) while the reserve is there."""

    full = False

    def put_file(self, path: str, source: FileSource, *, exclusive: bool = False, move: bool = False,
                 expect: FileDigest | None = None) -> bool:
        if self.full and path != RESERVE and (self.root / RESERVE).exists():
            raise NoSpace(self.url, path=path, reason="No space left on device (injected)")
        return super().put_file(path, source, exclusive=exclusive, move=move, expect=expect)


@pytest.mark.parametrize("shared", [False, True])
def test_an_injected_enospc_releases_the_reserve_and_the_prune_goes_on(tmp_path: Path, shared: bool) -> None:
    store = FullUntilReleased(tmp_path / "c", shared=shared)
    paths = _entries(store)[:4]
    warmup = plan_prune([store], PrunePolicy(stale_locks=True))
    execute_plan(warmup, [store])
    assert (store.root / RESERVE).exists()  # left by the prune that had room
    store.full = True
    plan = plan_prune([store], PrunePolicy(older_than=0.0))
    result = execute_plan(plan, [store], force=True)
    assert not result.failed and len(result.removed) == ENTRIES
    assert all(store.stat(f"{p}/model.neff") is None for p in paths)
    store.full = False
    assert (store.root / RESERVE).exists()  # made again from the space the prune freed
