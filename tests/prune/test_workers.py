"""How many chunks a prune runs at once (neffcache/prune/execute.py ``workers_for``): what was
asked for when asked; otherwise one on a memory filesystem, where threads only contend for the
GIL, and the default elsewhere. The count changes the speed, never what is removed."""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from neffcache.prune import PrunePolicy, execute_plan, plan_prune
from neffcache.prune import execute as execute_module
from neffcache.prune.execute import DEFAULT_WORKERS, workers_for
from neffcache.stores import local as local_module
from neffcache.stores import open_store
from neffcache.stores.local import LocalStore
from neffcache.stores.mounts import filesystem_type
from tests.prune.helpers import NEW, runtime_a


@pytest.mark.parametrize(("fstype", "expected"), [
    ("tmpfs", 1), ("ramfs", 1), ("ext4", DEFAULT_WORKERS), ("xfs", DEFAULT_WORKERS),
    ("nfs4", DEFAULT_WORKERS), ("lustre", DEFAULT_WORKERS), (None, DEFAULT_WORKERS),
])
def test_the_default_follows_the_filesystem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            fstype: str | None, expected: int) -> None:
    seen: list[object] = []

    def fake_type(path: object) -> str | None:
        seen.append(path)
        return fstype

    monkeypatch.setattr(local_module, "filesystem_type", fake_type)
    store = LocalStore(tmp_path / "cache")
    assert workers_for(store, None) == expected
    assert seen == [store.local_root]  # asked of the store's own root
    assert workers_for(store, 7) == 7  # asked for: honoured whatever the filesystem
    assert workers_for(store, 0) == 1  # never no thread at all


def test_an_object_store_keeps_the_default() -> None:
    store = open_store(f"memory://neffcache-{secrets.token_hex(6)}/cache")  # stands in for S3
    assert store.calls_wait
    assert workers_for(store, None) == DEFAULT_WORKERS


def test_a_prune_on_a_real_tmpfs_runs_one_chunk_at_a_time_and_removes_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shm = Path("/dev/shm")
    if filesystem_type(shm) != "tmpfs" or not shm.is_dir():
        pytest.skip("no tmpfs at /dev/shm on this machine: the pure cases above cover the rule")
    root = Path(tempfile.mkdtemp(dir=shm, prefix="neffcache-test-"))
    seen: list[int] = []
    monkeypatch.setattr(execute_module, "_run_store", _recording(execute_module._run_store, seen))
    try:
        store = LocalStore(root)
        for i in range(5):
            runtime_a(store, f"hlo-{i}".encode())
        kept = runtime_a(store, b"kept", version=NEW)
        plan = plan_prune([store], PrunePolicy(keep_compilers=(NEW,), current=NEW))
        result = execute_plan(plan, [store], force=True)
        assert seen == [1]
        assert len(result.removed) == 5 and not result.skipped and not result.failed
        assert (root / kept).is_dir()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _recording(run_store: Callable[..., None], seen: list[int]) -> Callable[..., None]:
    """``_run_store`` as it is, noting the thread count each store ran with."""
    def wrapper(run: Any, items: Any, workers: int, *rest: Any) -> None:
        seen.append(workers)
        run_store(run, items, workers, *rest)
    return wrapper
