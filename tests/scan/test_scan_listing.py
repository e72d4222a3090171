"""A scan reports the same thing whether the store lists by directory or file by file."""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from neffcache.entry import EntryState, FileInfo
from neffcache.layouts.torchneuron import shard
from neffcache.scan.report import ScanReport, group_files, scan
from neffcache.stores.base import TEMP_MARKER, FileSource, Store
from neffcache.stores.local import LocalStore
from tests.runtime_caches import VERSION, module_name, write_neuronxcc_entry

KEY = "ab" + "cd" + "1" * 60


class FileByFile(Store):
    """Only the primitives, listing in random order: scans go through ``Store.iter_dirs``'s default."""

    def __init__(self, inner: LocalStore, seed: int) -> None:
        super().__init__(inner.url, read_only=True)
        self.inner = inner
        self.seed = seed

    def iter_files(self, prefix: str = "") -> Iterator[FileInfo]:
        files = list(self.inner.iter_files(prefix))
        random.Random(self.seed).shuffle(files)
        yield from files

    def stat(self, path: str) -> FileInfo | None:
        return self.inner.stat(path)

    def open_read(self, path: str) -> contextlib.AbstractContextManager[BinaryIO]:
        return self.inner.open_read(path)

    def _put_file(self, path: str, source: FileSource, *, exclusive: bool, move: bool) -> bool:
        raise NotImplementedError

    def _delete(self, paths: list[str]) -> int:
        raise NotImplementedError


def _touch(path: Path, data: bytes = b"x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _ok_path(root: Path) -> Path:
    return (root / f"neuronxcc-{VERSION}" / module_name(b"ok", "--model-type=transformer")).relative_to(root)


def _messy_root(root: Path) -> None:
    """Every case the grouping treats specially, in one root."""
    ok = write_neuronxcc_entry(root, b"ok")
    _touch(ok / f".model.neff{TEMP_MARKER}abc")  # an interrupted rewrite beside a committed entry
    _touch(ok / "notes.txt")  # a name the layout does not know
    write_neuronxcc_entry(root, b"locked", state="LOCKED")
    write_neuronxcc_entry(root, b"legacy", version="2.12.54.0+f631c2365", legacy=True)
    interrupted = write_neuronxcc_entry(root, b"interrupted")
    (interrupted / "model.done").unlink()
    tmp_only = root / f"neuronxcc-{VERSION}" / "MODULE_1+tmponly"
    _touch(tmp_only / f".model.neff{TEMP_MARKER}def")  # no entry for a directory of temp files
    _touch(root / "trn2-lnc2" / f"neuronxcc-{VERSION}" / "MODULE_2+abcdef12" / "model.hlo_module.pb")
    _touch(root / "trn2-lnc2" / "lock", b"")
    _touch(root / ".neffcache" / "leases" / "ab" / "x.lease")
    _touch(root / ".neffcache" / "leases" / "ab" / f".x.lease{TEMP_MARKER}123")
    _touch(root / ".neffcache" / "stamp")
    _touch(root / "trn1-lnc1" / "torchneuron-2.9.0" / "neff" / f"{shard(KEY)}.neff", b"NEFF")
    _touch(root / "trn1-lnc1" / "torchneuron-2.9.0" / "hlo" / f"{shard(KEY)}.hlo", b"HLO")
    _touch(root / f"{shard(KEY)}.neffcache.json", b"{}")  # a bare layout-B manifest, no NEFF
    _touch(root / "stray" / "file.bin")
    _touch(root / f"neuronxcc-{VERSION}" / "not-a-module" / "model.neff")
    # A link to a file inside the root is listed like the file (the HF hub's blob links).
    (root / "link.neff").symlink_to(ok / "model.neff")


def _same(a: ScanReport, b: ScanReport) -> None:
    assert a.entries == b.entries
    assert a.uncommitted == b.uncommitted
    assert a.garbage == b.garbage
    assert a.foreign == b.foreign
    assert a.warnings == b.warnings
    assert a.control_files == b.control_files


def test_listing_by_directory_matches_file_by_file(tmp_path: Path) -> None:
    root = tmp_path / "c"
    _messy_root(root)
    fast = scan(LocalStore(root))
    for seed in range(5):
        _same(fast, scan(FileByFile(LocalStore(root), seed)))
    threaded = scan(LocalStore(root, list_workers=4))
    _same(fast, threaded)

    states = {e.path.rsplit("/", 1)[-1]: e.state for e in fast.entries}
    assert states["MODULE_2+abcdef12"] is EntryState.EMPTY
    assert EntryState.LOCKED in states.values()
    assert "MODULE_1+tmponly" not in states
    assert len(fast.uncommitted) == 2  # the layout-A entry without model.done, the bare manifest
    assert {g.path.rsplit("/", 1)[-1] for g in fast.garbage} == {
        f".model.neff{TEMP_MARKER}abc", f".model.neff{TEMP_MARKER}def", f".x.lease{TEMP_MARKER}123",
    }
    # Names no layout claims and neffcache did not write are foreign (kept), even inside an entry.
    assert {f.path.rsplit("/", 1)[-1] for f in fast.foreign} == {"file.bin", "model.neff", "notes.txt", "link.neff"}
    assert fast.control_files == 3
    ok = next(e for e in fast.entries if e.path == str(_ok_path(root)))
    assert "notes.txt" not in ok.files and ok.extra == () and ok.state is EntryState.SUCCESS
    assert all(f.path == ok.store_path(name) for name, f in ok.files.items())
    torch = next(e for e in fast.entries if e.layout == "torchneuron")
    assert set(torch.files) == {f"neff/{shard(KEY)}.neff", f"hlo/{shard(KEY)}.hlo"}


def test_entries_of_one_namespace_share_it(tmp_path: Path) -> None:
    root = tmp_path / "c"
    for i in range(3):
        write_neuronxcc_entry(root, f"hlo-{i}".encode())
    entries = scan(LocalStore(root)).entries
    assert len(entries) == 3 and len({id(e.namespace) for e in entries}) == 1


def test_iter_dirs_lists_what_iter_files_lists(tmp_path: Path) -> None:
    root = tmp_path / "c"
    _messy_root(root)
    local = LocalStore(root)
    for store in (local, FileByFile(local, 0)):
        files = []
        for listing in store.iter_dirs():
            assert len(listing.names) == len(listing.files) > 0
            for name, info in zip(listing.names, listing.files, strict=True):
                assert info.path == (f"{listing.directory}/{name}" if listing.directory else name)
            files.extend(listing.files)
        assert sorted(files) == sorted(local.iter_files())
    below = {f.path for listing in local.iter_dirs(".neffcache") for f in listing.files}
    leases = ".neffcache/leases/ab"
    assert below == {".neffcache/stamp", f"{leases}/x.lease", f"{leases}/.x.lease{TEMP_MARKER}123"}
    assert list(local.iter_dirs("missing")) == []


def test_group_files_and_progress(tmp_path: Path) -> None:
    root = tmp_path / "c"
    _messy_root(root)
    store = LocalStore(root)
    files = list(store.iter_files())
    groups, garbage, control = group_files(files)
    report = scan(store)
    assert len(groups) == len(report.entries) + len(report.uncommitted)
    assert sorted(garbage) == sorted(report.garbage) and control == report.control_files
    seen: list[int] = []
    many = tmp_path / "many"
    entry = many / f"neuronxcc-{VERSION}" / "MODULE_9+00000000"
    entry.mkdir(parents=True)
    for i in range(5001):
        (entry / f"f{i}").touch()
    scan(LocalStore(many), progress=seen.append)
    assert seen and seen[-1] <= 5001 and os.path.isdir(entry)
