"""Entry directories named as a file manager copies them (``MODULE_1 (copy)+…``), with a
non-ASCII letter, or with bytes that are not UTF-8 (issue 41 N10): each is one entry's
problem in verify, verify --fix, scan --manifests and prune — the rest of the store is
handled, no traceback — and prune removes them by their raw names."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from neffcache.stores.local import LocalStore
from neffcache.stores.s3 import S3Store
from neffcache.testing.store_contract import publish_a
from tests.hostile.trees import json_of, neffcache
from tests.stores.conftest import BUCKET, aws_env, moto_server, s3_endpoint  # noqa: F401 - fixtures

GOOD = [f"MODULE_{i}+abb26765" for i in range(3)]
ODD = ["MODULE_1 (copy)+abb26765", "MODULE_é+abb26765"]
RAW = b"MODULE_\xff+abb26765"  # not UTF-8: listed as a surrogate, no str encodes it strictly


def _odd_tree(tmp_path: Path) -> tuple[LocalStore, str, list[str]]:
    store = LocalStore(tmp_path / "c")
    paths = [publish_a(store, key=k)[0] for k in GOOD]
    namespace = paths[0].rsplit("/", 1)[0]
    base = store.root / paths[1]
    for name in ODD:
        shutil.copytree(base, store.root / namespace / name)
    shutil.copytree(os.fsencode(base), os.fsencode(store.root / namespace) + b"/" + RAW)
    odd = [f"{namespace}/{n}" for n in (*ODD, os.fsdecode(RAW))]
    return store, namespace, odd


def _clean(result: object) -> None:
    assert "Traceback" not in getattr(result, "stderr", ""), getattr(result, "stderr", "")


def test_verify_and_scan_report_odd_names_per_entry(tmp_path: Path) -> None:
    store, _, odd = _odd_tree(tmp_path)
    for args in (("verify",), ("verify", "--fix")):
        done = neffcache(*args, str(store.root), "--json")
        _clean(done)
        assert done.returncode == 1, done.stdout + done.stderr  # some entries could not be checked
        report = json_of(done)
        assert report["ok"] == len(GOOD) and report["corrupt"] == 0, report
        assert len(report["failures"]) == len(odd)
    scanned = neffcache("scan", str(store.root), "--manifests", "--json")
    _clean(scanned)
    assert scanned.returncode == 1, scanned.stdout + scanned.stderr
    data = json_of(scanned)
    assert data["states"]["SUCCESS"] == len(GOOD) and len(data["warnings"]) == len(odd)
    assert not (store.root / ".neffcache" / "quarantine").exists()
    assert all(os.path.lexists(os.fsencode(store.root / p)) for p in odd)


def test_prune_removes_odd_names_by_their_raw_names(tmp_path: Path) -> None:
    store, namespace, odd = _odd_tree(tmp_path)
    done = neffcache("prune", "--store", str(store.root), "--max-size", "1", "--yes", "--force")
    _clean(done)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not any(os.path.lexists(os.fsencode(store.root / p)) for p in odd)
    assert not (store.root / namespace).exists() or os.listdir(store.root / namespace) == []


@pytest.fixture
def s3_odd(s3_endpoint: str) -> Iterator[tuple[S3Store, list[str]]]:  # noqa: F811 - a fixture
    store = S3Store(f"s3://{BUCKET}/odd", endpoint_url=s3_endpoint)
    paths = [publish_a(store, key=k)[0] for k in GOOD]
    namespace = paths[0].rsplit("/", 1)[0]
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    for info in store.iter_files(paths[1]):
        body = store.read_bytes(info.path)
        for name in ODD:
            client.put_object(Bucket=BUCKET, Key=f"odd/{namespace}/{name}/{info.path.rsplit('/', 1)[1]}", Body=body)
    yield store, [f"{namespace}/{n}" for n in ODD]
    store.close()


@pytest.mark.s3
def test_odd_names_on_s3_are_per_entry(s3_odd: tuple[S3Store, list[str]], s3_endpoint: str) -> None:  # noqa: F811
    store, odd = s3_odd
    env = {"NEFFCACHE_ENDPOINT_URL": s3_endpoint}
    for args in (("verify",), ("verify", "--fix")):
        done = neffcache(*args, store.url, "--json", env=env)
        _clean(done)
        assert done.returncode == 1, done.stdout + done.stderr
        report = json_of(done)
        assert report["ok"] == len(GOOD) and len(report["failures"]) == len(odd), report
    scanned = neffcache("scan", store.url, "--manifests", "--json", env=env)
    _clean(scanned)
    assert scanned.returncode == 1 and json_of(scanned)["states"]["SUCCESS"] == len(GOOD)
    pruned = neffcache("prune", "--store", store.url, "--max-size", "1", "--yes", "--force", env=env)
    _clean(pruned)
    # S3 keys are always UTF-8; a name outside the key set is one entry that could not be
    # removed (exit 1), the rest of the plan is carried out.
    assert pruned.returncode == 1, pruned.stdout + pruned.stderr
    failed = [line for line in pruned.stdout.splitlines() if line.startswith("FAILED ")]
    assert sorted(line.split(":")[0].removeprefix("FAILED ") for line in failed) == sorted(odd)
    assert {p.rsplit("/", 2)[0] for p in (f.path for f in store.iter_files("")) if "MODULE" in p} == \
        {p.rsplit("/", 1)[0] for p in odd}
