"""Fixtures for remote stores: moto's S3 server (session-wide, reset per test), buckets."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest

from neffcache.stores.s3 import S3Store
from tests.stores.moto_server import S3TestServer, start_server

BUCKET = "neffcache-test"


@pytest.fixture(scope="session")
def moto_server() -> Iterator[S3TestServer]:
    server = start_server()
    yield server
    server.stop()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def s3_endpoint(moto_server: S3TestServer, aws_env: None) -> str:
    moto_server.reset()
    boto3.client("s3", endpoint_url=moto_server.url, region_name="us-east-1").create_bucket(Bucket=BUCKET)
    return moto_server.url


@pytest.fixture
def s3_store(s3_endpoint: str) -> Iterator[S3Store]:
    store = S3Store(f"s3://{BUCKET}/cache", endpoint_url=s3_endpoint)
    yield store
    store.close()
