"""A local store's prune chunk reads and removes through directory descriptors held for the
chunk (neffcache/stores/local_remove.py): the containment rules hold through them, and layout
B's shard trees leave no empty directory behind."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from neffcache.prune import PrunePolicy, execute_plan, plan_prune
from neffcache.stores.base import Store
from tests.prune.helpers import NEW, OLD, runtime_a


def _torchneuron(store: Store, version: str, count: int) -> list[str]:
    """Layout-B entries as TorchNeuron writes them (32-hex keys, NEFF and HLO shard trees)."""
    paths = []
    for i in range(count):
        key = hashlib.md5(f"{version}-{i}".encode()).hexdigest()  # a name, not a digest
        ns = f"trn2-lnc2/torchneuron-{version}"
        store.put_file(f"{ns}/hlo/{key[:2]}/{key[2:4]}/{key}.hlo", b"HLO" + key.encode())
        store.put_file(f"{ns}/neff/{key[:2]}/{key[2:4]}/{key}.neff", b"NEFF" + key.encode())
        paths.append(f"{ns}/neff/{key[:2]}/{key[2:4]}/{key}")
    return paths


def test_layout_b_prune_leaves_no_empty_shard_directory(fs_store: Store) -> None:
    root = fs_store.local_root
    assert root is not None
    _torchneuron(fs_store, OLD, 40)
    kept = _torchneuron(fs_store, NEW, 3)
    plan = plan_prune([fs_store], PrunePolicy(keep_compilers=(NEW,), current=NEW))
    assert plan.entries == 40
    result = execute_plan(plan, [fs_store], force=True)
    assert len(result.removed) == 40 and not result.skipped and not result.failed
    assert not (root / f"trn2-lnc2/torchneuron-{OLD}").exists()
    for path in kept:
        assert (root / f"{path}.neff").is_file()
        key = path.rpartition("/")[2]
        assert (root / f"trn2-lnc2/torchneuron-{NEW}/hlo/{key[:2]}/{key[2:4]}/{key}.hlo").is_file()


def test_an_entry_directory_swapped_for_a_link_after_the_plan_is_not_followed(fs_store: Store,
                                                                              tmp_path: Path) -> None:
    root = fs_store.local_root
    assert root is not None
    entries = [runtime_a(fs_store, os.urandom(64)) for _ in range(3)]
    runtime_a(fs_store, os.urandom(64), version=NEW)
    plan = plan_prune([fs_store], PrunePolicy(keep_compilers=(NEW,), current=NEW))
    assert plan.entries == 3
    # Between plan and execution, one entry directory becomes a link to a look-alike outside
    # the root: nothing outside may go, and the other entries are removed all the same.
    outside = tmp_path / "outside"
    (root / entries[0]).rename(outside)
    (root / entries[0]).symlink_to(outside)
    before = sorted(p.name for p in outside.iterdir())
    result = execute_plan(plan, [fs_store], force=True)
    assert sorted(p.name for p in outside.iterdir()) == before
    assert {i.path for i in result.removed} == set(entries[1:])
    assert {k.path for k in (*result.skipped, *result.failed)} == {entries[0]}
    assert (root / entries[0]).is_symlink()
