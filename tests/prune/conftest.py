"""Stores for the prune tests: local, shared mount (fsx://) and S3 on moto's server over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from neffcache.stores import open_store
from neffcache.stores.base import Store
from tests.stores.conftest import BUCKET, aws_env, moto_server, s3_endpoint

__all__ = ["aws_env", "moto_server", "s3_endpoint"]  # tests/stores' S3 fixtures, reused here

KINDS = ["local", "shared", pytest.param("s3", marks=pytest.mark.s3)]


def make_store(kind: str, tmp_path: Path, request: pytest.FixtureRequest, name: str = "c") -> Store:
    if kind == "local":
        return open_store(str(tmp_path / name))
    if kind == "shared":
        return open_store(f"fsx://{tmp_path / name}")
    endpoint = request.getfixturevalue("s3_endpoint")
    store = open_store(f"s3://{BUCKET}/{name}", endpoint_url=endpoint)
    request.addfinalizer(store.close)
    return store


@pytest.fixture(params=KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    yield make_store(request.param, tmp_path, request)


@pytest.fixture(params=["local", "shared"])
def fs_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    yield make_store(request.param, tmp_path, request)
