"""A runtime-written entry (no manifest) pushed to S3: each file is read once, the manifest is made
of the digests of the bytes sent, and a NEFF rewritten meanwhile never commits a torn entry.
The exclusive write of the NEFF, which stands in for a lookup of the marker, never overwrites a
rival's committed entry and does overwrite a killed publish's leftovers. Pull fetches each
object once.

Against moto's real HTTP server, through the fault proxy (which counts requests). The reads are
counted with an audit hook on ``open``: the push runs in this process, so every open of a
source file is seen, whichever thread makes it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import boto3
import pytest

from bench.common import make_runtime_cache
from neffcache.coordination import releases
from neffcache.operations.ingest import build_manifest
from neffcache.operations.publish import publish
from neffcache.outcomes import PublishStatus
from neffcache.replication.sync import pull, push
from neffcache.stores.base import FileSource
from neffcache.stores.hashed_io import SETTLE
from neffcache.stores.local import LocalStore
from neffcache.stores.s3 import S3Store
from neffcache.testing.faultproxy import FaultProxy
from neffcache.testing.store_contract import publish_a
from neffcache.testing.store_contract.sample import LAYOUT_A, TC
from tests.hostile.test_transfer_race import NEFF_SIZE, Rewriter, neff_bytes
from tests.hostile.test_transfer_race import remote_objects as objects
from tests.stores.conftest import BUCKET, aws_env, moto_server, s3_endpoint  # noqa: F401 - fixtures

pytestmark = pytest.mark.s3

PART = 5 << 20  # S3's smallest part: NEFFs above it go up in parts, the others in one PUT
_opens: Counter[str] = Counter()
_watched: list[Path] = []  # the root whose reads are counted (empty: none)
_lock = threading.Lock()


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "open" or not _watched or not isinstance(args[0], str | Path):
        return
    path, mode, flags = args
    reading = (mode is not None and "r" in mode and "+" not in mode) or (
        mode is None and isinstance(flags, int) and flags & os.O_ACCMODE == os.O_RDONLY)
    if not reading:
        return
    with _lock:
        if str(path).startswith(str(_watched[0])):
            _opens[Path(path).relative_to(_watched[0]).as_posix()] += 1
        elif not os.path.isabs(path):  # LocalStore's descriptor walk opens names relative to a directory
            _opens[f"relative:{os.path.basename(path)}"] += 1


sys.addaudithook(_audit)


def assert_matches_manifest(found: dict[str, bytes], entry: str) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads(found[f"{entry}/neffcache.json"])
    assert manifest["computed"] is True
    for name, digest in manifest["files"].items():
        data = found[f"{entry}/{name}"]
        assert (hashlib.sha256(data).hexdigest(), len(data)) == (digest["sha256"], digest["size"]), name
    return manifest


def test_push_of_runtime_entries_reads_each_file_once_and_costs_six_requests(
        s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setattr(releases, "MAX_DELAY", 60.0)  # the leases' one batch, however slow the machine
    root = tmp_path / "runtime"
    make_runtime_cache(root, 5)  # NEFFs of 100 kB to 3 MB: one PUT each
    big = root / "trn2-lnc2/neuronxcc-2.27.5334.0+f702b353/MODULE_7+d41d8cd9"
    big.mkdir()
    (big / "model.hlo_module.pb").write_bytes(b"HLO" * 1000)
    (big / "compile_flags.json").write_text("[]")
    (big / "model.neff").write_bytes(neff_bytes(7))  # 12 MiB: three parts
    (big / "model.done").touch()
    entries = sorted(p.parent for p in root.rglob("model.done"))
    time.sleep(SETTLE + 0.1)  # files older than SETTLE are trusted after one read (hashed_io.settled)
    seen: list[tuple[str, str]] = []

    def record(method: str, path: str, headers: dict[str, str]) -> str | None:
        with _lock:
            seen.append((method, path))
        return None

    with FaultProxy(s3_endpoint, rule=record) as proxy:
        remote = S3Store(f"s3://{BUCKET}/once", endpoint_url=proxy.url, multipart_threshold=PART,
                         multipart_chunksize=PART, max_concurrency=3)  # as the CLI does for --parallel 3
        _opens.clear()
        _watched.append(root)
        try:
            report = push(LocalStore(root, read_only=True), remote, parallel=3)
        finally:
            _watched.clear()
            remote.close()
    assert report.ok and len(report.copied) == len(entries), report
    # Connections are reused: the pool (2 x 3 + 8) holds one for every thread that can call at
    # once (3 entries, 3 part uploaders), so none is opened again per request.
    assert proxy.connections <= 2 * 3 + 8 and proxy.connections < len(seen) // 3, (proxy.connections, len(seen))
    found = objects(s3_endpoint, "once/")
    for directory in entries:
        entry = directory.relative_to(root).as_posix()
        manifest = assert_matches_manifest(found, entry)
        assert set(manifest["files"]) == {"model.hlo_module.pb", "compile_flags.json", "model.neff", "model.done"}
        for name in ("model.hlo_module.pb", "model.done", "compile_flags.json"):
            assert _opens[f"{entry}/{name}"] == 1, (name, _opens)  # the read that sends it
        # The NEFF: the read that hashes and sends it, and publish's probe of its first bytes for
        # a `plan` placeholder (neffcache/placeholder.py), which reads no data that is sent.
        assert _opens[f"{entry}/model.neff"] == 2, _opens
    # ... and none through the store's own reads, except the flags file's, read once more for
    # the flags the manifest records.
    files = {f"relative:{n}" for n in ("model.neff", "model.hlo_module.pb", "model.done", "compile_flags.json")}
    assert {n: c for n, c in _opens.items() if n in files} == {"relative:compile_flags.json": len(entries)}, _opens
    sizes = [(d / "model.neff").stat().st_size for d in entries]
    multipart = sum(1 for size in sizes if size > PART)
    parts = sum(-(-size // PART) for size in sizes if size > PART)
    assert 0 < multipart < len(entries)  # both paths were taken
    listings = [p for m, p in seen if m == "GET" and "list-type=2" in p]
    assert len(listings) == 1, listings
    # Per entry, as for an entry with a manifest (tests/stores/test_s3_sync.py): lease PUT, the
    # exclusive NEFF PUT (no marker lookup), 2 data + manifest + marker PUTs: 6; the leases are
    # deleted together (one POST). A NEFF in parts costs create (POST) + its parts (PUT) +
    # complete (POST) for its one PUT.
    by_method = Counter(m for m, p in seen if "list-type=2" not in p)
    assert by_method == {"PUT": 6 * len(entries) - multipart + parts, "POST": 1 + 2 * multipart}


def test_push_of_a_runtime_entry_while_its_neff_is_rewritten_never_commits_a_torn_one(
        s3_endpoint: str, tmp_path: Path) -> None:  # noqa: F811
    """No manifest to check against: what protects the entry is that the NEFF must hold still
    while it is read (fstat before and after, and a second read for a file modified moments
    before). Whatever is committed matches its manifest, and is the NEFF as it stood whole."""
    root = tmp_path / "runtime"
    outcomes = []
    for i in range(10):
        entry = f"trn2-lnc2/neuronxcc-2.27.5334.0+f702b353/MODULE_{i}+d41d8cd9"
        directory = root / entry
        directory.mkdir(parents=True)
        original = neff_bytes(i)
        (directory / "model.hlo_module.pb").write_bytes(b"HLO" * 100)
        (directory / "compile_flags.json").write_text("[]")
        (directory / "model.neff").write_bytes(original)
        (directory / "model.done").touch()
        remote = S3Store(f"s3://{BUCKET}/torn{i}", endpoint_url=s3_endpoint, multipart_threshold=PART,
                         multipart_chunksize=PART)
        try:
            with Rewriter(directory / "model.neff", original) as rewriter:
                report = push(LocalStore(root, read_only=True), remote, paths=[entry])
        finally:
            remote.close()
        assert rewriter.flips > 0
        found = objects(s3_endpoint, f"torn{i}/")
        if f"{entry}/model.done" in found:
            manifest = assert_matches_manifest(found, entry)
            assert manifest["files"]["model.neff"]["size"] == NEFF_SIZE
            outcomes.append("committed")
        else:
            assert [f.path for f in report.failed] == [entry], report
            assert "changed while it was being copied" in report.failed[0].reason
            assert f"{entry}/neffcache.json" not in found  # refused before the manifest: garbage
            outcomes.append("refused")
    print(f"{outcomes.count('committed')} committed (matching), {outcomes.count('refused')} refused")


def test_pull_gets_each_object_once_and_the_empty_marker_not_at_all(s3_endpoint: str, tmp_path: Path) -> None:  # noqa: F811
    """Back down: the listing, then per entry the manifest and each non-empty file, one GET each
    (4 for a layout-A entry); model.done, listed as empty, is created empty, not fetched."""
    root = tmp_path / "runtime"
    make_runtime_cache(root, 4)
    remote = S3Store(f"s3://{BUCKET}/down", endpoint_url=s3_endpoint)
    try:
        assert push(LocalStore(root, read_only=True), remote).ok
    finally:
        remote.close()
    seen: list[tuple[str, str]] = []

    def record(method: str, path: str, headers: dict[str, str]) -> str | None:
        with _lock:
            seen.append((method, path.split("?", 1)[0]))
        return None

    dst = LocalStore(tmp_path / "dst")
    with FaultProxy(s3_endpoint, rule=record) as proxy:
        remote = S3Store(f"s3://{BUCKET}/down", endpoint_url=proxy.url)
        try:
            report = pull(remote, dst, parallel=2)
        finally:
            remote.close()
    assert report.ok and len(report.copied) == 4, report
    gets = Counter(path.rsplit("/", 1)[-1] for method, path in seen if method == "GET")
    assert gets == {BUCKET: 1, "neffcache.json": 4, "model.hlo_module.pb": 4, "compile_flags.json": 4,
                    "model.neff": 4}, gets  # BUCKET: the one listing
    assert len(seen) == 1 + 4 * 4, seen
    for done in (tmp_path / "dst").rglob("model.done"):
        assert done.stat().st_size == 0
    assert len(list((tmp_path / "dst").rglob("model.done"))) == 4


@pytest.mark.parametrize("computed", [False, True], ids=["with manifest", "computed manifest"])
def test_a_publisher_that_lost_the_race_never_overwrites_the_winners_data(
        s3_endpoint: str, tmp_path: Path, computed: bool) -> None:  # noqa: F811
    """The caller's listing said absent (``known_absent``), then a rival committed the entry: the
    exclusive NEFF write meets the rival's NEFF, the marker says committed, nothing is written."""
    store = S3Store(f"s3://{BUCKET}/race", endpoint_url=s3_endpoint)
    try:
        entry, rival = publish_a(store, key="MODULE_5+abb26765")
        before = objects(s3_endpoint, "race/")
        ours = tmp_path / "ours"
        ours.mkdir()
        files = {"model.hlo_module.pb": b"HLO:ours", "compile_flags.json": b'["--model-type=transformer"]',
                 "model.neff": b"NEFF ours" + os.urandom(4096), "model.done": b""}
        for name, data in files.items():
            (ours / name).write_bytes(data)
        sources: dict[str, FileSource] = {n: ours / n for n in files}
        manifest = build_manifest("neuronxcc", "MODULE_5+abb26765", sources, toolchain=TC)
        if computed:
            manifest = dataclasses.replace(manifest, files={}, computed=True)
        result = publish(store, LAYOUT_A.namespace_for(TC), "MODULE_5+abb26765", sources, manifest,
                         known_absent=True, unhashed=frozenset(files) if computed else frozenset())
    finally:
        store.close()
    assert result.status is PublishStatus.EXISTS
    after = objects(s3_endpoint, "race/")
    assert {k: v for k, v in after.items() if "/.neffcache/" not in k} == {
        k: v for k, v in before.items() if "/.neffcache/" not in k}
    assert after[f"{entry}/model.neff"] == rival


def test_leftovers_of_a_killed_publish_are_overwritten(s3_endpoint: str, tmp_path: Path) -> None:  # noqa: F811
    """A NEFF without its marker (a publisher killed midway) is garbage: the exclusive NEFF write
    meets it, the marker is absent, and the entry is published over it."""
    root = tmp_path / "runtime"
    make_runtime_cache(root, 1)
    entry = next(p.parent for p in root.rglob("model.done")).relative_to(root).as_posix()
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    client.put_object(Bucket=BUCKET, Key=f"left/{entry}/model.neff", Body=b"half a publish")
    remote = S3Store(f"s3://{BUCKET}/left", endpoint_url=s3_endpoint)
    try:
        report = push(LocalStore(root, read_only=True), remote)
    finally:
        remote.close()
    assert report.ok and [c.path for c in report.copied] == [entry], report
    found = objects(s3_endpoint, "left/")
    assert found[f"{entry}/model.neff"] == (root / entry / "model.neff").read_bytes()
    assert_matches_manifest(found, entry)
