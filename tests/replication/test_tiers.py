"""Tiered chains: promotion, fan-out publishing, down tiers, digest mismatches."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from neffcache.entry import EntryState
from neffcache.layouts import get_layout
from neffcache.operations.ingest import build_manifest
from neffcache.operations.verify import CheckStatus, verify
from neffcache.outcomes import PublishStatus
from neffcache.replication.tiers import Tier, Tiers
from neffcache.scan.report import load_entry, scan
from neffcache.stores import open_store
from neffcache.stores.base import Store
from neffcache.stores.fsspec_store import FsspecStore
from neffcache.stores.local import LocalStore
from neffcache.testing.store_contract import TC, publish_a


@pytest.fixture
def memory() -> Iterator[FsspecStore]:
    store = open_store(f"memory://tiers-{secrets.token_hex(6)}/cache")
    assert isinstance(store, FsspecStore)
    yield store
    if store.fs.exists(store.root):
        store.fs.rm(store.root, recursive=True)


@pytest.fixture
def chain(tmp_path: Path, memory: FsspecStore) -> Iterator[Tiers]:
    tiers = Tiers.open([str(tmp_path / "nvme"), f"fsx://{tmp_path / 'fsx'}", memory.url])
    yield tiers
    tiers.close()


def store_of(chain: Tiers, i: int) -> Store:
    store = chain.tiers[i].store
    assert store is not None
    return store


def tamper(store: Store, path: str) -> None:
    neff = f"{path}/model.neff"
    size = store.stat(neff)
    assert size is not None
    store.put_file(neff, b"X" * size.size)  # same size: only the digests can tell


def test_hit_in_a_lower_tier_is_promoted_and_verified(chain: Tiers) -> None:
    nvme, fsx, remote = (store_of(chain, i) for i in range(3))
    path, neff = publish_a(remote)
    hit = chain.get_entry(path)
    assert hit is not None and hit.store is nvme and hit.found_in == remote.url
    assert hit.promoted_to == (nvme.url, fsx.url)
    assert hit.entry.state is EntryState.SUCCESS and hit.entry.manifest is not None
    assert nvme.read_bytes(f"{path}/model.neff") == neff
    for store in (nvme, fsx):
        assert verify(store).count(CheckStatus.OK) == 1
    again = chain.get_entry(path)
    assert again is not None and again.found_in == nvme.url and again.promoted_to == ()
    assert chain.get_entry("trn2-lnc2/neuronxcc-2.27.5334.0+f702b353/MODULE_404+abb26765") is None
    assert chain.problems == ()


def test_middle_tier_fills_the_first(chain: Tiers) -> None:
    nvme, fsx, _ = (store_of(chain, i) for i in range(3))
    path, _ = publish_a(fsx)
    hit = chain.get_entry(path)
    assert hit is not None and hit.found_in == fsx.url and hit.promoted_to == (nvme.url,)


def test_down_tier_is_reported_and_skipped(tmp_path: Path, memory: FsspecStore,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from neffcache.stores.s3 import S3Store
    from tests.stores.moto_server import free_port

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    dead = S3Store("s3://bucket/cache", endpoint_url=f"http://127.0.0.1:{free_port()}", max_attempts=1)
    nvme = LocalStore(tmp_path / "nvme")
    chain = Tiers([nvme, dead, memory])
    path, _ = publish_a(memory)
    hit = chain.get_entry(path)
    assert hit is not None and hit.found_in == memory.url and hit.promoted_to == (nvme.url,)
    (problem,) = chain.problems
    assert problem.tier == dead.url and problem.kind == "down" and "cannot reach" in problem.message
    path2, _ = publish_a(memory, key="MODULE_2+abb26765")
    assert chain.get_entry(path2) is not None
    assert len(chain.problems) == 1, "a down tier is skipped for a while, not retried on every lookup"
    result = chain.publish(*_new_entry("MODULE_3+abb26765"))
    assert {url for url, _ in result.results} == {nvme.url, memory.url} and result.ok
    chain.close()


def test_tier_that_cannot_be_opened_starts_down(tmp_path: Path, memory: FsspecStore) -> None:
    chain = Tiers.open([str(tmp_path / "nvme"), str(tmp_path / "missing-mount"), memory.url],
                       read_only=[str(tmp_path / "missing-mount")])
    assert [p.op for p in chain.problems] == ["open"] and "does not exist" in chain.problems[0].message
    path, _ = publish_a(memory)
    assert chain.get_entry(path) is not None


def test_digest_mismatch_is_reported_and_never_served(chain: Tiers) -> None:
    nvme, _fsx, remote = (store_of(chain, i) for i in range(3))
    path, _ = publish_a(remote)
    tamper(remote, path)
    assert chain.get_entry(path) is None
    (problem,) = chain.problems
    assert problem.kind == "corrupt" and problem.tier == remote.url and "sha256" in problem.message
    assert load_entry(nvme, path) is None and scan(nvme).uncommitted == ()
    assert load_entry(remote, path) is not None, "the remote copy is left alone by default"


def test_corrupt_copy_falls_through_to_a_healthy_one(chain: Tiers) -> None:
    nvme, fsx, remote = (store_of(chain, i) for i in range(3))
    path, neff = publish_a(remote)
    publish_a(fsx, neff=neff)
    tamper(fsx, path)
    hit = chain.get_entry(path)
    assert hit is not None and hit.found_in == remote.url and hit.store is nvme
    assert nvme.read_bytes(f"{path}/model.neff") == neff
    assert [p.kind for p in chain.problems] == ["corrupt"]


def test_quarantine_remote_when_asked(tmp_path: Path, memory: FsspecStore) -> None:
    chain = Tiers([LocalStore(tmp_path / "nvme"), memory], quarantine_remote=True)
    path, _ = publish_a(memory)
    tamper(memory, path)
    assert chain.get_entry(path) is None
    assert scan(memory).entries == ()


def test_read_only_chain_serves_in_place_after_hashing(tmp_path: Path, memory: FsspecStore) -> None:
    path, _ = publish_a(memory)
    (tmp_path / "ro").mkdir()
    top = open_store(str(tmp_path / "ro"), read_only=True)  # e.g. a read-only FSx mount
    ro = open_store(memory.url, read_only=True)
    chain = Tiers([top, Tier(ro.url, ro)])
    hit = chain.get_entry(path)
    assert hit is not None and hit.store is ro and hit.promoted_to == ()
    tamper(memory, path)
    assert chain.get_entry(path) is None and chain.problems[0].kind == "corrupt"


def _new_entry(key: str) -> tuple[object, str, dict[str, bytes], object]:
    ns = get_layout("neuronxcc").namespace_for(TC)
    files = {"model.hlo_module.pb": b"HLO" + key.encode(), "model.neff": b"NEFF" * 100, "model.done": b""}
    return ns, key, files, build_manifest("neuronxcc", key, files, toolchain=TC)


def test_publish_goes_to_every_writable_tier(tmp_path: Path, memory: FsspecStore) -> None:
    publish_a(memory)  # something to share
    ro = open_store(memory.url, read_only=True)
    chain = Tiers([LocalStore(tmp_path / "nvme"), LocalStore(tmp_path / "fsx", shared=True), ro])
    result = chain.publish(*_new_entry("MODULE_7+abb26765"))  # type: ignore[arg-type]
    assert [url for url, _ in result.results] == [chain.tiers[0].url, chain.tiers[1].url]
    assert all(r.status is PublishStatus.PUBLISHED for _, r in result.results)
    again = chain.publish(*_new_entry("MODULE_7+abb26765"))  # type: ignore[arg-type]
    assert all(r.status is PublishStatus.EXISTS for _, r in again.results) and again.ok


def test_prefetch_and_push_new(chain: Tiers) -> None:
    nvme, fsx, remote = (store_of(chain, i) for i in range(3))
    shared = [publish_a(remote, key=f"MODULE_{i}+abb26765")[0] for i in range(4)]
    fetched = chain.prefetch(namespaces=["trn2-lnc2"])
    assert fetched.ok and [len(r.copied) for r in fetched.reports] == [0, 4]  # fsx has none, S3 four
    assert sorted(e.path for e in scan(nvme).entries) == sorted(shared)
    new = publish_a(nvme, key="MODULE_99+abb26765")[0]
    pushed = chain.push_new(paths=[new])
    assert [len(r.copied) for r in pushed.reports] == [1, 1]
    assert load_entry(fsx, new) is not None and load_entry(remote, new) is not None


def test_everything_above_down_serves_in_place(memory: FsspecStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from neffcache.stores.s3 import S3Store
    from tests.stores.moto_server import free_port

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    dead = S3Store("s3://bucket/cache", endpoint_url=f"http://127.0.0.1:{free_port()}", max_attempts=1)
    chain = Tiers([dead, memory])
    path, _ = publish_a(memory)
    hit = chain.get_entry(path)
    assert hit is not None and hit.store is memory and hit.promoted_to == ()
    assert [p.kind for p in chain.problems] == ["down"]
    fetched = chain.prefetch()  # into a first tier that is down: reported, not raised
    assert not fetched.ok and [p.tier for p in fetched.problems] == [dead.url]
    chain.close()
