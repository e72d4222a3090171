"""A cache root under ``s3://bucket/prefix``, with the same relative layout as on disk.

So ``NEURON_COMPILE_CACHE_URL=s3://bucket/prefix/trn2-lnc2`` (libneuronxla's own S3 backend)
reads what neffcache publishes, and a bucket libneuronxla filled (``neuronxcc-<ver>/MODULE_*``
right under the prefix, no manifests) is scanned, pulled and verified like a local root.

How the store contract maps onto S3:

- *whole files*: a PutObject or CompleteMultipartUpload is atomic, readers see the old object
  or the new one, never a prefix, so no temp keys are needed;
- *exclusive*: ``If-None-Match: *`` on PutObject and on CompleteMultipartUpload; a 412 means
  someone was first. When the 412 follows a retry of our own request, the first attempt may
  have succeeded with its reply lost, so the object is compared with ours before answering;
- *delete*: DeleteObjects in batches of 1000, in parallel; S3 does not say which keys existed,
  so the count comes from listing the parent "directories" of the keys first.

Retries: botocore's ``standard`` mode (exponential backoff with jitter) for every attempt,
an AIMD limit on calls in flight that shrinks on SlowDown and regrows on success (s3_throttle
says why not botocore's ``adaptive`` limiter); on top, more rounds for throttling, 5xx and
dropped connections once botocore gives up (its retry quota runs dry under sustained faults),
and resumable body reads (s3_transfer). Errors: one-line neffcache errors (s3_errors).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import logging
import mmap
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, TypeVar
from urllib.parse import urlsplit

import boto3
from botocore import exceptions as bx
from botocore.config import Config

from neffcache import __version__
from neffcache.entry import FileInfo
from neffcache.errors import EntryNotFound, InvalidURL, StoreError, StoreUnavailable
from neffcache.keys import safe_relpath
from neffcache.manifest import FileDigest
from neffcache.regular import open_regular
from neffcache.stores import s3_signing
from neffcache.stores.base import FileSource, IncompleteUpload, Store
from neffcache.stores.budget import TRANSFER_BUDGET
from neffcache.stores.hashed_io import check_bytes
from neffcache.stores.s3_errors import error_code, is_transient, retry_attempts, translate
from neffcache.stores.s3_list import ParallelLister, existing_keys, list_uploads
from neffcache.stores.s3_read import ObjectReader, download
from neffcache.stores.s3_throttle import ThrottleGate
from neffcache.stores.s3_transfer import ExpectedError, Sent, backoff, read_whole, upload_multipart

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,61}[a-z0-9]$")
# A listed key (below the prefix) that is no canonical relative path: empty, "." or ".."
# components, a leading slash, backslashes, control characters.
_UNADDRESSABLE_KEY = re.compile(r"(?:^|/)\.{0,2}(?:/|$)|^/|\\|[\x00-\x1f\x7f]")
log = logging.getLogger(__name__)
DELETE_BATCH = 1000  # the DeleteObjects maximum
LIST_PARENTS_LIMIT = 2000  # deletes spanning more directories list their common prefix instead
OUTER_ROUNDS = 6  # our retries on top of botocore's, for throttling and dropped connections
_SMALL_COMPARE = 1 << 20
_POOL_PREFIX = "neffcache-s3"
T = TypeVar("T")
R = TypeVar("R")


def parse_s3_url(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    if parts.scheme.lower() != "s3":
        raise InvalidURL(url, "expected s3://bucket/prefix")
    bucket = parts.netloc
    if not _BUCKET_RE.match(bucket) or ".." in bucket:
        raise InvalidURL(url, f"{bucket!r} is not a valid S3 bucket name")
    if parts.query or parts.fragment:
        raise InvalidURL(url, "options go in flags (--endpoint-url), not in the URL")
    raw = parts.path.strip("/")
    prefix = safe_relpath(raw) if raw else ""
    return bucket, prefix


class S3Store(Store):
    scheme = "s3"

    def __init__(
        self, url: str, *,
        read_only: bool = False,
        endpoint_url: str | None = None,
        region: str | None = None,
        profile: str | None = None,
        max_concurrency: int = 32,
        multipart_threshold: int = 16 << 20,
        multipart_chunksize: int = 8 << 20,
        max_attempts: int = 6,
        retry_mode: str = "standard",
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
    ) -> None:
        self.bucket, self.prefix = parse_s3_url(url)
        super().__init__(f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}",
                         read_only=read_only)
        self.endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        self.max_concurrency = max(1, max_concurrency)
        self.multipart_threshold = max(multipart_threshold, 5 << 20)
        self.multipart_chunksize = multipart_chunksize
        if region is None and self.endpoint and not (os.environ.get("AWS_REGION")
                                                     or os.environ.get("AWS_DEFAULT_REGION")):
            region = "us-east-1"  # S3-compatible endpoints still want a region to sign with
        config = Config(
            region_name=region,
            retries={"mode": retry_mode, "max_attempts": max(1, max_attempts)},
            # Our transfer threads, the parts pool and the listing pool all share one client.
            max_pool_connections=2 * self.max_concurrency + 8,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            tcp_keepalive=True,
            user_agent_extra=f"neffcache/{__version__}",
            **s3_signing.checksum_options(self.endpoint),
        )
        try:
            session = boto3.session.Session(profile_name=profile)
            self._client = session.client("s3", endpoint_url=self.endpoint, config=config)
        except (bx.ProfileNotFound, bx.BotoCoreError, ValueError) as exc:
            raise StoreUnavailable(f"cannot set up an S3 client for {self.url}: {exc}", store=self.url) from exc
        self.gate = ThrottleGate(2 * self.max_concurrency + 8)
        self.gate.register(self._client.meta.events)
        s3_signing.register(self._client.meta.events)
        self.part_checksum = s3_signing.part_checksum(self.endpoint)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    # -- plumbing -----------------------------------------------------------------------------
    def _key(self, path: str) -> str:
        rel = safe_relpath(path)
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def _dir_key(self, path: str) -> str:
        """The key prefix of a directory path ("" = the whole store)."""
        if not path:
            return f"{self.prefix}/" if self.prefix else ""
        return self._key(path) + "/"

    def _rel(self, key: str) -> str:
        return key[len(self.prefix) + 1:] if self.prefix else key

    @property
    def pool(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix=_POOL_PREFIX)
            return self._pool

    def _map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        # From inside the pool (a part upload deleting...) run inline: waiting on the pool
        # from one of its own threads could deadlock it.
        if len(items) <= 1 or threading.current_thread().name.startswith(_POOL_PREFIX):
            return [fn(i) for i in items]
        return list(self.pool.map(fn, items))

    def _call(self, op: str, path: str | None = None, *, expect: Iterable[str] = (), **kwargs: Any) -> dict[str, Any]:
        """One S3 API call with our extra retry rounds; errors become neffcache errors."""
        method = getattr(self._client, op)
        expected = frozenset(expect)
        body: Any = kwargs.get("Body")
        start = body.tell() if hasattr(body, "seek") else None
        rounds = 0
        while True:
            if rounds and body is not None and start is not None:
                body.seek(start)  # the failed round read the stream: send all of it again
            try:
                reply: dict[str, Any] = method(Bucket=self.bucket, **kwargs)
                return reply
            except (bx.ClientError, bx.BotoCoreError, ConnectionError, TimeoutError) as exc:
                code = error_code(exc)
                if code in expected:
                    raise ExpectedError(code, rounds > 0 or retry_attempts(exc) > 0) from exc
                # A refused connection is a down endpoint, not a blip: botocore retried it already.
                blip = is_transient(exc) and not isinstance(exc, bx.EndpointConnectionError | bx.ConnectTimeoutError)
                if blip and rounds < OUTER_ROUNDS:
                    rounds += 1
                    backoff(rounds, base=0.5)
                    continue
                raise translate(exc, url=self.url, bucket=self.bucket, endpoint=self.endpoint, op=op,
                                path=path) from exc
            finally:
                self.gate.release()  # only if an attempt died between its two hooks

    # -- primitives ---------------------------------------------------------------------------
    def iter_files(self, prefix: str = "") -> Iterator[FileInfo]:
        lister = ParallelLister(lambda **kw: self._call("list_objects_v2", prefix or None, **kw), self.pool,
                                self.max_concurrency)
        for item in lister.iter_keys(self._dir_key(prefix)):
            rel = self._rel(item.key)
            if _UNADDRESSABLE_KEY.search(rel):
                # Keys come from the network: "a//b", "x/../y", "./z" or a control character is
                # no path neffcache can name, and safe_relpath would normalise "a//b" into the
                # *different* key "a/b" (deleting it as garbage would hit a real file). Foreign:
                # reported, never listed as anything we may read or remove.
                log.warning("%s: key %r is not a path neffcache can address; left alone", self.url, rel)
                continue
            yield FileInfo(rel, item.size, item.mtime)

    def stat(self, path: str) -> FileInfo | None:
        key = self._key(path)
        try:
            head = self._call("head_object", path, Key=key, expect=("404", "NoSuchKey", "NotFound"))
        except ExpectedError:
            return None
        return FileInfo(safe_relpath(path), int(head["ContentLength"]), head["LastModified"].timestamp())

    def _get(self, path: str) -> dict[str, Any]:
        return self._call("get_object", path, Key=self._key(path))  # NoSuchKey -> EntryNotFound

    @contextlib.contextmanager
    def open_read(self, path: str) -> Iterator[BinaryIO]:
        reader = ObjectReader(self._call, self._key(path), path, self._get(path))
        with io.BufferedReader(reader, buffer_size=1 << 20) as stream:
            yield stream

    def read_bytes(self, path: str) -> bytes:
        with ObjectReader(self._call, self._key(path), path, self._get(path)) as reader:
            return reader.readall()

    def get_file(self, path: str, dest: Path) -> FileDigest:
        return download(self._call, self.pool, key=self._key(path), path=path, dest=dest,
                        chunk=self.multipart_chunksize, threshold=self.multipart_threshold)

    def _put_file(self, path: str, source: FileSource, *, exclusive: bool, move: bool) -> bool:
        return self._upload(path, source, exclusive=exclusive, expect=None).created

    def _put_verified(self, path: str, source: FileSource, *, exclusive: bool, move: bool,
                      expect: FileDigest) -> bool:
        # Hashed in the read that sends it: see _upload.
        return self._upload(path, source, exclusive=exclusive, expect=expect).created

    def _put_hashed(self, path: str, source: Path, *, exclusive: bool) -> tuple[FileDigest, os.stat_result] | None:
        sent = self._upload(path, source, exclusive=exclusive, expect=None, hashed=True)
        # hashed=True: a created upload always carries its digest and the source's fstat.
        return (sent.digest, sent.before) if sent.created and sent.digest and sent.before else None

    def _upload(self, path: str, source: FileSource, *, exclusive: bool, expect: FileDigest | None,
                hashed: bool = False) -> Sent:
        """PutObject, or a multipart upload for big files. With ``expect`` or ``hashed``, the
        bytes sent are the bytes hashed: a small file is read once into its request body and
        checked before it is sent; a big one is hashed part by part as the parts are read
        (upload_multipart) and checked before the upload is completed, so a mismatch, or a
        source that moved while it was read, never becomes visible."""
        key = self._key(path)
        if isinstance(source, bytes):
            if expect is not None:
                check_bytes(path, source, expect)
            return Sent(self._put_body(key, path, source, exclusive, source), False, None, None, None)
        size = source.stat().st_size
        if size > self.multipart_threshold:
            sent = upload_multipart(self._call, self.pool, key=key, path=path, source=source,
                                    chunk=self.multipart_chunksize, exclusive=exclusive, expect=expect, hashed=hashed,
                                    checksum=self.part_checksum)
            if not sent.created and sent.retried and sent.etag is not None and self._is_ours(
                    key, path, source, size, sent.etag):
                return dataclasses.replace(sent, created=True)
            return sent
        if expect is None and not hashed:
            with open(open_regular(source), "rb") as body:
                return Sent(self._put_body(key, path, body, exclusive, source), False, None, None, None)
        buffer, taken, digest, before = read_whole(source, path, expect)
        try:
            data: Any = buffer.data
            if not isinstance(data, mmap.mmap):  # one copy, body and comparison alike; the read buffer goes
                data, buffer.data = bytes(data), bytearray()
            with s3_signing.payload_sha256(digest.sha256):  # the body's, hashed as it was read
                created = self._put_body(key, path, data, exclusive, data if isinstance(data, bytes) else source)
            return Sent(created, False, None, digest, before)
        finally:
            buffer.close()
            TRANSFER_BUDGET.release(taken)

    def _put_body(self, key: str, path: str, body: Any, exclusive: bool, source: FileSource) -> bool:
        extra: dict[str, Any] = {"IfNoneMatch": "*"} if exclusive else {}
        size = len(source) if isinstance(source, bytes) else source.stat().st_size
        try:
            self._call("put_object", path, Key=key, Body=body, expect=("PreconditionFailed",), **extra)
        except ExpectedError as exc:
            return exc.retried and self._is_ours(key, path, source, size, None)
        return True

    def _is_ours(self, key: str, path: str, source: FileSource, size: int, etag: str | None) -> bool:
        """After a retried exclusive write got 412: is the object there the one we wrote?"""
        try:
            head = self._call("head_object", path, Key=key, expect=("404", "NoSuchKey", "NotFound"))
        except ExpectedError:
            return False
        if int(head["ContentLength"]) != size:
            return False
        if etag is not None:
            return bool(head.get("ETag") == etag)
        if size <= _SMALL_COMPARE:  # leases and markers: compare the bytes themselves
            data = source if isinstance(source, bytes) else source.read_bytes()
            try:
                return self.read_bytes(path) == data
            except EntryNotFound:
                return False
        # A single PutObject's ETag is the MD5 of its bytes (except with SSE-KMS, where this
        # answers False and the caller sees "someone else won": safe, if pessimistic).
        digest = hashlib.md5(usedforsecurity=False)
        if isinstance(source, bytes):
            digest.update(source)
        else:
            with open(open_regular(source), "rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
        return bool(head.get("ETag") == f'"{digest.hexdigest()}"')

    def _delete(self, paths: list[str]) -> int:
        keys = sorted({self._key(p) for p in paths})
        if not keys:
            return 0
        existed = len(self._existing(keys))
        self._delete_keys(keys)
        return existed

    def discard(self, paths: Iterable[str], *, prune_dirs: bool = False) -> None:
        """Delete like :meth:`delete` without learning which keys existed: no listing first.

        Prune removes an entry's files in several ordered calls, and the count ``delete``
        returns would cost a listing of every entry's directory (and of the stamp directory)
        per call. Objects have no directories to prune."""
        self.check_writable()
        self._delete_keys(sorted({self._key(p) for p in paths}))

    def _delete_keys(self, keys: list[str]) -> None:
        batches = [keys[i:i + DELETE_BATCH] for i in range(0, len(keys), DELETE_BATCH)]
        for errors in self._map(self._delete_batch, batches):
            if errors:
                first = errors[0]
                exc = bx.ClientError({"Error": {"Code": first.get("Code", ""), "Message": first.get("Message", "")}},
                                     "DeleteObjects")
                raise translate(exc, url=self.url, bucket=self.bucket, endpoint=self.endpoint, op="DeleteObjects",
                                path=self._rel(first.get("Key", "")))

    def _delete_batch(self, keys: list[str]) -> list[dict[str, str]]:
        reply = self._call("delete_objects", Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True})
        errors: list[dict[str, str]] = reply.get("Errors", [])
        return errors

    def _existing(self, keys: list[str]) -> set[str]:
        """Which of ``keys`` exist (S3 will not tell us on delete)."""
        return existing_keys(lambda **kw: self._call("list_objects_v2", **kw), self._map, lambda: self.pool,
                             self.max_concurrency, keys, parents_limit=LIST_PARENTS_LIMIT)

    # -- extras -------------------------------------------------------------------------------
    def move(self, src: str, dst: str) -> None:
        self.check_writable()
        try:
            self._call("copy_object", dst, Key=self._key(dst), expect=("NoSuchKey", "404"),
                       CopySource={"Bucket": self.bucket, "Key": self._key(src)})
        except ExpectedError:
            raise EntryNotFound(f"{src} not found in {self.url}", store=self.url, path=src) from None
        self.delete([src])

    def check(self) -> None:
        """Raise the one-line error that says why the bucket cannot be used, if it cannot."""
        try:
            self._call("head_bucket", expect=("404", "NoSuchBucket", "403"))
        except ExpectedError as exc:
            code = "NoSuchBucket" if exc.code in ("404", "NoSuchBucket") else "AccessDenied"
            raise translate(bx.ClientError({"Error": {"Code": code}}, "HeadBucket"), url=self.url,
                            bucket=self.bucket, endpoint=self.endpoint, op="HeadBucket") from None

    def incomplete_uploads(self, older_than: float | None = None) -> list[IncompleteUpload]:
        """Multipart uploads under the prefix never completed (started ``older_than`` s ago)."""
        return [IncompleteUpload(self._rel(key), upload_id, started) for key, upload_id, started in
                list_uploads(lambda **kw: self._call("list_multipart_uploads", **kw), self._dir_key(""), older_than)]

    def abort_uploads(self, uploads: Iterable[IncompleteUpload]) -> int:
        self.check_writable()
        aborted = 0
        for up in uploads:
            try:
                self._call("abort_multipart_upload", up.path, Key=self._key(up.path), UploadId=up.upload_id,
                           expect=("NoSuchUpload",))
                aborted += 1
            except ExpectedError:
                continue
        return aborted

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        with contextlib.suppress(AttributeError, StoreError):
            self._client.close()
