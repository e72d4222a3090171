"""The C walker (neffcache/stores/_listdir.c) under misuse and in its steering: it calls
nothing back, so what it is told between two steps (``count_children``, ``release``) is refused
out of turn; a walk leaks no reference per directory, and no descriptor however it ends: the
one it is handed is closed also when the walker cannot be made, and a walker in a reference
cycle is collected with its descriptors."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tracemalloc
import weakref
from collections.abc import Callable
from pathlib import Path

import pytest

from neffcache.entry import FileInfo
from neffcache.stores import local_listing
from tests.stores.c_helper import needs_native

REPO = Path(__file__).resolve().parents[2]
native = local_listing.native
pytestmark = needs_native

# A PlainEntryDirs's fields for count_children: MODULE_<digits> directories of a model.neff each.
RULE = ("MODULE_", "0123456789", ("model.neff",), ("model.neff",), "model.neff")


def test_steering_out_of_turn_is_refused(tmp_path: Path) -> None:
    """Only right after a step that yielded a directory's own listing, before the next step:
    before the first step, after a problem step, after the walk, and twice over a step."""
    assert native is not None
    (tmp_path / "a" / "MODULE_1").mkdir(parents=True)
    (tmp_path / "a" / "MODULE_1" / "model.neff").write_bytes(b"n")
    (tmp_path / "link").symlink_to(tmp_path / "a")
    walker = native.Walker(_open(tmp_path), "", FileInfo, None, True)
    with pytest.raises(RuntimeError, match="only right after a step"):
        walker.count_children(*RULE, 0)
    steps = []
    for step in walker:
        steps.append(step[0])
        if step[5] == -1:  # the symlinked directory: a problem of the root's, not a listing
            with pytest.raises(RuntimeError, match="only right after a step"):
                walker.release("x")
    with pytest.raises(RuntimeError, match="only right after a step"):
        walker.count_children(*RULE, 0)
    assert "" in steps and "a" in steps


def test_a_count_counts_once_and_a_release_names_a_held_child(tmp_path: Path) -> None:
    """Counted children are not walked (a second count finds none); a held child is walked only
    once released, and only a held name can be."""
    assert native is not None
    tmp_path = tmp_path / "root"  # the suite keeps a HOME in tmp_path
    for i in range(3):
        (tmp_path / "ns" / f"MODULE_{i}").mkdir(parents=True)
        (tmp_path / "ns" / f"MODULE_{i}" / "model.neff").write_bytes(b"n" * (i + 1))
    (tmp_path / "ns" / "MODULE_x").mkdir()  # not covered: walked
    (tmp_path / "ns" / "MODULE_x" / "f").write_bytes(b"1")
    for tree in ("hold", "keep"):
        (tmp_path / tree).mkdir()
        (tmp_path / tree / "f").write_bytes(b"1")
    walker = native.Walker(_open(tmp_path), "", FileInfo, frozenset({b"hold", b"keep"}), True)
    seen: dict[str, tuple[int, list[str]]] = {}
    counts = []
    for rel, _, _, _, _, _, pending, held in walker:
        seen[rel] = (pending, sorted(held))
        if held:
            with pytest.raises(KeyError, match="not a held subdirectory"):
                walker.release("ns")
            walker.release("keep")
        if rel == "ns":
            counts.append(walker.count_children(*RULE, 2))
            counts.append(walker.count_children(*RULE, 2))
    assert seen[""] == (1, ["hold", "keep"])
    assert seen["ns"][0] == 4
    assert counts == [(3, 6, 3, [("ns/MODULE_2", "MODULE_2", 3, 1), ("ns/MODULE_1", "MODULE_1", 2, 1)]),
                      (0, 0, 0, [])]
    assert set(seen) == {"", "ns", "ns/MODULE_x", "keep"}  # counted and held ones never listed


def test_an_unsteered_walk_yields_only_what_has_files(tmp_path: Path) -> None:
    assert native is not None
    tmp_path = tmp_path / "root"
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f").write_bytes(b"1")
    assert [step[0] for step in native.Walker(_open(tmp_path), "", FileInfo)] == ["a/b"]
    assert [step[0] for step in native.Walker(_open(tmp_path), "", FileInfo, None, True)] == ["", "a", "a/b"]


def test_a_walk_leaks_no_reference_per_directory(tmp_path: Path) -> None:
    for i in range(300):
        (tmp_path / f"d{i}").mkdir()
        (tmp_path / f"d{i}" / "f.bin").write_bytes(b"x")
    assert native is not None

    def walk() -> int:
        return sum(1 for _ in native.Walker(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY), "", FileInfo))

    walk()  # warm up caches
    before = sys.getrefcount(())
    assert walk() == 300
    assert sys.getrefcount(()) - before < 10  # it was +1 per directory with files (300)


def test_the_depth_bound_is_the_same_in_c_and_python() -> None:
    assert native is not None and native.MAX_DEPTH == local_listing.MAX_DEPTH


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts the descriptors in /proc/self/fd")


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _open(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def _chain(root: Path, depth: int) -> Path:
    """``root/d/d/...`` ``depth`` levels deep, a file in each, and a symlinked directory at the top."""
    path = root
    for _ in range(depth):
        path = path / "d"
        path.mkdir()
        (path / "f.bin").write_bytes(b"x")
    (root / "link").symlink_to(root / "d")
    return root


def _walker(fd: int, *args: object, **kwargs: object) -> object:
    assert native is not None
    return native.Walker(fd, *args, **kwargs)


_REFUSED: dict[str, Callable[[int], object]] = {
    "info_type not a tuple type": lambda fd: _walker(fd, "", object),
    "held not a frozenset": lambda fd: _walker(fd, "", FileInfo, {b"d"}),
    "held of str": lambda fd: _walker(fd, "", FileInfo, frozenset({"d"})),
    "held name with a slash": lambda fd: _walker(fd, "", FileInfo, frozenset({b"a/b"})),
    "held name empty": lambda fd: _walker(fd, "", FileInfo, frozenset({b""})),
    "start not a str": lambda fd: _walker(fd, b"", FileInfo),
    "start not encodable": lambda fd: _walker(fd, "\ud800", FileInfo),
}


@needs_proc
def test_a_walker_that_cannot_be_made_closes_the_descriptor_handed_to_it(tmp_path: Path) -> None:
    """The descriptor is the walk's once handed over (local_listing.walk never closes it): each
    refusal used to leave it open, one descriptor per failed walk."""
    before = _open_fds()
    for why, make in _REFUSED.items():
        for _ in range(50):
            fd = _open(tmp_path)
            with pytest.raises((TypeError, ValueError)):
                make(fd)
            assert _closed(fd), why
    assert _open_fds() == before


_PUSH_FAILS = """
import os, resource, sys
from neffcache.entry import FileInfo
from neffcache.stores import _listdir
size = 64 << 20
start = "s" * size
vm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize:"))
before = len(os.listdir("/proc/self/fd"))
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
# Room for the start's encoding (one more copy of it), not for its frame's (a second one).
resource.setrlimit(resource.RLIMIT_AS, (vm + size + (32 << 20), resource.RLIM_INFINITY))
try:
    _listdir.Walker(fd, start, FileInfo)
    outcome = "made"
except MemoryError:
    outcome = "MemoryError"
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
try:
    os.fstat(fd)
    closed = False
except OSError:
    closed = True
print(outcome, closed, len(os.listdir("/proc/self/fd")) - before)
"""


@needs_proc
def test_a_start_that_cannot_be_pushed_closes_the_descriptor(tmp_path: Path) -> None:
    """walker_push fails only out of memory: a start path too long for the memory left (a
    subprocess with an address-space limit) makes the Walker's first push fail, and the
    descriptor it was handed is closed, once (it was left open)."""
    done = subprocess.run([sys.executable, "-c", _PUSH_FAILS, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["MemoryError", "True", "0"]


@needs_proc
@pytest.mark.parametrize("ending", ["closed", "dropped halfway", "a count refused"])
def test_a_walk_holds_no_descriptor_however_it_ends(tmp_path: Path, ending: str) -> None:
    """A chain deeper than MAX_DEPTH (the walk holds a descriptor a level, and reports the levels
    below the bound), a symlinked directory (a problem, never opened), each level held back and
    released, and walks that end early: every descriptor is closed once the walker is closed
    or gone."""
    assert native is not None
    root = _chain(tmp_path, native.MAX_DEPTH + 3)
    before = _open_fds()
    for _ in range(10):
        walker = native.Walker(_open(root), "", FileInfo, frozenset({b"d"}), True)
        steps = 0
        for step in walker:
            steps += 1
            if step[7]:
                walker.release("d")
            if ending == "dropped halfway" and steps == 60:
                assert _open_fds() >= before + 60
                break
            if ending == "a count refused" and step[0].count("/") == 40:
                with pytest.raises(ValueError, match="among names"):
                    walker.count_children("MODULE_", "0", ("a",), ("b",), "a", 5)
                break
        if ending == "closed":
            assert steps == native.MAX_DEPTH + 2  # the root's problem, the files of each level, the bound
            walker.close()
        del walker
        assert _open_fds() == before, ending


@needs_proc
def test_a_walker_in_a_cycle_is_collected(tmp_path: Path) -> None:
    """A walker is a GC type: in a cycle (here through its FileInfo type, which holds it) the
    collector frees it, and the walk's descriptors are closed."""
    assert native is not None
    root = _chain(tmp_path, 20)
    before = _open_fds()

    class Info(FileInfo):
        walker: object = None

    walker = native.Walker(_open(root), "", Info)
    Info.walker = walker
    for _ in range(10):
        next(walker)
    assert _open_fds() >= before + 10
    gone = weakref.ref(Info)
    del Info, walker
    gc.collect()
    assert gone() is None
    assert _open_fds() == before


def test_a_refused_count_leaks_nothing(tmp_path: Path) -> None:
    """A count_children with a rule it refuses raises, and leaves nothing behind (its rule's
    names are read into a buffer freed on every path)."""
    assert native is not None
    (tmp_path / "sub").mkdir()
    names = tuple(f"n{i}" * 200 for i in range(40))

    def fail() -> None:
        walker = native.Walker(_open(tmp_path), "", FileInfo, None, True)
        next(walker)
        with pytest.raises(ValueError, match="among names"):
            walker.count_children("MODULE_", "0", names, ("absent",), names[0], 3)
        walker.close()

    tracemalloc.start()
    try:
        fail()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(200):
            fail()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 200 * 1000


def test_a_top_names_entries_by_their_store_paths_below_any_start(tmp_path: Path) -> None:
    """Counted at the walk's root ("": the entry's path is its name) and below a start path."""
    assert native is not None
    for i, size in enumerate([3, 9, 3, 1]):
        (tmp_path / "sub" / f"MODULE_{i}").mkdir(parents=True)
        (tmp_path / "sub" / f"MODULE_{i}" / "model.neff").write_bytes(b"n" * size)
    for start, fd in (("", _open(tmp_path / "sub")), ("a/b", _open(tmp_path / "sub")), ("x", _open(tmp_path))):
        tops = []
        for _ in (walker := native.Walker(fd, start, FileInfo, None, True)):
            tops.append(walker.count_children(*RULE, 3)[3])
        prefix = {"": "", "a/b": "a/b/", "x": "x/sub/"}[start]
        assert [top for top in tops if top] == [[(f"{prefix}MODULE_1", "MODULE_1", 9, 1),
                                                 (f"{prefix}MODULE_0", "MODULE_0", 3, 1),
                                                 (f"{prefix}MODULE_2", "MODULE_2", 3, 1)]]


def test_a_count_of_a_bad_largest_is_refused(tmp_path: Path) -> None:
    assert native is not None
    (tmp_path / "sub").mkdir()
    for largest, error in (("3", TypeError), (-1, ValueError), (10_001, ValueError)):
        walker = native.Walker(_open(tmp_path), "", FileInfo, None, True)
        next(walker)
        with pytest.raises(error, match="largest"):
            walker.count_children(*RULE, largest)
        walker.close()
