"""Entries on the store: publish, scan, verify, transfer and NeffCache.get/put built on the primitives."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from neffcache.entry import EntryState
from neffcache.errors import CorruptEntry
from neffcache.layouts import get_layout
from neffcache.operations.cache import NeffCache
from neffcache.operations.ingest import build_manifest, transfer
from neffcache.operations.publish import publish
from neffcache.operations.verify import CheckStatus, verify
from neffcache.outcomes import PublishStatus
from neffcache.scan.report import load_entry, scan
from neffcache.stores.base import Store
from neffcache.stores.local import LocalStore
from neffcache.testing.store_contract.sample import LAYOUT_A, TC, publish_a
from neffcache.toolchain import Toolchain


class EntryContract:
    def test_publish_scan_verify(self, store: Store) -> None:
        path, neff = publish_a(store)
        report = scan(store, read_manifests=True)
        assert [e.path for e in report.entries] == [path]
        entry = report.entries[0]
        assert entry.state is EntryState.SUCCESS
        assert entry.manifest is not None and entry.manifest.tags == {"model": "llama"}
        assert entry.toolchain == TC
        assert store.read_bytes(entry.store_path("model.neff")) == neff
        assert report.garbage == () and report.uncommitted == ()
        result = verify(store)
        assert result.count(CheckStatus.OK) == 1 and not result.corrupt

    def test_first_writer_wins(self, store: Store) -> None:
        path, first = publish_a(store, producer="first")
        ns = LAYOUT_A.namespace_for(TC)
        files = {"model.neff": b"other bytes", "model.done": b""}
        manifest = build_manifest("neuronxcc", "MODULE_123+abb26765", files, toolchain=TC)
        assert publish(store, ns, "MODULE_123+abb26765", files, manifest).status is PublishStatus.EXISTS
        entry = load_entry(store, path)
        assert entry is not None and entry.manifest is not None and entry.manifest.producer == "first"
        assert store.read_bytes(f"{path}/model.neff") == first

    def test_concurrent_publishers_one_winner(self, store: Store) -> None:
        results: list[PublishStatus] = []
        barrier = threading.Barrier(8)

        def worker(i: int) -> None:
            barrier.wait()
            ns = LAYOUT_A.namespace_for(TC)
            neff = f"neff from {i}".encode() * 1000
            files = {"model.hlo_module.pb": b"HLO", "model.neff": neff, "model.done": b""}
            m = build_manifest("neuronxcc", "MODULE_9+abb26765", files, toolchain=TC)
            results.append(publish(store, ns, "MODULE_9+abb26765", files, m).status)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results.count(PublishStatus.PUBLISHED) == 1
        assert verify(store).count(CheckStatus.OK) == 1

    def test_layout_b_get_put(self, store: Store) -> None:
        cache = NeffCache(store)
        assert cache.get(b"hlo", ["-O2"], TC) is None
        assert cache.put(b"hlo", ["-O2"], TC, b"NEFF-B" * 100, compile_seconds=3.0).status is PublishStatus.PUBLISHED
        assert cache.get(b"hlo", ["-O2"], TC) == b"NEFF-B" * 100
        assert cache.get(b"hlo", ["-O1"], TC) is None  # flags are part of the key
        other = Toolchain("2.27.5334.0+f702b353", "trn1", 1)
        assert cache.get(b"hlo", ["-O2"], other) is None  # so is the target
        report = scan(store, read_manifests=True)
        (entry,) = report.entries
        assert entry.layout == "torchneuron" and entry.state is EntryState.SUCCESS
        assert entry.manifest is not None and entry.manifest.compile_seconds == 3.0

    def test_tampered_entry_detected_and_quarantined(self, store: Store) -> None:
        path, neff = publish_a(store)
        store.put_file(f"{path}/model.neff", b"X" * len(neff))  # same size, other bytes
        result = verify(store)
        assert [c.path for c in result.corrupt] == [path]
        fixed = verify(store, fix=True)
        assert fixed.corrupt[0].quarantined_to is not None
        assert scan(store).entries == ()

    def test_uncommitted_entry_is_absent(self, store: Store) -> None:
        ns = LAYOUT_A.namespace_for(TC)
        base = f"{ns.path}/MODULE_5+abb26765"
        store.put_file(f"{base}/model.hlo_module.pb", b"HLO")
        store.put_file(f"{base}/model.neff", b"NEFF")
        store.put_file(f"{base}/neffcache.json", b"{}")
        report = scan(store)
        assert report.entries == ()
        assert [e.path for e in report.uncommitted] == [base]
        cache_b = NeffCache(store)
        key = cache_b.key(b"h", [], TC)
        names = get_layout("torchneuron").plan_entry(get_layout("torchneuron").namespace_for(TC), key)
        store.put_file(f"{names.base}/{names.manifest_name}", b"{}")
        assert cache_b.get(b"h", [], TC) is None

    def test_transfer_verifies(self, store: Store, tmp_path: Path) -> None:
        path, neff = publish_a(store)
        dest = LocalStore(tmp_path / "dest")
        entry = load_entry(store, path)
        assert entry is not None
        assert transfer(store, entry, dest).status is PublishStatus.PUBLISHED
        assert dest.read_bytes(f"{path}/model.neff") == neff
        assert verify(dest).count(CheckStatus.OK) == 1
        # A source whose bytes no longer match its manifest is refused, and nothing lands.
        store.put_file(f"{path}/model.neff", b"Y" * len(neff))
        dest2 = LocalStore(tmp_path / "dest2")
        with pytest.raises(CorruptEntry):
            transfer(store, entry, dest2)
        assert list(dest2.iter_files()) == [] or scan(dest2).entries == ()
