"""The byte budget bounds part buffers across concurrent transfers, and never deadlocks them."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from neffcache.errors import CorruptEntry
from neffcache.manifest import FileDigest, sha256_file
from neffcache.stores.budget import ByteBudget
from neffcache.stores.s3 import S3Store
from neffcache.stores.s3_read import download
from neffcache.stores.s3_transfer import upload_multipart

pytestmark = pytest.mark.s3

PART = 5 << 20


def test_budget_clamps_and_counts() -> None:
    budget = ByteBudget(10)
    assert budget.acquire(25) == 10  # bigger than the budget: the whole budget, one at a time
    assert budget.try_acquire(1) is None
    budget.release(10)
    with budget.hold(4) as taken:
        assert taken == 4 and budget.in_use == 4
    assert budget.in_use == 0 and budget.peak == 10


def test_concurrent_uploads_and_downloads_share_a_tiny_budget(s3_store: S3Store, tmp_path: Path) -> None:
    budget = ByteBudget(PART + (1 << 20))  # room for one part at a time, for 8 transfers at once
    sources = []
    for i in range(8):
        src = tmp_path / f"src{i}"
        src.write_bytes(os.urandom(1 << 20) * 17 + bytes([i]))  # 4 parts
        sources.append(src)

    def up(i: int) -> bool:
        sent = upload_multipart(s3_store._call, s3_store.pool, key=s3_store._key(f"b/{i}"), path=f"b/{i}",
                                source=sources[i], chunk=PART, exclusive=True, expect=sha256_file(sources[i]),
                                budget=budget)
        return sent.created

    def down(i: int) -> FileDigest:
        return download(s3_store._call, s3_store.pool, key=s3_store._key(f"b/{i}"), path=f"b/{i}",
                        dest=tmp_path / f"dst{i}", chunk=PART, threshold=PART, budget=budget)

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(up, range(8), timeout=120))
        digests = list(pool.map(down, range(8), timeout=120))
    for i, digest in enumerate(digests):
        assert digest == sha256_file(sources[i]) == sha256_file(tmp_path / f"dst{i}")
    assert budget.peak <= budget.capacity and budget.in_use == 0


@pytest.mark.parametrize("size", [PART, 4 * PART])  # one PutObject; multipart
def test_a_file_that_no_longer_matches_is_never_made_visible(s3_store: S3Store, tmp_path: Path, size: int) -> None:
    src = tmp_path / "src"
    data = os.urandom(size)
    expect = FileDigest(hashlib.sha256(data).hexdigest(), len(data))
    for changed in (data[: size - PART // 2], os.urandom(size)):  # shorter; same size, other bytes
        src.write_bytes(changed)
        with pytest.raises(CorruptEntry):  # it held still while read: corrupt, not "changed"
            s3_store.put_file("c/model.neff", src, expect=expect)
        assert s3_store.stat("c/model.neff") is None
        assert s3_store.incomplete_uploads() == []
