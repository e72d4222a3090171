"""The local listing has two paths, the C helper (neffcache/stores/_listdir.c) and the Python
loop (the fallback where it was not built, or with NEFFCACHE_NATIVE=0): they must list the same
files with the same sizes and mtimes, and report the same problems instead of following a link.

The cases of tests/hostile/ that concern listing run on the C path with the rest of the suite;
:func:`test_hostile_listing_cases_on_the_python_path` runs them again on the Python path."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import pytest

from neffcache.scan.report import scan
from neffcache.stores import local_listing
from neffcache.stores.local import LocalStore
from neffcache.stores.local_in_step import walk_together
from neffcache.stores.plain import PlainEntryDirs, PlainFiles
from neffcache.stores.safepath import SafeRoot
from neffcache.stores.walk import DirListing, InStep
from tests.stores.c_helper import NATIVE, STATUS, WHY_NOT, needs_native

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["native", "python"])
def listing_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "python":
        monkeypatch.setattr(local_listing, "native", None)
    else:
        if NATIVE is None:
            pytest.skip(WHY_NOT)
        monkeypatch.setattr(local_listing, "native", NATIVE)
    yield request.param


def test_the_c_helper_is_built() -> None:
    """This repository's install (pip install -e, the Makefile) builds the helper: a build that
    failed silently (it is optional) would leave every scan on the slow path unnoticed."""
    if STATUS.chosen:
        pytest.skip(WHY_NOT)
    assert NATIVE is not None, f"{STATUS.why_off}: run `pip install -e .` and read its output"
    forced = subprocess.run([sys.executable, "-c", "from neffcache.stores import local_listing as m; "
                             "print(m.native is None)"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "NEFFCACHE_NATIVE": "0"}, check=True)
    assert forced.stdout.strip() == "True"


def _hostile_tree(root: Path, outside: Path) -> None:
    """Every kind of name a listing meets, and every link it must not follow."""
    (root / "ns" / "entry").mkdir(parents=True)
    (root / "ns" / "entry" / "a.bin").write_bytes(b"a" * 10)
    (root / "ns" / "entry" / "empty").write_bytes(b"")
    (root / "ns" / "deep" / "er" / "est").mkdir(parents=True)
    (root / "ns" / "deep" / "er" / "est" / "f").write_bytes(b"f" * 3)
    (root / "ns" / "in-root-link").symlink_to("entry/a.bin")  # listed with its target's size
    (root / "ns" / "abs-in-root-link").symlink_to(root / "ns" / "entry" / "a.bin")
    (root / "ns" / "out-link").symlink_to(outside / "secret")  # a problem, never followed
    (root / "ns" / "dangling").symlink_to("nowhere")
    (root / "ns" / "dir-link").symlink_to("entry")  # a symlinked directory: not followed
    (root / "ns" / "out-dir-link").symlink_to(outside)
    (root / "ns" / "root-link").symlink_to("..")
    os.mkfifo(root / "ns" / "fifo")  # nothing a cache holds: reported, never opened
    short = tempfile.mkdtemp(prefix="s", dir="/tmp")  # a socket's path must be short: bound there, moved in
    with socket.socket(socket.AF_UNIX) as sock:  # a socket: reported the same
        sock.bind(f"{short}/s")
    os.rename(f"{short}/s", root / "ns" / "entry" / "sock")
    os.rmdir(short)
    (root / "ns" / "h\udcff-name").write_bytes(b"x")  # a name that is not UTF-8 (surrogateescape)
    (root / "top").write_bytes(b"t")
    (root / "emptydir").mkdir()
    outside.mkdir(exist_ok=True)
    (outside / "secret").write_bytes(b"s" * 99)


def _listed(store: LocalStore, prefix: str = "") -> list[DirListing]:
    return _normal(store.iter_dirs(prefix))


def _normal(listings: Iterable[DirListing]) -> list[DirListing]:
    return sorted((DirListing(d.directory, sorted(d.names), sorted(d.files), tuple(sorted(d.problems)))
                   for d in listings), key=lambda d: (d.directory, d.problems))


def test_both_paths_list_the_same(tmp_path: Path, listing_path: str) -> None:
    root = tmp_path / "root"
    _hostile_tree(root, tmp_path / "outside")
    got = _listed(LocalStore(root))
    by_path = {f.path: f for d in got for f in d.files}
    assert set(by_path) == {"ns/entry/a.bin", "ns/entry/empty", "ns/deep/er/est/f", "ns/in-root-link",
                            "ns/abs-in-root-link", "ns/h\udcff-name", "top"}
    assert by_path["ns/in-root-link"].size == 10 and by_path["ns/entry/empty"].size == 0
    st = os.stat(root / "ns" / "entry" / "a.bin")
    assert by_path["ns/entry/a.bin"].mtime == st.st_mtime  # the same float os.stat gives
    problems = {(d.directory, name): reason for d in got for name, reason in d.problems}
    assert set(problems) == {("ns", n) for n in ("out-link", "dangling", "dir-link", "out-dir-link", "root-link",
                                                 "fifo")} | {("ns/entry", "sock")}
    assert problems[("ns", "fifo")] == "a FIFO, not a regular file (not listed)"
    assert problems[("ns/entry", "sock")] == "a socket, not a regular file (not listed)"
    assert "outside the root" in problems[("ns", "out-link")]
    assert problems[("ns", "dir-link")] == "a symlink to a directory (not followed)"
    # Each file in exactly one listing, each listing once per directory (a scan relies on it).
    assert len(by_path) == sum(len(d.files) for d in got)
    for d in got:
        assert [f.path for f in d.files] == [f"{d.directory}/{n}" if d.directory else n for n in d.names]
    # The threaded listing (shared mounts) lists the same.
    assert _listed(LocalStore(root, list_workers=4)) == got
    assert _listed(LocalStore(root), "ns/deep") == [d for d in got if d.directory.startswith("ns/deep")]


@needs_native
def test_the_paths_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    _hostile_tree(root, tmp_path / "outside")
    assert NATIVE is not None
    native = _listed(LocalStore(root))
    monkeypatch.setattr(local_listing, "native", None)
    assert _listed(LocalStore(root)) == native


def test_an_unopenable_start_is_refused_on_both_paths(tmp_path: Path, listing_path: str) -> None:
    root = tmp_path / "root"
    _hostile_tree(root, tmp_path / "outside")
    from neffcache.errors import UnsafePath

    with pytest.raises(UnsafePath):
        list(LocalStore(root).iter_dirs("ns/dir-link"))
    assert list(LocalStore(root).iter_dirs("ns/missing")) == []


@needs_native
def test_a_scan_reports_the_same_on_both_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.scan.test_scan_listing import _messy_root, _same

    root = tmp_path / "c"
    _messy_root(root)
    native = scan(LocalStore(root))
    assert NATIVE is not None and len(native.entries) == 5 and len(native.foreign) == 4
    monkeypatch.setattr(local_listing, "native", None)
    _same(native, scan(LocalStore(root)))


def test_hostile_listing_cases_on_the_python_path(tmp_path: Path) -> None:
    """The hostile cases that list (symlinks planted anywhere, an unreadable entry directory,
    an entry of in-root links), in a pytest of their own with NEFFCACHE_NATIVE=0; their CLI
    subprocesses inherit it."""
    tests = ["tests/hostile/test_unreadable_and_links.py", "tests/hostile/test_planted_links.py",
             "tests/hostile/test_primitives.py::test_iter_dirs_reports_instead_of_following",
             "tests/scan/test_scan_listing.py"]
    code = ("import sys, pytest; from neffcache.stores import local_listing as m; "
            "assert m.native is None; sys.exit(pytest.main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", code, "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "--basetemp", str(tmp_path / "inner"), *tests],
                          cwd=REPO, capture_output=True, text=True, timeout=280,
                          env={**os.environ, "NEFFCACHE_NATIVE": "0"})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]


class TreesPlan:
    """A walk plan that holds back the subdirectories ``a``, ``b`` and ``c`` of ``ns`` (one
    group) and counts nothing; it records which directories it was asked about."""

    held = frozenset({"a", "b", "c"})
    largest = 0

    def __init__(self) -> None:
        self.asked: list[str] = []

    def in_step_group(self, directory: str) -> str | None:
        self.asked.append(directory)
        return "ns" if directory in ("ns/a", "ns/b", "ns/c") else None

    def entries_below(self, directory: str) -> PlainEntryDirs | None:
        return None

    def shards_below(self, directories: Sequence[str]) -> PlainFiles | None:
        return None


def test_held_trees_are_left_alone_then_listed_in_step(tmp_path: Path, listing_path: str) -> None:
    """A summary of layout B has the walk hold its two trees back and list them in step
    afterwards (scan/summary.py): together, the listings are the plain walk's, each file once."""
    root = tmp_path / "root"
    for tree, rel, name in (("a", "x/y", "f1"), ("b", "x/y", "f2"), ("b", "x/z", "f3"), ("a", "", "top-a")):
        (root / "ns" / tree / rel).mkdir(parents=True, exist_ok=True)
        (root / "ns" / tree / rel / name).write_bytes(b"1")
    (root / "ns" / "a" / "x" / "link").symlink_to(tmp_path)  # a problem, reported in step
    (root / "ns" / "other" / "a").mkdir(parents=True)  # named like a tree, not one: walked at once
    (root / "ns" / "other" / "a" / "f4").write_bytes(b"4")
    (root / "ns" / "c").symlink_to("a")  # a link named like a tree: the walk reports it, never offered
    store = LocalStore(root)
    plan = TreesPlan()
    items = list(store.walk("", plan))
    assert sorted(plan.asked) == ["ns/a", "ns/b", "ns/other/a"]
    rest = [item for item in items if isinstance(item, DirListing)]
    batches = [item for item in items if isinstance(item, InStep)]
    assert len(rest) + len(batches) == len(items)  # nothing counted
    assert items[len(rest):] == batches  # the trees come after the walk
    assert {b.group for b in batches} == {"ns"}
    assert [b.directory for b in batches] == ["", "x", "x/y", "x/z"]  # depth first, each once
    for batch in batches:
        rel = batch.directory
        assert {d.directory for d in batch.listings} <= {f"ns/{t}/{rel}".rstrip("/") for t in "ab"} | {
            f"ns/{t}/{rel}".rstrip("/").rpartition("/")[0] for t in "ab"}
    assert len(batches[2].listings) == 2  # x/y of both trees in one batch
    assert _normal(rest + [d for b in batches for d in b.listings]) == _listed(store)
    # The threaded listing (shared mounts) holds nothing back: it lists everything, as iter_dirs.
    threaded = list(LocalStore(root, list_workers=4).walk("", TreesPlan()))
    assert all(isinstance(item, DirListing) for item in threaded)
    assert _normal(threaded) == _listed(store)
    # A tree that is not there is left out of the batches.
    safe = SafeRoot(str(root), str(root))
    again = [item for item in walk_together(safe, ["ns/a", "ns/b", "ns/missing"], None, "ns")
             if isinstance(item, InStep)]
    assert again == batches


def test_a_walk_with_nowhere_to_put_held_trees_holds_none_back(tmp_path: Path, listing_path: str) -> None:
    """A plan names trees to hold back, but the caller gave no ``held`` to receive them: the
    walk lists them as usual rather than lose them."""
    root = tmp_path / "root"
    for tree in ("a", "b"):
        (root / "ns" / tree / "x").mkdir(parents=True)
        (root / "ns" / tree / "x" / "f").write_bytes(b"1")
    safe = SafeRoot(str(root), str(root))
    items = list(local_listing.walk(safe, safe.open_dir(""), "", TreesPlan()))
    assert all(isinstance(item, DirListing) for item in items)
    assert _normal(items) == _listed(LocalStore(root))  # type: ignore[arg-type]
    assert {d.directory for d in _normal(items)} == {"ns/a/x", "ns/b/x"}


def test_trees_in_step_below_a_link_are_a_problem_not_an_error(tmp_path: Path, listing_path: str) -> None:
    """A tree's parent swapped for a symlink after the walk held the tree back: reported, not raised."""
    root = tmp_path / "root"
    (root / "real" / "hlo").mkdir(parents=True)
    (root / "real" / "hlo" / "f").write_bytes(b"1")
    (root / "ns").symlink_to("real")
    safe = SafeRoot(str(root), str(root))
    batches = [item for item in walk_together(safe, ["ns/hlo", "ns/neff"], None, "ns") if isinstance(item, InStep)]
    assert [(b.directory, [(d.directory, d.files, [n for n, _ in d.problems]) for d in b.listings])
            for b in batches] == [("", [("", [], ["ns"]), ("", [], ["ns"])])]
