"""The store contract: every backend runs these tests (fsspec's tests/abstract habit).

A backend's test module subclasses :class:`StoreContract` and provides a ``store`` fixture
that yields an empty, writable store (and, where it can, a ``make_readonly`` fixture).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from neffcache.cache import NeffCache
from neffcache.entry import EntryState
from neffcache.errors import CorruptEntry, EntryNotFound, InvalidKey, ReadOnlyStore
from neffcache.ingest import build_manifest, transfer
from neffcache.layouts import get_layout
from neffcache.lease import LeaseRecord, acquire, read_lease, try_acquire
from neffcache.manifest import FileDigest, sha256_bytes
from neffcache.publish import PublishStatus, publish
from neffcache.scan import load_entry, scan
from neffcache.stores.base import CONTROL_DIR, IncompleteUpload, Store
from neffcache.stores.local import LocalStore
from neffcache.toolchain import Toolchain
from neffcache.verify import CheckStatus, verify

TC = Toolchain("2.27.5334.0+f702b353", "trn2", 2)
LAYOUT_A = get_layout("neuronxcc")


def publish_a(store: Store, key: str = "MODULE_123+abb26765", neff: bytes | None = None,
              producer: str = "test") -> tuple[str, bytes]:
    ns = LAYOUT_A.namespace_for(TC)
    neff = neff if neff is not None else b"NEFF" + os.urandom(4096)
    files = {"model.hlo_module.pb": b"HLO:" + key.encode(), "compile_flags.json": b'["--model-type=transformer"]',
             "model.neff": neff, "model.done": b""}
    manifest = build_manifest("neuronxcc", key, files, toolchain=TC, flags=["--model-type=transformer"],
                              tags={"model": "llama"}, compile_seconds=12.5)
    manifest = type(manifest)(**{**manifest.__dict__, "producer": producer})
    result = publish(store, ns, key, files, manifest)
    assert result.ok
    return f"{ns.path}/{key}", neff


class BackendDifferences:
    """The methods through which code outside ``stores/`` learns what differs between backends
    (see the module docstring of neffcache.stores.base)."""

    on_local_filesystem: bool
    single_writer: bool
    created_on_open: bool

    def test_move(self, store: Store) -> None:
        assert store.put_file("m/src.bin", b"moving")
        store.move("m/src.bin", "n/o/dst.bin")
        assert store.stat("m/src.bin") is None
        assert store.read_bytes("n/o/dst.bin") == b"moving"
        with pytest.raises(EntryNotFound):
            store.move("m/src.bin", "n/o/again.bin")
        assert store.stat("n/o/again.bin") is None

    def test_discard(self, store: Store) -> None:
        for name in ("d/e/1.bin", "d/e/2.bin", "d/keep.bin"):
            assert store.put_file(name, name.encode())
        store.discard(["d/e/1.bin", "d/e/2.bin", "d/e/missing.bin"], prune_dirs=True)
        store.discard([])
        assert {f.path for f in store.iter_files()} == {"d/keep.bin"}
        root = store.local_root
        if root is not None:
            assert not (root / "d/e").exists(), "prune_dirs removes the directory the removals emptied"
            assert (root / "d").is_dir()

    def test_remove_empty_dirs(self, store: Store) -> None:
        assert store.put_file("r/s/t.bin", b"x")
        assert store.put_file(f"{CONTROL_DIR}/c/u.bin", b"x")
        store.discard(["r/s/t.bin", f"{CONTROL_DIR}/c/u.bin"])
        root = store.local_root
        if root is not None:
            assert (root / "r/s").is_dir(), "discard without prune_dirs leaves the directory"
        store.remove_empty_dirs(["r/s", f"{CONTROL_DIR}/c"])
        assert list(store.iter_files()) == []
        if root is not None:
            assert not (root / "r").exists() and root.is_dir(), "the parents go, never the root"
            assert (root / CONTROL_DIR / "c").is_dir(), "control directories only with control=True"
            store.remove_empty_dirs([f"{CONTROL_DIR}/c"], control=True)
            assert not (root / CONTROL_DIR).exists()

    def test_exists(self, store: Store) -> None:
        assert not store.exists("x/y.bin")
        assert store.put_file("x/y.bin", b"1")
        assert store.exists("x/y.bin")
        store.delete(["x/y.bin"])
        assert not store.exists("x/y.bin")
        with pytest.raises(InvalidKey):
            store.exists("../escape")

    def test_incomplete_uploads_empty_by_default(self, store: Store) -> None:
        assert store.put_file("whole.bin", b"done in one request")
        assert store.incomplete_uploads() == []
        assert store.incomplete_uploads(older_than=0.0) == []
        assert store.abort_uploads([IncompleteUpload("never/started.bin", "no-such-upload", 0.0)]) == 0

    def test_local_root_and_single_writer(self, store: Store) -> None:
        assert (store.local_root is not None) == self.on_local_filesystem
        assert store.single_writer == self.single_writer
        assert not store.single_writer or store.local_root is not None
        assert store.put_file("p/q.bin", b"here")
        root = store.local_root
        if root is None:
            assert store.local_path("p/q.bin") is None
        else:
            assert (root / "p/q.bin").read_bytes() == b"here"
            assert store.local_path("p/q.bin") == root / "p/q.bin"

    def test_created(self, store: Store) -> None:
        assert store.created is self.created_on_open


class StoreContract(BackendDifferences):
    # What the backend says about itself (Store.local_root, single_writer, created): a backend's
    # test class sets the values its store must report.
    on_local_filesystem = False
    single_writer = False
    created_on_open = False

    # -- primitives ---------------------------------------------------------------------------
    def test_put_read_stat_roundtrip(self, store: Store) -> None:
        assert store.put_file("a/b/c.bin", b"hello")
        info = store.stat("a/b/c.bin")
        assert info is not None and info.size == 5 and info.path == "a/b/c.bin"
        assert store.read_bytes("a/b/c.bin") == b"hello"
        assert {f.path for f in store.iter_files()} == {"a/b/c.bin"}
        assert {f.path for f in store.iter_files("a")} == {"a/b/c.bin"}
        assert list(store.iter_files("nope")) == []

    def test_put_from_local_file_and_large(self, store: Store, tmp_path: Path) -> None:
        src = tmp_path / "big.neff"
        data = os.urandom(3 << 20) * 7  # 21 MiB: above any multipart threshold
        src.write_bytes(data)
        assert store.put_file("big/model.neff", src)
        dest = tmp_path / "back"
        store.get_file("big/model.neff", dest)
        assert dest.read_bytes() == data
        assert src.exists(), "put_file without move must not consume the source"

    @pytest.mark.parametrize("size", [5000, 21 << 20])  # one request; multipart on S3
    def test_verified_put_writes_only_what_matches(self, store: Store, tmp_path: Path, size: int) -> None:
        src = tmp_path / "model.neff"
        data = os.urandom(size)
        src.write_bytes(data)
        good = sha256_bytes(data)
        bad = FileDigest("0" * 64, size)
        for exclusive in (False, True):
            with pytest.raises(CorruptEntry):
                store.put_file(f"v{exclusive}/model.neff", src, exclusive=exclusive, expect=bad)
            assert store.stat(f"v{exclusive}/model.neff") is None, "a mismatch must leave nothing visible"
            assert store.put_file(f"v{exclusive}/model.neff", src, exclusive=exclusive, expect=good)
            dest = tmp_path / f"back{exclusive}"
            got = store.get_file(f"v{exclusive}/model.neff", dest)
            assert dest.read_bytes() == data
            assert got is None or got == good, "get_file's digest is of the bytes it wrote"
        with pytest.raises(CorruptEntry):
            store.put_file("b/x", b"bytes", expect=bad)
        assert store.stat("b/x") is None

    def test_overwrite_and_exclusive(self, store: Store) -> None:
        assert store.put_file("x", b"one")
        assert store.put_file("x", b"two")
        assert store.read_bytes("x") == b"two"
        assert store.put_file("x", b"three", exclusive=True) is False
        assert store.read_bytes("x") == b"two"
        assert store.put_file("y", b"first", exclusive=True) is True

    def test_delete(self, store: Store) -> None:
        store.put_file("d/1", b"1")
        store.put_file("d/2", b"2")
        assert store.delete(["d/1", "d/2", "d/missing"]) == 2
        assert store.stat("d/1") is None
        assert list(store.iter_files()) == []

    def test_missing_read_raises(self, store: Store) -> None:
        with pytest.raises(EntryNotFound), store.open_read("no/such"):
            pass
        assert store.stat("no/such") is None

    @pytest.mark.parametrize("bad", ["../etc/passwd", "/abs/path", "a/../../b", "a\\b", "a/\x00", "..", ""])
    def test_path_traversal_rejected(self, store: Store, bad: str) -> None:
        with pytest.raises(InvalidKey):
            store.put_file(bad, b"x")
        with pytest.raises(InvalidKey):
            store.stat(bad)
        with pytest.raises(InvalidKey):
            store.discard([bad], prune_dirs=True)
        with pytest.raises(InvalidKey):
            store.exists(bad)
        assert list(store.iter_files()) == []

    # -- entries ------------------------------------------------------------------------------
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

    # -- leases -------------------------------------------------------------------------------
    def test_lease_exclusive_and_takeover(self, store: Store) -> None:
        first = acquire(store, "compile:g1", ttl=60)
        second = try_acquire(store, "compile:g1", ttl=60, owner="other")
        assert isinstance(second, LeaseRecord) and second.token == first.record.token
        first.release()
        third = acquire(store, "compile:g1", ttl=0.2, owner="third")
        import time

        time.sleep(0.3)  # third's lease is past its expiry: anyone may take it over
        fourth = acquire(store, "compile:g1", ttl=60, owner="fourth")
        assert not third.renew()  # the old holder learns it lost the lease
        current = read_lease(store, "compile:g1")
        assert current is not None and current.owner == "fourth"
        fourth.release()
        assert read_lease(store, "compile:g1") is None

    def test_live_lease_not_taken(self, store: Store) -> None:
        holder = acquire(store, "compile:g2", ttl=0.5)
        holder.keep_alive(0.05)
        import time

        time.sleep(0.8)  # longer than the ttl, but the heartbeat keeps it alive
        got = try_acquire(store, "compile:g2", owner="intruder")
        assert isinstance(got, LeaseRecord)
        holder.release()


class ReadOnlyContract:
    def test_read_only_refuses_writes(self, readonly_store: Store) -> None:
        with pytest.raises(ReadOnlyStore):
            readonly_store.put_file("x", b"1")
        with pytest.raises(ReadOnlyStore):
            readonly_store.delete(["x"])
