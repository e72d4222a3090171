"""The store contract on S3: moto's server over real HTTP on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from neffcache.stores import open_store
from neffcache.stores.base import Store
from neffcache.stores.s3 import S3Store
from neffcache.testing.store_contract import ReadOnlyContract, StoreContract
from tests.stores.conftest import BUCKET

pytestmark = pytest.mark.s3  # needs moto's server


class TestS3Store(StoreContract, ReadOnlyContract):
    @pytest.fixture
    def store(self, s3_store: S3Store) -> S3Store:
        return s3_store

    @pytest.fixture
    def readonly_store(self, s3_endpoint: str) -> Iterator[Store]:
        store = open_store(f"s3://{BUCKET}/ro", read_only=True, endpoint_url=s3_endpoint)
        yield store
        store.close()


class TestS3StoreAtBucketRoot(StoreContract):
    """No prefix: the keys are the layout's paths themselves."""

    @pytest.fixture
    def store(self, s3_endpoint: str) -> Iterator[Store]:
        store = open_store(f"s3://{BUCKET}", endpoint_url=s3_endpoint)
        yield store
        store.close()
