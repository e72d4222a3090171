"""push/pull against S3 under faults, kills and concurrency, and buckets libneuronxla filled."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3
import pytest

from neffcache.coordination import releases
from neffcache.entry import EntryState
from neffcache.operations.verify import CheckStatus, verify
from neffcache.replication.sync import pull, push
from neffcache.scan.report import scan
from neffcache.stores.local import LocalStore
from neffcache.stores.s3 import S3Store
from neffcache.testing.store_contract import publish_a
from tests.runtime_caches import write_neuronxcc_entry
from tests.stores.conftest import BUCKET
from tests.stores.faultproxy import FaultProxy

pytestmark = pytest.mark.s3  # needs moto's server

ENTRY_FILES = {"model.hlo_module.pb", "compile_flags.json", "model.neff", "neffcache.json", "model.done"}


def fill(store: LocalStore, n: int, size: int = 600) -> list[str]:
    return [publish_a(store, key=f"MODULE_{i}+abb26765", neff=os.urandom(size))[0] for i in range(n)]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "neffcache.cli.main", *args]


def assert_exactly_entries(endpoint: str, prefix: str, paths: list[str], src: LocalStore | None = None) -> None:
    """Every entry's files exist once, and nothing else (no temp objects, no leftover leases).

    With ``src``, every object's ETag (the MD5 of a single-part upload) must match the
    source file: each byte of every entry checked from one listing instead of 1500 GETs.
    """
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    objects = {o["Key"]: o["ETag"].strip('"') for page in
               client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
               for o in page.get("Contents", ())}
    expected = {f"{prefix}{p}/{name}" for p in paths for name in ENTRY_FILES}
    assert set(objects) == expected, sorted(set(objects) ^ expected)[:10]
    if src is not None:
        for key, etag in objects.items():
            local = src.root / key.removeprefix(prefix)
            assert hashlib.md5(local.read_bytes()).hexdigest() == etag, key


@pytest.mark.slow
def test_push_through_slowdowns_and_dropped_connections(s3_endpoint: str, tmp_path: Path) -> None:
    src = LocalStore(tmp_path / "src")
    paths = fill(src, 300)
    rates = {"slowdown": 0.08, "drop": 0.03, "lost_reply": 0.03, "cut": 0.03}
    with FaultProxy(s3_endpoint, rates=rates, seed=7) as proxy:
        remote = S3Store(f"s3://{BUCKET}/faults", endpoint_url=proxy.url, max_concurrency=16)
        report = push(src, remote, parallel=16)
        again = push(src, remote, parallel=16)
        back = pull(remote, LocalStore(tmp_path / "back"), parallel=16, paths=paths[:60])
        remote.close()
    assert report.ok, report.failed[:3]
    assert sorted(c.path for c in report.copied) == sorted(paths)  # each published once, by us
    assert again.copied == () and len(again.skipped) == 300
    assert back.ok and len(back.copied) == 60
    assert min(proxy.fates[f] for f in rates) > 10, proxy.fates  # the faults did happen
    assert verify(LocalStore(tmp_path / "back")).count(CheckStatus.OK) == 60
    assert_exactly_entries(s3_endpoint, "faults/", paths, src)  # all 300, byte for byte


@pytest.mark.slow
def test_sigkill_during_multipart_push_leaves_nothing_visible(s3_endpoint: str, tmp_path: Path) -> None:
    src = LocalStore(tmp_path / "src")
    paths = fill(src, 3, size=18 << 20)  # 18 MB NEFFs: multipart, three parts each
    first_part = threading.Event()

    def rule(method: str, path: str, headers: dict[str, str]) -> str | None:
        if "partNumber=" in path:
            first_part.set()
            time.sleep(1.0)  # keep parts in flight while the publisher is killed
        return None

    url = f"s3://{BUCKET}/killed"
    with FaultProxy(s3_endpoint, rule=rule) as proxy:
        proc = subprocess.Popen(cli("push", str(src.root), url, "--endpoint-url", proxy.url, "--parallel", "3"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert first_part.wait(60), "the push never started a multipart upload"
            time.sleep(0.3)
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait(30)
            proc.stdout.close()  # type: ignore[union-attr]
            proc.stderr.close()  # type: ignore[union-attr]
    assert proc.returncode == -signal.SIGKILL
    remote = S3Store(url, endpoint_url=s3_endpoint)
    after_kill = scan(remote)
    assert all(e.state is EntryState.SUCCESS for e in after_kill.entries)
    assert after_kill.uncommitted == () or all(not e.committed for e in after_kill.uncommitted)
    assert len(after_kill.entries) < 3
    assert remote.incomplete_uploads(), "the kill should have interrupted a multipart upload"
    rerun = subprocess.run(cli("push", str(src.root), url, "--endpoint-url", s3_endpoint, "--json"),
                           capture_output=True, text=True, check=False, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["copied"] == 3 - len(after_kill.entries)
    assert sorted(e.path for e in scan(remote).entries) == sorted(paths)
    assert verify(remote).count(CheckStatus.OK) == 3
    assert remote.abort_uploads(remote.incomplete_uploads()) >= 1  # what prune --garbage does
    remote.close()


@pytest.mark.slow
def test_concurrent_push_processes_publish_each_entry_once(s3_endpoint: str, tmp_path: Path) -> None:
    src = LocalStore(tmp_path / "src")
    paths = fill(src, 40)
    url = f"s3://{BUCKET}/shared"
    procs = [subprocess.Popen(cli("push", str(src.root), url, "--endpoint-url", s3_endpoint, "--json",
                                  "--parallel", "8"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outputs]
    reports = [json.loads(out) for out, _ in outputs]
    copied = [path for r in reports for path in r["copied_paths"]]
    assert sorted(copied) == sorted(paths)  # each entry published by exactly one process
    assert all(r["copied"] + r["skipped"] == 40 for r in reports)
    remote = S3Store(url, endpoint_url=s3_endpoint)
    assert verify(remote).count(CheckStatus.OK) == 40
    assert_exactly_entries(s3_endpoint, "shared/", paths)
    remote.close()


def test_bucket_filled_by_libneuronxla(s3_endpoint: str, tmp_path: Path) -> None:
    """A bucket as NEURON_COMPILE_CACHE_URL=s3://bucket/neuron-cache leaves it: no manifests."""
    root = tmp_path / "runtime"
    ok = [write_neuronxcc_entry(root, f"hlo-{i}".encode()) for i in range(3)]
    ok.append(write_neuronxcc_entry(root, b"legacy", legacy=True))
    write_neuronxcc_entry(root, b"failed", state="FAILED")
    write_neuronxcc_entry(root, b"locked", state="LOCKED")
    write_neuronxcc_entry(root, b"empty", state="EMPTY")
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    for file in root.rglob("*"):
        if file.is_file():
            client.put_object(Bucket=BUCKET, Key=f"neuron-cache/{file.relative_to(root)}", Body=file.read_bytes())
    remote = S3Store(f"s3://{BUCKET}/neuron-cache", endpoint_url=s3_endpoint)
    report = scan(remote)
    assert report.by_state() == {"SUCCESS": 4, "FAILED": 1, "LOCKED": 1, "EMPTY": 1, "CORRUPT": 0}
    assert report.garbage == ()  # the runtime's root "lock" file is not garbage
    assert verify(remote).count(CheckStatus.UNVERIFIED) == 4
    local = LocalStore(tmp_path / "managed")
    pulled = pull(remote, local)
    assert sorted(c.path for c in pulled.copied) == sorted(str(p.relative_to(root)) for p in ok)
    entries = scan(local, read_manifests=True).entries
    assert all(e.manifest is not None and e.manifest.computed for e in entries)
    assert verify(local).count(CheckStatus.OK) == 4
    # And back: the manifests computed on ingest can be published into the runtime's bucket.
    assert len(push(local, remote).skipped) == 4  # already there (committed by model.done)
    remote.close()


def test_push_costs_six_requests_per_entry_and_a_delete_per_batch(tmp_path: Path, s3_endpoint: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Publishing an entry the destination's listing lacks: lease PUT, four data PUTs (the
    NEFF's exclusive: it stands in for a marker lookup under the lease, see
    neffcache/operations/publish.py), the exclusive marker PUT; the leases of done entries are
    deleted together, one quiet DeleteObjects per batch (neffcache/coordination/releases.py).
    The request count is what a push costs on S3 (and what moto's per-request CPU made slow):
    keep it."""
    monkeypatch.setattr(releases, "MAX_DELAY", 60.0)  # one batch, however slow the machine
    src = LocalStore(tmp_path / "src")
    paths = fill(src, 5)
    seen: list[tuple[str, str]] = []
    lock = threading.Lock()

    def record(method: str, path: str, headers: dict[str, str]) -> str | None:
        with lock:
            seen.append((method, path))
        return None

    with FaultProxy(s3_endpoint, rule=record) as proxy:
        remote = S3Store(f"s3://{BUCKET}/counted", endpoint_url=proxy.url)
        report = push(src, remote, parallel=2)
        remote.close()
    assert report.ok and len(report.copied) == 5
    listings = [p for m, p in seen if m == "GET" and "list-type=2" in p]
    assert len(listings) == 1, listings  # sync's one listing of the destination, nothing per entry
    by_method = {m: sum(1 for mm, p in seen if mm == m and "list-type=2" not in p) for m in ("PUT", "HEAD", "POST")}
    assert len(seen) - 1 == 6 * len(paths) + 1, by_method
    assert by_method == {"PUT": 30, "HEAD": 0, "POST": 1}, by_method  # the leases: one batch delete
    assert_exactly_entries(s3_endpoint, "counted/", paths, src)  # every lease released too
