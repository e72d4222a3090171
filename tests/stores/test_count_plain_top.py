"""The largest entries of a count of plain shards (``count_plain``'s ``top``, neffcache/stores/
_listdir.c) are the ones listing the same directories in Python finds: the same entries, bytes
and files, in the same total order, ties and all; a declined child gives none. And two threads
counting at once (the sort runs without the GIL) count what each counts alone."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from neffcache.scan.grouping import Grouper
from neffcache.stores import local_in_step, local_listing
from neffcache.stores.plain import CountedTop, PlainEntryDirs, PlainFiles
from neffcache.stores.safepath import SafeRoot
from neffcache.stores.walk import Counted, InStep
from tests.stores.c_helper import needs_native
from tests.stores.test_count_plain import NS
from tests.stores.test_count_plain import _make as make_layout_b

native = local_listing.native
pytestmark = needs_native

# Three trees in an order that is not their paths' (neffb before neffa): "the first tree that
# holds the primary" and "directory ascending" then differ when both trees hold a key's NEFF.
TREES = (f"{NS}/neffb/ab", f"{NS}/hlo/ab", f"{NS}/neffa/ab")
HOLDS = (True, False, True)
SUFFIXES = (".neff", ".hlo", ".flags.json")
CHILDREN = ("12", "13", "14")
# (tree, child, the key's last two digits, suffix, size): sizes from a few values, for ties
_FILE = st.tuples(st.integers(0, 2), st.sampled_from(CHILDREN), st.sampled_from(["00", "01", "0a", "ff"]),
                  st.sampled_from(SUFFIXES), st.sampled_from([0, 1, 2, 5]))
_LARGEST = st.sampled_from([0, 1, 2, 3, 5, 100])


def _write(root: Path, files: list[tuple[int, str, str, str, int]]) -> None:
    for tree in TREES:
        (root / tree).mkdir(parents=True, exist_ok=True)
    for i, child, tail, suffix, size in files:
        directory = root / TREES[i] / child
        directory.mkdir(exist_ok=True)
        path = directory / f"ab{child}{tail}{suffix}"
        if not path.exists():
            with path.open("wb") as f:
                f.truncate(size)


def _count(root: Path, largest: int, children: Sequence[str] = CHILDREN) -> tuple[int, int, int, list[str], CountedTop]:
    """count_plain of ``children`` in TREES (open afresh: a thread of its own may call this)."""
    assert native is not None
    fds = tuple(os.open(root / tree, os.O_RDONLY | os.O_DIRECTORY) for tree in TREES)
    try:
        pairs = [(c, sum(1 << i for i, t in enumerate(TREES) if (root / t / c).is_dir())) for c in children]
        counted: tuple[int, int, int, list[str], CountedTop] = native.count_plain(
            fds, HOLDS, pairs, "ab", SUFFIXES, ".neff", 4, 12, largest, TREES)
    finally:
        for fd in fds:
            os.close(fd)
    return counted


def brute_force(root: Path, trees: Sequence[str], holds: Sequence[bool], children: Sequence[str],
                largest: int) -> tuple[CountedTop, list[str]]:
    """The ``largest`` entries and the declined children, from listing every child in Python:
    every name is plain here, so a child is declined only for a key without a NEFF or an
    empty NEFF, in a tree that holds NEFFs."""
    top: CountedTop = []
    declined = []
    for child in children:
        keys: dict[str, list[tuple[int, int, bool]]] = {}  # key -> (tree, size, a NEFF of a NEFF tree)
        for i, tree in enumerate(trees):
            if (root / tree / child).is_dir():
                for item in os.scandir(root / tree / child):
                    key, _, suffix = item.name.partition(".")
                    keys.setdefault(key, []).append((i, item.stat().st_size, holds[i] and suffix == "neff"))
        primaries = [[(i, size) for i, size, primary in files if primary] for files in keys.values()]
        if any(not found or any(size == 0 for _, size in found) for found in primaries):
            declined.append(child)
            continue
        for key, files in keys.items():
            first = min(i for i, _, primary in files if primary)
            top.append((f"{trees[first]}/{child}", key, sum(size for _, size, _ in files), len(files)))
    top.sort(key=lambda item: (-item[2], item[0], item[1]))
    return top[:largest], declined


@settings(max_examples=300, deadline=None)
@given(st.lists(_FILE, max_size=24), _LARGEST)
def test_the_top_is_the_largest_entries_listing_finds(files: list[tuple[int, str, str, str, int]],
                                                     largest: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="count-top-"))
    try:
        _write(root, files)
        entries, size, counted_files, declined, top = _count(root, largest)
        expected, expected_declined = brute_force(root, TREES, HOLDS, CHILDREN, largest)
        assert declined == expected_declined
        assert top == expected
        if largest >= entries:  # every entry is in it: the totals are its sums
            assert (len(top), sum(t[2] for t in top), sum(t[3] for t in top)) == (entries, size, counted_files)
    finally:
        shutil.rmtree(root)


def test_the_top_breaks_ties_by_directory_then_key_and_skips_declined_children(tmp_path: Path) -> None:
    files = [(0, "12", "00", ".neff", 5), (2, "12", "00", ".neff", 5),  # NEFFs in both: neffb's, first in parents
             (2, "12", "0a", ".neff", 5), (2, "12", "01", ".neff", 5),  # a tie in one directory: by key
             (2, "13", "01", ".neff", 3), (1, "13", "01", ".hlo", 2),  # spread over two trees: 5 bytes, 2 files
             (0, "13", "0a", ".neff", 5),  # a tie with neffa's: neffb after it, though first in parents
             (0, "14", "ff", ".neff", 1)]
    _write(tmp_path, files)
    hog = tmp_path / TREES[1] / "14" / "ab14aa.hlo"  # a huge HLO without its NEFF: 14 is declined
    hog.parent.mkdir()
    with hog.open("wb") as f:
        f.truncate(1 << 30)
    ranked = [(f"{NS}/neffb/ab/12", "ab1200", 10, 2), (f"{NS}/neffa/ab/12", "ab1201", 5, 1),
              (f"{NS}/neffa/ab/12", "ab120a", 5, 1), (f"{NS}/neffa/ab/13", "ab1301", 5, 2),
              (f"{NS}/neffb/ab/13", "ab130a", 5, 1)]
    assert _count(tmp_path, 10)[3:] == (["14"], ranked)
    for largest in (0, 1, 3, 5):  # cut inside the tie, at its end, or nothing
        assert _count(tmp_path, largest)[4] == ranked[:largest]
        assert brute_force(tmp_path, TREES, HOLDS, CHILDREN, largest) == (ranked[:largest], ["14"])


class Recording:
    """A walk plan with the summary's rule for a level (and nothing else)."""

    held: frozenset[str] = frozenset()

    def __init__(self, largest: int) -> None:
        self.largest = largest
        self.grouper = Grouper()

    def in_step_group(self, directory: str) -> str | None:
        return None

    def shards_below(self, directories: Sequence[str]) -> PlainFiles | None:
        return self.grouper.plain_rule(directories)

    def entries_below(self, directory: str) -> PlainEntryDirs | None:
        return None


def test_a_walk_in_step_hands_each_count_its_top_by_store_path(tmp_path: Path) -> None:
    """Through the in-step walk (``walk_together``): the directories are the store's paths of
    the tree that holds the NEFFs, the keys the file names' digits."""
    files = []
    for i in range(40):
        key = f"ab{i % 16:02x}" + f"{i:028x}"
        files.append(("neff", f"{i % 16:02x}", key, ".neff", 1 + i % 7, "file"))
        if i % 3 == 0:
            files.append(("hlo", f"{i % 16:02x}", key, ".hlo", 4, "file"))
    make_layout_b(tmp_path, files)
    counter = Recording(6)
    safe = SafeRoot(str(tmp_path), str(tmp_path))
    items = list(local_in_step.walk_together(safe, [f"{NS}/hlo", f"{NS}/neff"], counter, NS))
    listed = [item.directory for item in items if isinstance(item, InStep)]
    assert not any(rel.startswith("ab/") for rel in listed)  # every shard counted
    trees, children = [f"{NS}/hlo/ab", f"{NS}/neff/ab"], sorted({f[1] for f in files})
    (top,) = [item.top for item in items if isinstance(item, Counted)]
    assert top == brute_force(tmp_path, trees, (False, True), children, 6)[0]
    assert top[0][0] == f"{NS}/neff/ab/06" and top[0][2:] == (7 + 4, 2)  # i = 6: the largest NEFF and an HLO


def test_two_threads_counting_at_once_count_what_each_counts_alone(tmp_path: Path) -> None:
    files = [(i % 3, f"{c:02x}", f"{k:02x}", SUFFIXES[i % 3], 1 + (c * k + i) % 9)
             for c in range(64) for k in range(6) for i in range(3)]
    files += [(0, f"{c:02x}", f"{k:02x}", ".neff", 1 + (c + k) % 4) for c in range(64) for k in range(6)]
    _write(tmp_path, files)
    children = [f"{c:02x}" for c in range(64)]
    alone = _count(tmp_path, 50, children)
    assert alone[0] == 64 * 6 and not alone[3] and len(alone[4]) == 50
    results: list[object] = []
    start = threading.Barrier(2)

    def count() -> None:
        start.wait()
        results.extend(_count(tmp_path, 50, children) for _ in range(20))

    threads = [threading.Thread(target=count) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 40 and all(result == alone for result in results)
