"""Linear time in the foreign files of one directory (N12) and bounded memory in directory
depth (N13). Outcomes are asserted here (and operation counts, which do not depend on the
machine's speed); the time against ``find`` is measured by bench/bench_hostile_tree.py."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.hostile_tree_bench import wide_entry
from neffcache.entry import FileInfo
from neffcache.layouts import get_layout
from neffcache.operations.verify import CheckStatus, verify
from neffcache.prune import PrunePolicy, execute_plan, plan_prune
from neffcache.replication.sync import sync
from neffcache.scan.grouping import own_files
from neffcache.scan.report import scan
from neffcache.stores.local import LocalStore
from neffcache.stores.local_listing import MAX_DEPTH
from neffcache.testing.store_contract import publish_a

REPO = Path(__file__).resolve().parents[2]
WIDE = 80_000
DEEP = 20_000


class CountedName(str):
    """A file name that counts the comparisons made with it."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        CountedName.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_own_files_compares_each_foreign_name_a_bounded_number_of_times(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "c")
    path, _ = publish_a(store, key="MODULE_1+abb26765")
    entry = scan(store).entries[0]
    counted = tuple(CountedName(f"notes_{i}.txt") for i in range(2000))
    raw = dataclasses.replace(entry, files={**entry.files, **{n: FileInfo(f"{path}/{n}", 0, 0.0) for n in counted}},
                              extra=counted)
    CountedName.compared = 0
    mine, foreign = own_files(get_layout(entry.layout), raw)
    assert mine is not None and sorted(mine.files) == sorted(entry.files) and len(foreign) == 2000
    assert CountedName.compared < 10 * len(counted)  # a tuple's `in` made it ~n²/2 (2 million here)


@pytest.mark.timeout(600)  # a hang guard: the assertions are on outcomes
def test_80k_foreign_files_in_one_entry_directory(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "c")
    path = wide_entry(store, WIDE)
    report = scan(store)
    assert [e.path for e in report.entries] == [path] and len(report.foreign) == WIDE
    assert [c.status for c in verify(store).checks] == [CheckStatus.OK]
    pushed = sync(store, LocalStore(tmp_path / "dst"))
    assert len(pushed.copied) == 1 and len(pushed.foreign) == WIDE
    assert not any((tmp_path / "dst" / path).glob("notes_*"))  # foreign files are never copied
    result = execute_plan(plan_prune([store], PrunePolicy(older_than=0.0)), [store], force=True)
    assert [i.path for i in result.removed] == [path]
    assert len(os.listdir(store.root / path)) == WIDE  # ...nor removed


_DEEP_SCRIPT = """
import json, os, resource, sys, tracemalloc
from neffcache.stores.local import LocalStore
from neffcache.stores.local_listing import MAX_DEPTH
from neffcache.scan.report import scan
from neffcache.testing.store_contract import publish_a
from bench.hostile_tree_bench import deep_chain
root, depth, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
store = LocalStore(root, list_workers=workers)
publish_a(store, key="MODULE_1+abb26765")
deep_chain(root, depth)
tracemalloc.start()
report = scan(store)
peak = tracemalloc.get_traced_memory()[1]
print(json.dumps({"entries": len(report.entries), "warnings": [w[-120:] for w in report.warnings], "peak": peak}))
"""


@pytest.mark.parametrize(("native", "workers"), [("1", 1), ("0", 1), ("1", 4)])  # C walk, Python walk, threads
def test_a_20k_deep_chain_is_reported_in_bounded_memory(tmp_path: Path, native: str, workers: int) -> None:
    try:
        done = subprocess.run([sys.executable, "-c", _DEEP_SCRIPT, str(tmp_path / "c"), str(DEEP), str(workers)],
                              capture_output=True, text=True, timeout=600, cwd=REPO,
                              env={**os.environ, "NEFFCACHE_NATIVE": native})
    finally:  # rm -rf: pytest's own cleanup (shutil.rmtree) recurses once per level and overflows
        subprocess.run(["rm", "-rf", str(tmp_path / "c")], check=True)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    assert got["entries"] == 1
    assert len(got["warnings"]) == 1 and got["warnings"][0].endswith(f"nested more than {MAX_DEPTH} directories "
                                                                      "deep (not listed)")
    # Paths of at most MAX_DEPTH levels: a few hundred kB. Before, 1.77 GB (quadratic in depth).
    assert got["peak"] < 64 << 20, got["peak"]
