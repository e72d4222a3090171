"""A verified PutObject is signed with the sha256 neffcache took of its body (s3_signing), over real
HTTP to moto: botocore's own signing would read the body once more to compute the same value."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from neffcache.manifest import sha256_bytes, sha256_file
from neffcache.stores import s3_signing
from neffcache.stores.s3 import S3Store
from neffcache.testing.faultproxy import FaultProxy
from tests.stores.conftest import BUCKET

pytestmark = pytest.mark.s3


def test_verified_puts_carry_the_digest_neffcache_took_and_others_botocores(s3_endpoint: str, tmp_path: Path) -> None:
    small, big = tmp_path / "small", tmp_path / "big"
    small.write_bytes(os.urandom(200_000))  # read into a bytes body
    big.write_bytes(os.urandom(3 << 20))  # read into an mmap body
    headers: dict[str, str] = {}
    versions: list[str] = []
    lock = threading.Lock()

    def record(method: str, path: str, sent: dict[str, str]) -> str | None:
        if method == "PUT":
            with lock:
                headers[path.rsplit("/", 1)[-1]] = next(v for k, v in sent.items()
                                                        if k.lower() == "x-amz-content-sha256")
        return None

    def signed_with(signature_version: str, **_: Any) -> None:
        with lock:
            versions.append(signature_version)

    with FaultProxy(s3_endpoint, rule=record) as proxy:
        store = S3Store(f"s3://{BUCKET}/signed", endpoint_url=proxy.url)
        store._client.meta.events.register("before-sign.s3.PutObject", signed_with)
        try:
            assert store.put_file("a/small", small, expect=sha256_file(small))
            assert store.put_file("a/big", big, expect=sha256_file(big))
            assert store.put_hashed("a/hashed", small) == sha256_file(small)
            assert store.put_file("a/plain", b"not hashed by neffcache")
            assert store.read_bytes("a/big") == big.read_bytes()
        finally:
            store.close()
    assert headers["small"] == headers["hashed"] == sha256_file(small).sha256
    assert headers["big"] == sha256_file(big).sha256
    assert headers["plain"] == sha256_bytes(b"not hashed by neffcache").sha256  # botocore's own
    assert versions == [s3_signing.SIGNATURE_VERSION] * 3 + ["s3v4"]
