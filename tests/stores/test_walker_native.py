"""The C walker (neffcache/stores/_listdir.c) under misuse: a callback that closes or steps the
walker it is called from gets a RuntimeError (it was a use-after-free: a segfault), a walk
leaks no reference per directory, and no descriptor however it ends: the one it is handed is
closed also when the walker cannot be made, and a walker in a reference cycle with its counter
is collected with its descriptors. The misuse runs in a subprocess so a crash fails the test,
not the runner."""

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
from neffcache.stores.plain import CountedTop, PlainEntryDirs, PlainFiles
from tests.stores.c_helper import needs_native

REPO = Path(__file__).resolve().parents[2]
native = local_listing.native
pytestmark = needs_native

_CALLBACK = """
import os, sys
from neffcache.entry import FileInfo
from neffcache.stores import _listdir
root, action = sys.argv[1], sys.argv[2]
held = []

def skip(rel):
    walker = held[0]
    try:
        walker.close() if action == "close" else next(walker)
    except RuntimeError as exc:
        print("refused:", exc)
    return False

walker = _listdir.Walker(os.open(root, os.O_RDONLY | os.O_DIRECTORY), "", FileInfo, frozenset({b"sub"}), skip)
held.append(walker)
print(sorted(step[0] for step in walker))
walker.close()
"""


@pytest.mark.parametrize("action", ["close", "next"])
def test_a_callback_that_closes_or_steps_the_walker_is_refused(tmp_path: Path, action: str) -> None:
    for d in ("a/sub", "b/sub"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "f.bin").write_bytes(b"x")
    done = subprocess.run([sys.executable, "-c", _CALLBACK, str(tmp_path), action], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 0, f"rc {done.returncode} (a negative one is a signal): {done.stderr[-2000:]}"
    assert done.stdout.count("refused: Walker is") == 2
    assert done.stdout.strip().endswith("['a/sub', 'b/sub']")  # the walk itself went on unharmed


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


class Plain:
    """A walk's ``plain`` with no rule for anything and whatever ``largest`` it is given; it can
    hold the walker it is handed to, and raise from a callback."""

    def __init__(self, largest: object = 0, fail: str = "") -> None:
        self.largest = largest
        self.fail = fail
        self.walker: object = None

    def rule(self, directories: object) -> PlainFiles | None:
        return None

    def entry_rule(self, directory: str) -> PlainEntryDirs | None:
        if self.fail == "entry_rule" and directory.count("/") == 40:
            raise RuntimeError("entry_rule failed")
        return None

    def counted(self, rule: object, entries: int, size: int, files: int, top: CountedTop) -> None:
        pass

    def skip(self, rel: str) -> bool:
        if self.fail == "skip" and rel.count("/") == 40:
            raise RuntimeError("skip failed")
        return False


class NoLargest:
    def entry_rule(self, directory: str) -> None:
        return None


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
    "skip not callable": lambda fd: _walker(fd, "", FileInfo, frozenset(), "no"),
    "start not a str": lambda fd: _walker(fd, b"", FileInfo),
    "start not encodable": lambda fd: _walker(fd, "\ud800", FileInfo),
    "plain without largest": lambda fd: _walker(fd, "", FileInfo, plain=NoLargest()),
    "plain.largest not an int": lambda fd: _walker(fd, "", FileInfo, plain=Plain("3")),
    "plain.largest negative": lambda fd: _walker(fd, "", FileInfo, plain=Plain(-1)),
    "plain.largest too large": lambda fd: _walker(fd, "", FileInfo, plain=Plain(10_001)),
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
@pytest.mark.parametrize("ending", ["closed", "dropped halfway", "entry_rule raises", "skip raises"])
def test_a_walk_holds_no_descriptor_however_it_ends(tmp_path: Path, ending: str) -> None:
    """A chain deeper than MAX_DEPTH (the walk holds a descriptor a level, and reports the levels
    below the bound), a symlinked directory (a problem, never opened), and walks that end
    early: every descriptor is closed once the walker is closed or gone."""
    assert native is not None
    root = _chain(tmp_path, native.MAX_DEPTH + 3)
    before = _open_fds()
    for _ in range(10):
        plain = Plain(5, fail=ending.split(maxsplit=1)[0])
        walker = native.Walker(_open(root), "", FileInfo, frozenset({b"d"}), plain.skip, plain)
        if ending == "closed":
            steps = list(walker)
            assert len(steps) == native.MAX_DEPTH + 2  # the root's problem, the files of each level, the bound
            walker.close()
        elif ending == "dropped halfway":
            for _ in range(60):
                next(walker)
            assert _open_fds() >= before + 60
        else:
            with pytest.raises(RuntimeError, match="failed"):
                list(walker)
        del walker
        assert _open_fds() == before, ending


@needs_proc
@pytest.mark.parametrize("through", ["plain", "skip"])
def test_a_walker_in_a_cycle_with_its_counter_is_collected(tmp_path: Path, through: str) -> None:
    """A counter that holds its walker (a scan's state may) makes a cycle through the walker's
    ``plain`` or ``skip``: the collector frees both, and the walk's descriptors are closed."""
    assert native is not None
    root = _chain(tmp_path, 20)
    before = _open_fds()
    plain = Plain()
    if through == "plain":
        walker = native.Walker(_open(root), "", FileInfo, plain=plain)
    else:
        walker = native.Walker(_open(root), "", FileInfo, frozenset({b"d"}), plain.skip)
    plain.walker = walker
    for _ in range(10):
        next(walker)
    assert _open_fds() >= before + 10
    counter = weakref.ref(plain)
    del plain, walker
    gc.collect()
    assert counter() is None
    assert _open_fds() == before


class NoEntryRule:
    largest = 0


def test_a_plain_without_entry_rule_fails_the_step_and_leaks_nothing(tmp_path: Path) -> None:
    """The walk asks ``plain.entry_rule`` with the directory's path: when the method is not
    there, the step fails with the AttributeError, and the path (it leaked, passed as "N") is
    freed."""
    assert native is not None
    (tmp_path / "sub").mkdir()
    start = "s" * 10_000

    def fail() -> None:
        walker = native.Walker(_open(tmp_path), start, FileInfo, plain=NoEntryRule())
        with pytest.raises(AttributeError, match="entry_rule"):
            next(walker)

    tracemalloc.start()
    try:
        fail()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(200):
            fail()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 200 * len(start) // 4  # a leaked path each is 2 MB


class Everywhere(Plain):
    """Entry directories named MODULE_<digits> wherever the walk is, of a model.neff each."""

    def __init__(self, largest: int) -> None:
        super().__init__(largest)
        self.tops: list[CountedTop] = []

    def entry_rule(self, directory: str) -> PlainEntryDirs | None:
        return PlainEntryDirs("MODULE_", "0123456789", ("model.neff",), ("model.neff",), "model.neff")

    def counted(self, rule: object, entries: int, size: int, files: int, top: CountedTop) -> None:
        self.tops.append(top)


def test_a_top_names_entries_by_their_store_paths_below_any_start(tmp_path: Path) -> None:
    """Counted at the walk's root ("": the entry's path is its name) and below a start path."""
    assert native is not None
    for i, size in enumerate([3, 9, 3, 1]):
        (tmp_path / "sub" / f"MODULE_{i}").mkdir(parents=True)
        (tmp_path / "sub" / f"MODULE_{i}" / "model.neff").write_bytes(b"n" * size)
    for start, fd in (("", _open(tmp_path / "sub")), ("a/b", _open(tmp_path / "sub")), ("x", _open(tmp_path))):
        plain = Everywhere(3)
        assert list(native.Walker(fd, start, FileInfo, plain=plain)) == []
        prefix = {"": "", "a/b": "a/b/", "x": "x/sub/"}[start]
        assert plain.tops == [[(f"{prefix}MODULE_1", "MODULE_1", 9, 1), (f"{prefix}MODULE_0", "MODULE_0", 3, 1),
                               (f"{prefix}MODULE_2", "MODULE_2", 3, 1)]]
