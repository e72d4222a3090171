"""The runtime's compile lock as neffcache holds it: exclusive, flocked while held, always released."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from neffcache.prune.sweep import held_file_locks
from neffcache.warmers.runtime_lock import RuntimeLock, lock_age


def test_exclusive_visible_to_prune_and_released(tmp_path: Path) -> None:
    path = tmp_path / "ns" / "MODULE_1+a" / "model.hlo_module.pb.lock"
    held = RuntimeLock.acquire(path)
    assert held is not None and path.exists() and path.stat().st_size == 0  # the runtime's own form
    assert RuntimeLock.acquire(path) is None  # a second compiler waits instead
    st = path.stat()
    assert (st.st_dev, st.st_ino) in held_file_locks()  # prune's stale-lock rule sees a live holder
    age = lock_age(path)
    assert age is not None and age < 60
    held.release()
    held.release()  # idempotent
    assert not path.exists() and lock_age(path) is None


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt, SystemExit])
def test_released_on_every_exit(tmp_path: Path, exc: type[BaseException]) -> None:
    path = tmp_path / "model.hlo_module.pb.lock"
    with pytest.raises(exc), RuntimeLock.acquire(path) or pytest.fail("not acquired"):
        raise exc()
    assert not path.exists()
    assert RuntimeLock.acquire(path) is not None


def test_a_runtime_lock_already_there_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "model.hlo_module.pb.lock"
    path.touch()
    before = os.stat(path).st_ino
    assert RuntimeLock.acquire(path) is None
    assert os.stat(path).st_ino == before
