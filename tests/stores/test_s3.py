"""What the S3 store does beyond the contract: errors, listing, batching, lost replies."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from neffcache.errors import AccessDenied, EntryNotFound, InvalidURL, StoreUnavailable
from neffcache.replication.sync import push
from neffcache.scan.report import scan
from neffcache.stores import open_store, s3, s3_list
from neffcache.stores.s3 import S3Store
from neffcache.testing.store_contract import publish_a
from tests.stores.conftest import BUCKET
from tests.stores.faultproxy import FaultProxy

pytestmark = pytest.mark.s3  # needs moto's server


def raw_keys(endpoint: str, prefix: str = "") -> set[str]:
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    keys: set[str] = set()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        keys.update(o["Key"] for o in page.get("Contents", ()))
    return keys


# -- URLs and errors -------------------------------------------------------------------------------
@pytest.mark.parametrize("url", ["s3://", "s3://UPPER/x", "s3://a/../b", "s3://bucket/x?endpoint=y", "s3://b_/x"])
def test_bad_urls(url: str, aws_env: None) -> None:
    with pytest.raises(InvalidURL):
        S3Store(url)


def test_missing_bucket(s3_endpoint: str) -> None:
    store = S3Store("s3://no-such-bucket/cache", endpoint_url=s3_endpoint)
    with pytest.raises(StoreUnavailable, match=r"bucket 'no-such-bucket' does not exist .*aws s3 mb"):
        list(store.iter_files())
    with pytest.raises(StoreUnavailable, match="does not exist"):
        store.check()


def test_missing_bucket_cli_one_line(s3_endpoint: str, tmp_path: Path) -> None:
    publish_a(open_store(str(tmp_path / "src")))
    out = subprocess.run([sys.executable, "-m", "neffcache.cli.main", "push", str(tmp_path / "src"),
                          "s3://no-such-bucket/x", "--endpoint-url", s3_endpoint], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 4
    lines = [line for line in out.stderr.splitlines() if line.strip() and not line.startswith("push")]
    assert len(lines) == 1 and "does not exist" in lines[0], out.stderr


def test_no_credentials(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", raising=False)
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", raising=False)
    store = S3Store(f"s3://{BUCKET}/cache", endpoint_url=s3_endpoint)
    with pytest.raises(StoreUnavailable, match=r"no usable AWS credentials.*AWS_PROFILE"):
        store.stat("x")


def test_access_denied(s3_endpoint: str) -> None:
    with FaultProxy(s3_endpoint, rule=lambda *_: "deny") as proxy:
        store = S3Store(f"s3://{BUCKET}/cache", endpoint_url=proxy.url)
        with pytest.raises(AccessDenied, match=r"access denied.*s3:ListBucket"):
            list(store.iter_files())
        with pytest.raises(AccessDenied):
            store.put_file("x", b"1")
        store.close()


def test_unreachable_endpoint(aws_env: None) -> None:
    from tests.stores.moto_server import free_port

    store = S3Store(f"s3://{BUCKET}/c", endpoint_url=f"http://127.0.0.1:{free_port()}", max_attempts=1)
    with pytest.raises(StoreUnavailable, match="cannot reach"):
        store.stat("x")


def test_endpoint_from_environment(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    store = open_store(f"s3://{BUCKET}/env")
    assert isinstance(store, S3Store) and store.endpoint == s3_endpoint
    store.put_file("a", b"1")
    assert store.read_bytes("a") == b"1"


# -- listing, deleting, big files ------------------------------------------------------------------
@pytest.mark.parametrize(("page", "big_child"), [(7, 3), (7, 1000), (4, 1), (1000, 250)])
def test_parallel_listing_is_exact(s3_store: S3Store, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch,
                                   page: int, big_child: int) -> None:
    # Tiny pages so every branch of the walk runs on a small tree, with names that sort
    # around the "/" boundary (MODULE_5/ vs MODULE_5+x/ vs the file MODULE_5.x).
    monkeypatch.setattr(s3_list, "PAGE", page)
    monkeypatch.setattr(s3_list, "BIG_CHILD", big_child)
    names = {"lock", "ns/MODULE_5.x", "ns/MODULE_5/a", "ns/MODULE_5+x/a", "ns/MODULE_5+x/b", "ns/MODULE_50/a",
             "ns/z", ".neffcache/leases/ab/l1", ".neffcache/leases/cd/l2", "other/deep/er/file", "zz"}
    names |= {f"ns/MODULE_{i}+abb26765/{f}" for i in range(40) for f in ("model.neff", "model.done")}
    names |= {f"b/{i:02x}/{j:02x}/k.neff" for i in range(6) for j in range(4)}
    for name in names:
        s3_store.put_file(name, b"x")
    listed = [f.path for f in s3_store.iter_files()]
    assert len(listed) == len(set(listed)) and set(listed) == names
    assert {f.path for f in s3_store.iter_files("ns")} == {n for n in names if n.startswith("ns/")}
    assert {k.removeprefix("cache/") for k in raw_keys(s3_endpoint, "cache/")} == names


def test_delete_in_batches_counts_what_existed(s3_store: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3, "DELETE_BATCH", 7)
    names = [f"d{i % 5}/f{i}" for i in range(40)]
    for name in names:
        s3_store.put_file(name, b"x")
    assert s3_store.delete([*names[:30], "d1/missing", "nowhere/x"]) == 30
    assert sorted(f.path for f in s3_store.iter_files()) == sorted(names[30:])
    monkeypatch.setattr(s3, "LIST_PARENTS_LIMIT", 2)  # the big-prune path: one listing of the common prefix
    assert s3_store.delete([*names[30:], "d9/missing"]) == 10
    assert list(s3_store.iter_files()) == []


def test_multipart_exclusive(s3_store: S3Store, tmp_path: Path) -> None:
    big = tmp_path / "big"
    data = os.urandom(6 << 20) * 3  # 18 MiB: above the 16 MiB threshold, 3 parts
    big.write_bytes(data)
    assert s3_store.put_file("m/model.neff", big, exclusive=True) is True
    other = tmp_path / "other"
    other.write_bytes(data[::-1])
    assert s3_store.put_file("m/model.neff", other, exclusive=True) is False
    assert s3_store.read_bytes("m/model.neff") == data
    assert s3_store.incomplete_uploads() == []


def test_exclusive_put_whose_reply_was_lost(s3_endpoint: str, tmp_path: Path) -> None:
    lost: list[str] = []

    def rule(method: str, path: str, headers: dict[str, str]) -> str | None:
        conditional = "If-None-Match" in headers and method in ("PUT", "POST")
        if conditional and path not in lost:
            lost.append(path)
            return "lost_reply"  # moto stores it; the client never hears back and retries
        return None

    with FaultProxy(s3_endpoint, rule=rule) as proxy:
        store = S3Store(f"s3://{BUCKET}/cache", endpoint_url=proxy.url)
        assert store.put_file("lease", b"mine", exclusive=True) is True  # our own object, not a rival's
        assert store.put_file("lease", b"theirs", exclusive=True) is False
        big = tmp_path / "big"
        big.write_bytes(os.urandom(17 << 20))
        assert store.put_file("big.neff", big, exclusive=True) is True
        store.close()
    assert proxy.fates["lost_reply"] == 2  # the lease PUT and the multipart Complete


def test_reads_resume_after_a_cut_body(s3_store: S3Store, s3_endpoint: str, tmp_path: Path) -> None:
    small, big = os.urandom(300_000), os.urandom(20 << 20)
    s3_store.put_file("small", small)
    src = tmp_path / "big"
    src.write_bytes(big)
    s3_store.put_file("big", src)
    cut: set[str] = set()

    def rule(method: str, path: str, headers: dict[str, str]) -> str | None:
        if method == "GET" and "list-type" not in path and "Range" not in headers and path not in cut:
            cut.add(path)
            return "cut"
        return None

    with FaultProxy(s3_endpoint, rule=rule) as proxy:
        store = S3Store(f"s3://{BUCKET}/cache", endpoint_url=proxy.url)
        assert store.read_bytes("small") == small
        with store.open_read("small") as stream:
            assert stream.read() == small
        store.get_file("big", tmp_path / "back")
        assert (tmp_path / "back").read_bytes() == big
        with pytest.raises(EntryNotFound):
            store.get_file("nope", tmp_path / "nope")
        store.close()
    assert proxy.fates["cut"] >= 2


def test_incomplete_uploads_are_listed_and_aborted(s3_store: S3Store, s3_endpoint: str) -> None:
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    client.create_multipart_upload(Bucket=BUCKET, Key="cache/ns/MODULE_1+x/model.neff")
    client.create_multipart_upload(Bucket=BUCKET, Key="elsewhere/model.neff")
    (upload,) = s3_store.incomplete_uploads()
    assert upload.path == "ns/MODULE_1+x/model.neff"
    # moto reports a fixed Initiated date (2010), so only a very old cutoff can exclude it.
    assert s3_store.incomplete_uploads(older_than=100 * 365 * 86400) == []
    assert s3_store.abort_uploads([upload]) == 1
    assert s3_store.incomplete_uploads() == []


def test_layout_matches_the_local_one(s3_store: S3Store, s3_endpoint: str, tmp_path: Path) -> None:
    local = open_store(str(tmp_path / "local"))
    for i in range(3):
        publish_a(local, key=f"MODULE_{i}+abb26765")
    assert len(push(local, s3_store).copied) == 3
    local_files = {f.path for f in local.iter_files() if not f.path.startswith(".neffcache/")}
    remote = {k.removeprefix("cache/") for k in raw_keys(s3_endpoint, "cache/")}
    # NEURON_COMPILE_CACHE_URL=s3://bucket/cache/trn2-lnc2 finds neuronxcc-<ver>/MODULE_*/model.neff there.
    assert remote == local_files
    assert all(k.startswith("trn2-lnc2/neuronxcc-2.27.5334.0+f702b353/MODULE_") for k in remote)
    assert scan(s3_store).by_state()["SUCCESS"] == 3
