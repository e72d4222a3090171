"""A full destination is "no space at the destination", never corruption at the source.

The disk is really full for the process that writes: each command runs as a subprocess with
``RLIMIT_FSIZE`` set and SIGXFSZ ignored, so a write past the limit is short and the next one
fails with EFBIG, exactly what a full disk does with ENOSPC (a tmpfs or loop mount would need
privileges the test suite does not assume). Nothing may be quarantined and the source must be
untouched.
"""

from __future__ import annotations

import hashlib
import json
import resource
import signal
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from neffcache.replication.sync import push
from neffcache.stores.local import LocalStore
from neffcache.stores.s3 import S3Store
from neffcache.testing.store_contract import publish_a
from tests.stores.conftest import BUCKET, aws_env, moto_server, s3_endpoint  # noqa: F401 - fixtures

LIMIT = 1 << 20  # the destination "fills up" at 1 MiB per file
NEFF = 3 << 20
NO_SPACE_EXIT = 12


def limited() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def run_full(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "neffcache.cli.main", *args], capture_output=True, text=True,
                          preexec_fn=limited, timeout=120, check=False)


def tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and ".neffcache" not in p.parts}


def bucket(endpoint: str) -> dict[str, str]:
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    return {o["Key"]: o["ETag"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
            for o in page.get("Contents", ())}


def assert_no_space(proc: subprocess.CompletedProcess[str], dst: Path) -> None:
    assert proc.returncode == NO_SPACE_EXIT, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("neffcache:")]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"neffcache: no space at the destination file://{dst}"), lines[0]
    assert "corrupt" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.s3
def test_pull_into_a_full_disk(s3_endpoint: str, tmp_path: Path) -> None:  # noqa: F811
    src = LocalStore(tmp_path / "src")
    entry, _ = publish_a(src, neff=b"NEFF" + bytes(NEFF))
    remote = S3Store(f"s3://{BUCKET}/cache", endpoint_url=s3_endpoint)
    try:
        assert push(src, remote).ok
    finally:
        remote.close()
    before = bucket(s3_endpoint)
    dst = tmp_path / "dst"
    proc = run_full("pull", f"s3://{BUCKET}/cache", str(dst), "--endpoint-url", s3_endpoint)
    assert_no_space(proc, dst)
    assert bucket(s3_endpoint) == before  # nothing quarantined, nothing touched at the source
    assert not any("quarantine" in key for key in before)
    assert not (dst / entry / "model.done").exists()
    assert not (dst / ".neffcache" / "quarantine").exists()


def test_local_push_into_a_full_disk(tmp_path: Path) -> None:
    src = LocalStore(tmp_path / "src")
    entry, _ = publish_a(src, neff=b"NEFF" + bytes(NEFF))
    before = tree(src.root)
    dst = tmp_path / "dst"
    proc = run_full("push", str(src.root), str(dst))
    assert_no_space(proc, dst)
    assert tree(src.root) == before
    assert not (src.root / ".neffcache" / "quarantine").exists()
    assert not (dst / entry / "model.done").exists()


TIERS_SCRIPT = """
import json, sys
from neffcache.stores import open_store
from neffcache.stores.local import LocalStore
from neffcache.replication.tiers import Tiers
full, remote, endpoint, path = sys.argv[1:]
options = {"endpoint_url": endpoint} if remote.startswith("s3://") else {}
chain = Tiers([LocalStore(full), open_store(remote, **options)], quarantine_remote=True)
hit = chain.get_entry(path)
print(json.dumps({"hit": hit is not None, "problems": [p.to_json() for p in chain.problems]}))
"""


def straddling() -> None:
    # The last write of the NEFF crosses the limit: short, and the final one. Unchecked, the
    # file is silently truncated, its digest mismatches, and the healthy source is "corrupt".
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT + (100 << 10), LIMIT + (100 << 10)))


@pytest.mark.parametrize("remote_kind", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_promotion_into_a_full_tier_never_quarantines_the_source(remote_kind: str, tmp_path: Path,
                                                                 request: pytest.FixtureRequest) -> None:
    neff = b"NEFF" + bytes(LIMIT + (400 << 10))
    if remote_kind == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        url = f"s3://{BUCKET}/cache"
        src = LocalStore(tmp_path / "src")
        entry, _ = publish_a(src, neff=neff)
        store = S3Store(url, endpoint_url=endpoint)
        try:
            assert push(src, store).ok
        finally:
            store.close()
        snapshot = lambda: bucket(endpoint)  # noqa: E731
    else:
        endpoint = ""
        remote = LocalStore(tmp_path / "remote")
        entry, _ = publish_a(remote, neff=neff)
        url = str(remote.root)
        snapshot = lambda: tree(remote.root)  # noqa: E731
    before = snapshot()
    full = tmp_path / "full"
    proc = subprocess.run([sys.executable, "-c", TIERS_SCRIPT, str(full), url, endpoint, entry],
                          capture_output=True, text=True, preexec_fn=straddling, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["problems"], out
    for problem in out["problems"]:
        assert problem["kind"] != "corrupt", problem
        assert problem["tier"] == f"file://{full}", problem  # the full tier is blamed, not the source
        assert "no space at the destination" in problem["message"], problem
    assert snapshot() == before
    assert not any("quarantine" in key for key in before)
    if remote_kind == "local":
        assert not (tmp_path / "remote" / ".neffcache" / "quarantine").exists()
