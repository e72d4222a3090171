"""A source rewritten while it is copied never commits an entry that does not match its manifest.

Against moto's real HTTP server. The rewrite is driven two ways: deterministically, from a
fault proxy rule that rewrites the NEFF while it holds the push's first write request (after
the listing, before any byte of the NEFF is read for the upload); and by a thread that
rewrites part of the NEFF in a loop during the push. Either way the invariant is the same:
the entry is absent at the destination, or its bytes match its manifest and that manifest is
the source's (the bytes it describes are the ones the source entry was published with).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from neffcache.replication.sync import SyncReport, pull, push
from neffcache.scan.report import load_entry
from neffcache.stores.local import LocalStore
from neffcache.stores.s3 import S3Store
from neffcache.testing.faultproxy import FaultProxy
from neffcache.testing.store_contract import publish_a
from tests.stores.conftest import BUCKET, aws_env, moto_server, s3_endpoint  # noqa: F401 - fixtures

pytestmark = pytest.mark.s3

REPEAT = 20
PART = 5 << 20  # S3's smallest part: a 12 MiB NEFF goes up in three parts
NEFF_SIZE = 12 << 20
_FAILED_REASONS = ("changed while it was being copied", "corrupt at the source")


def neff_bytes(seed: int) -> bytes:
    block = hashlib.sha256(str(seed).encode()).digest() * 2048
    return (block * (NEFF_SIZE // len(block) + 1))[:NEFF_SIZE]


def s3(url: str, endpoint: str) -> S3Store:
    return S3Store(url, endpoint_url=endpoint, multipart_threshold=PART, multipart_chunksize=PART)


def remote_objects(endpoint: str, prefix: str) -> dict[str, bytes]:
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for obj in page.get("Contents", ()):
            out[obj["Key"].removeprefix(prefix)] = client.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read()
    return out


def assert_never_mismatched(objects: dict[str, bytes], entry: str, original: bytes, report: SyncReport) -> str:
    """The invariant; returns "committed" or "failed"."""
    if f"{entry}/model.done" not in objects:
        assert [f.path for f in report.failed] == [entry], report
        assert any(r in report.failed[0].reason for r in _FAILED_REASONS), report.failed[0].reason
        # The NEFF that did not match was never made visible (its multipart upload aborted);
        # what else was written is an uncommitted directory, garbage for prune --garbage.
        assert f"{entry}/model.neff" not in objects
        return "failed"
    manifest = json.loads(objects[f"{entry}/neffcache.json"])
    for name, digest in manifest["files"].items():
        data = objects[f"{entry}/{name}"]
        assert hashlib.sha256(data).hexdigest() == digest["sha256"], f"{name} committed unlike its manifest"
        assert len(data) == digest["size"]
    # ... and the manifest is the source's own: the NEFF it describes is the one published.
    assert manifest["files"]["model.neff"]["sha256"] == hashlib.sha256(original).hexdigest()
    return "committed"


@pytest.fixture
def src(tmp_path: Path) -> Iterator[LocalStore]:
    yield LocalStore(tmp_path / "src")


def test_push_of_a_neff_rewritten_before_its_upload_never_commits(s3_endpoint: str, src: LocalStore) -> None:  # noqa: F811
    """Deterministic: the NEFF is rewritten after the push listed (and, before the fix, hashed)
    the entry and before the upload reads it. Before the fix: committed with the new bytes
    under the old manifest, every time."""
    outcomes = []
    for i in range(REPEAT):
        original = neff_bytes(i)
        entry, _ = publish_a(src, key=f"MODULE_{i}+abb26765", neff=original)
        neff = src.root / entry / "model.neff"
        fired = threading.Event()

        def rewrite_on_first_write(method: str, path: str, headers: dict[str, str], neff: Path = neff,
                                   fired: threading.Event = fired, other: bytes = neff_bytes(10_000 + i)
                                   ) -> str | None:
            if method in ("PUT", "POST") and not fired.is_set():
                fired.set()
                neff.write_bytes(other)  # same size: only the digest tells
            return None

        with FaultProxy(s3_endpoint, rule=rewrite_on_first_write) as proxy:
            dst = s3(f"s3://{BUCKET}/race{i}", proxy.url)
            try:
                report = push(src, dst, paths=[entry])
            finally:
                dst.close()
        assert fired.is_set()
        outcomes.append(assert_never_mismatched(remote_objects(s3_endpoint, f"race{i}/"), entry, original, report))
        assert "changed while it was being copied" in report.failed[0].reason
    assert outcomes == ["failed"] * REPEAT


class Rewriter:
    """Flips one block of the NEFF's last part between its published bytes and others, in a loop."""

    def __init__(self, path: Path, original: bytes) -> None:
        self.path = path
        self.offset = NEFF_SIZE - 3 * 4096
        self.good = original[self.offset:self.offset + 4096]
        self.stop = threading.Event()
        self.flips = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        fd = os.open(self.path, os.O_WRONLY)
        try:
            while not self.stop.is_set():
                os.pwrite(fd, os.urandom(4096), self.offset)
                self.stop.wait(0.001)
                os.pwrite(fd, self.good, self.offset)
                self.flips += 1
                self.stop.wait(0.001)
        finally:
            os.close(fd)

    def __enter__(self) -> Rewriter:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def test_push_while_the_neff_is_rewritten_in_a_loop(s3_endpoint: str, src: LocalStore) -> None:  # noqa: F811
    outcomes = []
    for i in range(REPEAT):
        original = neff_bytes(i)
        entry, _ = publish_a(src, key=f"MODULE_{i}+abb26765", neff=original)
        dst = s3(f"s3://{BUCKET}/loop{i}", s3_endpoint)
        try:
            with Rewriter(src.root / entry / "model.neff", original) as rewriter:
                report = push(src, dst, paths=[entry])
        finally:
            dst.close()
        assert rewriter.flips > 0
        outcomes.append(assert_never_mismatched(remote_objects(s3_endpoint, f"loop{i}/"), entry, original, report))
    print(f"{outcomes.count('committed')} committed (matching), {outcomes.count('failed')} refused")


def test_local_push_while_the_neff_is_rewritten_in_a_loop(src: LocalStore, tmp_path: Path) -> None:
    """Local -> local: the staged copy is hashed, and that copy is what gets renamed in."""
    dst = LocalStore(tmp_path / "dst")
    for i in range(REPEAT):
        original = neff_bytes(i)
        entry, _ = publish_a(src, key=f"MODULE_{i}+abb26765", neff=original)
        with Rewriter(src.root / entry / "model.neff", original):
            report = push(src, dst, paths=[entry])
        objects = {p.relative_to(dst.root).as_posix(): p.read_bytes()
                   for p in (dst.root / entry).glob("*") if p.is_file()} if (dst.root / entry).is_dir() else {}
        assert_never_mismatched(objects, entry, original, report)


def test_pull_of_an_object_replaced_before_its_download_never_commits(s3_endpoint: str,  # noqa: F811
                                                                      src: LocalStore, tmp_path: Path) -> None:
    """The remote NEFF is replaced (by another writer) after the pull listed the entry and
    read its manifest, before the download: the bytes hashed while written to the staging
    file do not match, and nothing is renamed into the destination."""
    original = neff_bytes(1)
    entry, _ = publish_a(src, key="MODULE_1+abb26765", neff=original)
    remote = s3(f"s3://{BUCKET}/pull", s3_endpoint)
    try:
        assert push(src, remote).ok
    finally:
        remote.close()
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    fired = threading.Event()

    def replace_on_neff_get(method: str, path: str, headers: dict[str, str]) -> str | None:
        if method == "GET" and path.split("?", maxsplit=1)[0].endswith("/model.neff") and not fired.is_set():
            fired.set()
            client.put_object(Bucket=BUCKET, Key=f"pull/{entry}/model.neff", Body=neff_bytes(99))
        return None

    dst = LocalStore(tmp_path / "dst")
    with FaultProxy(s3_endpoint, rule=replace_on_neff_get) as proxy:
        remote = s3(f"s3://{BUCKET}/pull", proxy.url)
        try:
            report = pull(remote, dst)
        finally:
            remote.close()
    assert fired.is_set()
    assert [f.path for f in report.failed] == [entry]
    assert "corrupt at the source" in report.failed[0].reason
    found = load_entry(dst, entry)
    assert found is None or not found.committed
    assert not (dst.root / entry / "model.done").exists()
