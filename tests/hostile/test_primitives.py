"""Every LocalStore primitive refuses a path with a symlinked component below the root.

The link points at a sentinel directory outside the root that holds the same names: a
primitive that followed it would read, write or delete there. Plain and shared mode.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from neffcache.errors import UnsafePath
from neffcache.stores.local import LocalStore
from tests.hostile.sentinel import fingerprint, make_sentinel


@pytest.fixture(params=[False, True], ids=["plain", "shared"])
def planted(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[LocalStore, Path]]:
    """A store whose ``ns`` directory is a symlink to the sentinel (which has model.neff)."""
    store = LocalStore(tmp_path / "root", shared=request.param)
    sentinel = make_sentinel(tmp_path)
    (store.root / "ns").symlink_to(sentinel)
    before = fingerprint(sentinel)
    yield store, sentinel
    assert fingerprint(sentinel) == before, "the sentinel outside the root was changed"


def test_put_file(planted: tuple[LocalStore, Path]) -> None:
    store, sentinel = planted
    with pytest.raises(UnsafePath) as exc:
        store.put_file("ns/new.bin", b"x")
    assert exc.value.path == "ns" and exc.value.store == store.url and "symlink" in str(exc.value)
    with pytest.raises(UnsafePath):
        store.put_file("ns/model.neff", b"overwritten")
    assert not (sentinel / "new.bin").exists()


def test_put_file_exclusive_and_nested(planted: tuple[LocalStore, Path]) -> None:
    store, _ = planted
    with pytest.raises(UnsafePath):
        store.put_file("ns/sub/model.done", b"", exclusive=True)
    with pytest.raises(UnsafePath):
        store.put_file("ns/fresh/model.done", b"", exclusive=True)


def test_put_file_from_path_and_move(planted: tuple[LocalStore, Path], tmp_path: Path) -> None:
    store, _ = planted
    src = tmp_path / "src.bin"
    src.write_bytes(b"payload")
    with pytest.raises(UnsafePath):
        store.put_file("ns/copied.bin", src)
    with pytest.raises(UnsafePath):
        store.put_file("ns/moved.bin", src, move=True)
    assert src.read_bytes() == b"payload"


def test_delete(planted: tuple[LocalStore, Path]) -> None:
    store, sentinel = planted
    with pytest.raises(UnsafePath):
        store.delete(["ns/model.neff", "ns/precious.txt", "ns/sub/model.done"])
    # A name that is itself a link loses the link, never its target.
    (store.root / "real").mkdir()
    (store.root / "real" / "model.neff").symlink_to(sentinel / "model.neff")
    assert store.delete(["real/model.neff"]) == 1
    assert not (store.root / "real" / "model.neff").is_symlink()


def test_move(planted: tuple[LocalStore, Path]) -> None:
    store, _ = planted
    store.put_file("real/a.bin", b"a")
    with pytest.raises(UnsafePath):
        store.move("real/a.bin", "ns/a.bin")
    with pytest.raises(UnsafePath):
        store.move("ns/model.neff", "real/stolen.neff")
    assert store.read_bytes("real/a.bin") == b"a"
    assert store.stat("real/stolen.neff") is None


def test_stat_open_read_get_file(planted: tuple[LocalStore, Path], tmp_path: Path) -> None:
    store, _ = planted
    with pytest.raises(UnsafePath):
        store.stat("ns/model.neff")
    with pytest.raises(UnsafePath), store.open_read("ns/model.neff"):
        pass
    with pytest.raises(UnsafePath):
        store.get_file("ns/model.neff", tmp_path / "out")
    with pytest.raises(UnsafePath):
        store.local_path("ns/model.neff")


def test_leaf_link_out_of_the_root_is_not_read(planted: tuple[LocalStore, Path], tmp_path: Path) -> None:
    store, sentinel = planted
    (store.root / "real").mkdir()
    (store.root / "real" / "model.neff").symlink_to(sentinel / "model.neff")
    with pytest.raises(UnsafePath, match="outside the root"):
        store.read_bytes("real/model.neff")
    with pytest.raises(UnsafePath, match="outside the root"):
        store.get_file("real/model.neff", tmp_path / "out")
    with pytest.raises(UnsafePath, match="outside the root"):
        store.local_path("real/model.neff")
    # Replacing the name replaces the link, never writes through it.
    assert store.put_file("real/model.neff", b"mine")
    assert not (store.root / "real" / "model.neff").is_symlink()


def test_iter_dirs_reports_instead_of_following(planted: tuple[LocalStore, Path]) -> None:
    store, _ = planted
    store.put_file("real/a.bin", b"a")
    listings = list(store.iter_dirs())
    assert {f.path for listing in listings for f in listing.files} == {"real/a.bin"}
    problems = [(listing.directory, *p) for listing in listings for p in listing.problems]
    assert [(d, n) for d, n, _ in problems] == [("", "ns")]
    assert "symlink pointing outside the root" in problems[0][2]
    with pytest.raises(UnsafePath):
        list(store.iter_dirs("ns"))


def test_staging_dir_under_a_planted_control_dir(planted: tuple[LocalStore, Path], tmp_path: Path) -> None:
    store, _ = planted
    sentinel2 = tmp_path / "sentinel2"
    sentinel2.mkdir()
    (store.root / ".neffcache").mkdir()
    (store.root / ".neffcache" / "staging").symlink_to(sentinel2)
    with pytest.raises(UnsafePath), store.staging_dir():
        pass
    assert list(sentinel2.iterdir()) == []
    (store.root / ".neffcache" / "staging").unlink()
    with store.staging_dir() as staging:  # a real one again: made, consumed, removed
        (staging / "0.part").write_bytes(b"payload")
        assert store.put_file("a/b.bin", staging / "0.part", move=True)
    assert store.read_bytes("a/b.bin") == b"payload"
    assert not staging.exists()
