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


def test_over_plain_http_bodies_go_without_a_crc32_their_signed_sha256_checks(s3_endpoint: str,
                                                                               tmp_path: Path) -> None:
    """Over HTTP every body is signed with its sha256 (S3 refuses one that does not match), so
    the CRC32 botocore would add, one more pass over every byte, is left out; the bytes arrive."""
    small, big = tmp_path / "small", tmp_path / "big"
    small.write_bytes(os.urandom(200_000))
    big.write_bytes(os.urandom((5 << 20) + 123_456))  # two parts of a multipart upload
    sent: list[tuple[str, str, dict[str, str]]] = []
    lock = threading.Lock()

    def record(method: str, path: str, headers: dict[str, str]) -> str | None:
        with lock:
            sent.append((method, path, {k.lower(): v for k, v in headers.items()}))
        return None

    with FaultProxy(s3_endpoint, rule=record) as proxy:
        store = S3Store(f"s3://{BUCKET}/crc", endpoint_url=proxy.url, multipart_threshold=5 << 20,
                        multipart_chunksize=5 << 20)
        try:
            assert store.part_checksum is None
            assert store.put_file("a/small", small, expect=sha256_file(small))
            assert store.put_file("a/big", big, expect=sha256_file(big))
            assert store.put_file("a/plain", b"not hashed by neffcache")
            assert store.read_bytes("a/big") == big.read_bytes()
            assert store.read_bytes("a/small") == small.read_bytes()
        finally:
            store.close()
    uploads = [(path, headers) for method, path, headers in sent if method in ("PUT", "POST")]
    assert len(uploads) == 6  # small, plain; the multipart: create, 2 parts, complete
    for path, headers in uploads:
        assert not [k for k in headers if k.startswith(("x-amz-checksum-", "x-amz-sdk-checksum"))], path
        assert len(headers["x-amz-content-sha256"]) == 64, path  # a digest, not UNSIGNED-PAYLOAD
    parts = [headers["x-amz-content-sha256"] for path, headers in uploads if "partNumber=" in path]
    data = big.read_bytes()
    assert sorted(parts) == sorted([sha256_bytes(data[:5 << 20]).sha256, sha256_bytes(data[5 << 20:]).sha256])


def test_over_https_uploads_keep_botocores_crc32(aws_env: None) -> None:
    """Where the payload goes unsigned (HTTPS: AWS's own endpoint), the CRC32 is its check."""
    store = S3Store(f"s3://{BUCKET}/crc")
    try:
        assert store._client.meta.config.request_checksum_calculation == "when_supported"
        assert store.part_checksum == "CRC32"
    finally:
        store.close()
    assert s3_signing.checksum_options("https://s3.example.com") == {}
    assert s3_signing.checksum_options("HTTP://10.0.0.1:9000") == {"request_checksum_calculation": "when_required"}
    assert [s3_signing.payload_signed(u) for u in (None, "https://h", "http://h", "Http://h:80/x")] == [
        False, False, True, True]
