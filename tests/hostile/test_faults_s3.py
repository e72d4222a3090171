"""The fault probes on S3 (moto's server over real HTTP): crafted manifests, and keys from the
network that are no path (``..``, ``a//b``, control characters) or not an allowed name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from neffcache.operations.verify import verify
from neffcache.replication.sync import pull
from neffcache.scan.report import scan
from neffcache.stores.local import LocalStore
from neffcache.stores.s3 import S3Store
from tests.hostile.trees import BAD, GOOD, build_tree, json_of, neffcache
from tests.stores.conftest import BUCKET, aws_env, moto_server, s3_endpoint  # noqa: F401 - fixtures

PREFIX = "cache"


@pytest.fixture
def s3_tree(s3_endpoint: str) -> Iterator[tuple[S3Store, dict[str, str]]]:  # noqa: F811 - a fixture
    store = S3Store(f"s3://{BUCKET}/{PREFIX}", endpoint_url=s3_endpoint)
    paths = build_tree(store)
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    entry = paths[GOOD[0]]
    for key in (f"{entry}/../../escape.neff", f"{entry}//model.neff", f"{entry}/bell\x07.txt",
                f"{entry}/notes (1).txt", "notes (1).txt", f"{entry}/./model.neff"):
        client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{key}", Body=b"hostile")
    yield store, paths
    store.close()


def test_scan_verify_and_pull_from_s3_get_through(s3_tree: tuple[S3Store, dict[str, str]], tmp_path: Path) -> None:
    store, paths = s3_tree
    report = scan(store, read_manifests=True)
    corrupt = {e.path for e in report.entries if e.state.value == "CORRUPT"}
    assert corrupt == {paths[k] for k in BAD}
    assert {e.path for e in report.entries if e.state.value == "SUCCESS"} == {paths[k] for k in GOOD}

    checked = verify(store)
    assert {c.path for c in checked.corrupt} == {paths[k] for k in BAD}
    assert checked.to_json()["ok"] == len(GOOD)

    dst = LocalStore(tmp_path / "pulled")
    result = pull(store, dst)
    assert {c.path for c in result.copied} == {paths[k] for k in GOOD}
    assert {f.path for f in result.failed} == {paths[k] for k in BAD}
    # Files that are no entry's are reported, never copied (the unaddressable keys are not listed).
    assert set(result.foreign) == {f"{paths[GOOD[0]]}/notes (1).txt", "notes (1).txt"}
    assert not (tmp_path / "escape.neff").exists() and not (tmp_path / "pulled" / "escape.neff").exists()
    # The normalised twin of "a//model.neff" was not served in place of the real NEFF.
    assert (dst.root / paths[GOOD[0]] / "model.neff").read_bytes() != b"hostile"


def test_cli_pull_and_prune_garbage_on_s3(s3_tree: tuple[S3Store, dict[str, str]], s3_endpoint: str,  # noqa: F811
                                          tmp_path: Path) -> None:
    _store, paths = s3_tree
    url = f"s3://{BUCKET}/{PREFIX}"
    pulled = neffcache("pull", url, str(tmp_path / "dst"), "--endpoint-url", s3_endpoint, "--json")
    assert pulled.returncode == 1, pulled.stderr[-2000:]
    report = json_of(pulled)
    assert set(report["copied_paths"]) == {paths[k] for k in GOOD}
    assert {f["path"] for f in report["failures"]} == {paths[k] for k in BAD}

    pruned = neffcache("prune", "--store", url, "--garbage", "--grace", "0s", "--no-index", "--yes", "--json",
                       env={"AWS_ENDPOINT_URL": s3_endpoint})
    assert pruned.returncode == 0, pruned.stdout[-2000:] + pruned.stderr[-2000:]
    result = json_of(pruned)["result"]
    assert isinstance(result, dict) and result["failed"] == []
    # Foreign files are never garbage, and keys that are no path were never listed as anything
    # prune may remove: all still there.
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX)["Contents"]}
    assert f"{PREFIX}/notes (1).txt" in keys
    assert f"{PREFIX}/{paths[GOOD[0]]}/../../escape.neff" in keys
    assert f"{PREFIX}/{paths[GOOD[0]]}//model.neff" in keys
    assert f"{PREFIX}/{paths[GOOD[0]]}/model.neff" in keys


def test_prune_on_s3_removes_entries_and_keeps_what_is_not_theirs(s3_tree: tuple[S3Store, dict[str, str]],
                                                                   s3_endpoint: str) -> None:  # noqa: F811
    store, paths = s3_tree
    pruned = neffcache("prune", "--store", f"s3://{BUCKET}/{PREFIX}", "--keep-compiler", "current",
                       "--compiler-version", "9.9.9.9+aaaaaaaa", "--force",
                       "--hit-grace", "0s", "--no-index", "--yes", "--json",
                       env={"AWS_ENDPOINT_URL": s3_endpoint})
    assert pruned.returncode == 0, pruned.stdout[-2000:] + pruned.stderr[-2000:]
    result = json_of(pruned)["result"]
    assert isinstance(result, dict) and result["failed"] == []
    # Every entry is gone; "notes (1).txt" in an entry's directory is no file of the entry (foreign,
    # kept), and the keys that are no path were never anything prune could name.
    assert result["removed_entries"] == len(paths)
    assert scan(store).entries == () and scan(store).uncommitted == ()
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX)["Contents"]}
    assert f"{PREFIX}/{paths[GOOD[0]]}/notes (1).txt" in keys and f"{PREFIX}/notes (1).txt" in keys
