"""lookup: the first store holding each path (fastest first, each store asked only for what is still
missing), the index in one batch, and faults that are notes: a store or the index down."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from neffcache.entry import FileInfo
from neffcache.errors import StoreUnavailable
from neffcache.index import IndexClient, NullIndex, open_index
from neffcache.index.records import entry_record
from neffcache.layouts import get_layout
from neffcache.misses import lookup as lookup_module
from neffcache.misses.lookup import HeldStatus, ask_history, lookup
from neffcache.operations.ingest import build_manifest
from neffcache.operations.publish import publish
from neffcache.scan.report import load_entry
from neffcache.server.config import ServerSettings
from neffcache.stores import LocalStore
from neffcache.stores.walk import DirListing
from neffcache.toolchain import Toolchain
from tests.server.conftest import LiveServer, make_tokens
from tests.server.conftest import free_port as unused_port

TC = Toolchain("2.27.5334.0+f702b353", "trn2", 2)
LAYOUT = get_layout("neuronxcc")
NS = LAYOUT.namespace_for(TC)


def key(i: int) -> str:
    return f"MODULE_{1000 + i}+d41d8cd9"


def path(i: int) -> str:
    return LAYOUT.plan_entry(NS, key(i)).path


def plant(store: LocalStore, i: int, *, seconds: float = 5.0) -> None:
    names = LAYOUT.names(NS, key(i))
    assert names.hlo and names.neff
    files: dict[str, bytes | Path] = {names.hlo: f"hlo {i}".encode() * 100, names.neff: f"neff {i}".encode() * 50}
    manifest = build_manifest(NS.layout, key(i), files, toolchain=TC, compile_seconds=seconds)
    assert publish(store, NS, key(i), files, manifest).ok


class CountingStore(LocalStore):
    """A local store that remembers which entry directories it was asked to list."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.asked: list[str] = []

    def iter_files(self, prefix: str = "") -> Iterator[FileInfo]:
        self.asked.append(prefix)
        return super().iter_files(prefix)

    def iter_dirs(self, prefix: str = "") -> Iterator[DirListing]:
        self.asked.append(prefix)
        return super().iter_dirs(prefix)


class DownStore(LocalStore):
    def iter_files(self, prefix: str = "") -> Iterator[FileInfo]:
        raise StoreUnavailable("the tier is down (test)", store=self.url)


def test_each_path_is_found_in_the_fastest_store_and_slower_ones_are_not_asked(tmp_path: Path) -> None:
    fast, slow = CountingStore(tmp_path / "nvme"), CountingStore(tmp_path / "s3ish")
    plant(fast, 0)
    plant(slow, 0)
    plant(slow, 1)
    report = lookup([path(0), path(1), path(2), path(0)], [fast, slow])
    assert [report.holding(path(i)).store for i in range(3)] == [fast.url, slow.url, None]
    assert [report.status(path(i)) for i in range(3)] == [HeldStatus.HIT, HeldStatus.HIT, HeldStatus.MISS]
    assert path(0) not in slow.asked and path(1) in slow.asked
    assert report.stores == (fast.url, slow.url) and not report.notes and not report.index_asked


def test_an_entry_that_is_not_committed_success_is_not_held(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    names = LAYOUT.names(NS, key(5))
    assert names.hlo
    store.put_file(f"{path(5)}/{names.hlo}", b"extracted only")  # EMPTY: the runtime would compile it
    assert lookup([path(5)], [store]).status(path(5)) is HeldStatus.MISS


def test_many_paths_are_answered_by_one_listing_per_namespace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    monkeypatch.setattr(lookup_module, "FEW_PATHS", 2)
    store = CountingStore(tmp_path / "store")
    for i in range(4):
        plant(store, i)
    store.asked.clear()
    report = lookup([path(i) for i in range(6)], [store])
    assert [report.status(path(i)) for i in range(6)] == [HeldStatus.HIT] * 4 + [HeldStatus.MISS] * 2
    assert store.asked == [NS.path]


def test_a_store_that_is_down_is_a_note_and_the_others_answer(tmp_path: Path) -> None:
    down, good = DownStore(tmp_path / "down"), LocalStore(tmp_path / "good")
    plant(good, 0)
    report = lookup([path(0), path(1)], [down, good])
    assert report.holding(path(0)).store == good.url and report.status(path(1)) is HeldStatus.MISS
    assert len(report.notes) == 1 and "could not be read" in report.notes[0] and down.url in report.notes[0]


@pytest.fixture
def live_index(tmp_path: Path) -> Iterator[tuple[LiveServer, str]]:
    settings = ServerSettings(data_dir=tmp_path / "index", database_url=f"sqlite:///{tmp_path / 'index.db'}",
                              token_cache_seconds=0.0)
    with LiveServer(settings) as live:
        yield live, make_tokens(live.db).write


def _register(index: IndexClient, store: LocalStore, i: int, as_store: str | None = None) -> None:
    entry = load_entry(store, path(i))
    assert entry is not None
    index.register_entries([entry_record(entry, as_store or store.url)])
    index.flush()


def test_the_index_answers_in_one_batch_and_tells_what_is_elsewhere(tmp_path: Path,
                                                                     live_index: tuple[LiveServer, str]) -> None:
    live, token = live_index
    here, other = LocalStore(tmp_path / "here"), LocalStore(tmp_path / "other-host")
    for i in (0, 1):
        plant(other, i)
    plant(here, 0)
    with open_index(live.url, token, spool_root=tmp_path / "spool") as index:
        assert isinstance(index, IndexClient)
        _register(index, here, 0)
        _register(index, other, 1, as_store="s3://team-bucket/cache")
        report = lookup([path(i) for i in range(3)], [here], index)
    assert report.index_asked
    assert [report.status(path(i)) for i in range(3)] == [HeldStatus.HIT, HeldStatus.ELSEWHERE, HeldStatus.MISS]
    assert report.holding(path(1)).index_stores == ("s3://team-bucket/cache",)
    assert report.holding(path(2)).index is None


def test_a_stale_index_record_of_an_asked_store_is_a_miss(tmp_path: Path, live_index: tuple[LiveServer, str]) -> None:
    live, token = live_index
    store = LocalStore(tmp_path / "store")
    plant(store, 0)
    with open_index(live.url, token, spool_root=tmp_path / "spool") as index:
        assert isinstance(index, IndexClient)
        _register(index, store, 0)
        store.delete([f"{path(0)}/{name}" for name in list(load_entry(store, path(0)).files)])  # type: ignore[union-attr]
        report = lookup([path(0)], [store], index)
    assert report.holding(path(0)).index is not None and report.status(path(0)) is HeldStatus.MISS


def test_the_index_down_is_a_note_and_the_stores_still_answer(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    plant(store, 0)
    with open_index(f"http://127.0.0.1:{unused_port()}", "token", spool_root=tmp_path / "spool", retries=0,
                    connect_timeout=0.2) as index:
        report = lookup([path(0), path(1)], [store], index)
        history = ask_history(index, ["a" * 64], ["trn2"])
    assert [report.status(path(i)) for i in (0, 1)] == [HeldStatus.HIT, HeldStatus.MISS]
    assert not report.index_asked and any("index did not answer" in n for n in report.notes)
    assert not history.by_hlo and history.notes and "unavailable" in history.notes[0]


def test_no_index_configured_asks_nothing(tmp_path: Path) -> None:
    report = lookup([path(0)], [LocalStore(tmp_path / "s")], NullIndex())
    assert not report.index_asked and not report.notes
    assert ask_history(NullIndex(), ["a" * 64], ["trn2"]).by_hlo == {}


def test_history_from_the_index(tmp_path: Path, live_index: tuple[LiveServer, str]) -> None:
    live, token = live_index
    store = LocalStore(tmp_path / "store")
    for i, seconds in ((0, 4.0), (1, 8.0)):
        plant(store, i, seconds=seconds)
    with open_index(live.url, token, spool_root=tmp_path / "spool") as index:
        assert isinstance(index, IndexClient)
        for i in (0, 1):
            _register(index, store, i)
        entry = load_entry(store, path(0))
        assert entry is not None and entry.manifest is not None
        names = LAYOUT.names(NS, key(0))
        assert names.hlo
        digest = entry.manifest.files[names.hlo].sha256
        history = ask_history(index, [digest, "b" * 64], ["trn2", "trn1"])
    assert history.by_hlo == {digest: (("trn2", 4.0),)}
    assert sorted(s.compile_seconds for s in history.samples["trn2"]) == [4.0, 8.0]
    assert history.samples["trn1"] == ()
