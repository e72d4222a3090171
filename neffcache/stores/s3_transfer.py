"""Sending bytes to S3: whole small files and parallel multipart uploads, hashed as they are read.

Why not boto3's TransferManager: it starts executors per call and adds per-object overhead
that dominates for the many small files of a cache (HLOs, flags, markers), and it cannot
put ``If-None-Match`` on CompleteMultipartUpload. So small objects go in one PutObject or
GetObject, big ones in parts on the store's shared pool. Downloads and resumable reads are
in :mod:`neffcache.stores.s3_read`.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Executor, Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neffcache.errors import SourceChanged, StoreError
from neffcache.manifest import FileDigest
from neffcache.regular import open_regular
from neffcache.stores.budget import TRANSFER_BUDGET, ByteBudget
from neffcache.stores.hashed_io import PartBuffer, mismatch, moved, read_into

log = logging.getLogger(__name__)
MAX_PARTS = 10_000
MIN_PART = 5 << 20  # S3 refuses smaller parts (except the last)

# The store's call: (operation, path for messages, **api kwargs) -> response; raises neffcache
# errors except for the codes listed in ``expect`` (raised as ExpectedError).
Call = Callable[..., dict[str, Any]]


class ExpectedError(Exception):
    """An S3 error code the caller handles itself (412, 404, NoSuchUpload)."""

    def __init__(self, code: str, retried: bool) -> None:
        self.code = code
        self.retried = retried
        super().__init__(code)


def backoff(attempt: int, base: float = 0.1, cap: float = 5.0) -> None:
    time.sleep(min(cap, base * 2 ** attempt) * (0.5 + random.random() / 2))


def part_size_for(size: int, chunk: int) -> int:
    part = max(chunk, MIN_PART)
    while size / part > MAX_PARTS:
        part *= 2
    return part


def multipart_etag(part_etags: list[str]) -> str | None:
    """The ETag S3 gives an object assembled from parts with these ETags (each the MD5 of its
    part, except under SSE-KMS, where this answers None: nothing to compare with)."""
    try:
        digests = [bytes.fromhex(e.strip('"')) for e in part_etags]
    except ValueError:
        return None
    if any(len(d) != 16 for d in digests):
        return None
    return f'"{hashlib.md5(b"".join(digests)).hexdigest()}-{len(digests)}"'  # noqa: S324 - S3's scheme


@dataclass(frozen=True)
class Sent:
    """What an upload of a local file did: ``created`` (False: an exclusive write found the key
    taken, 412), ``retried`` (that 412 may be our own first attempt's), the ETag S3 gives the
    object (None when it cannot be predicted), and the sha256 of the bytes sent with the
    source's fstat before the read (None when nobody asked for the digest)."""

    created: bool
    retried: bool
    etag: str | None
    digest: FileDigest | None
    before: os.stat_result | None


def upload_multipart(call: Call, pool: Executor, *, key: str, path: str, source: Path, chunk: int,
                     exclusive: bool, expect: FileDigest | None = None, hashed: bool = False,
                     budget: ByteBudget = TRANSFER_BUDGET, checksum: str | None = "CRC32") -> Sent:
    """Upload ``source`` in parallel parts.

    One sequential reader (this thread) reads each part once into a buffer taken from
    ``budget``, feeds it to sha256 in order, and hands that same buffer to the pool to upload;
    the buffer goes back to the budget when its part is sent. With ``expect``, the digest of
    what was sent must match before CompleteMultipartUpload; with ``hashed``, that digest is
    returned. Either way a source whose fstat moved during the read raises SourceChanged
    before Complete: the object never becomes visible otherwise (see hashed_io.mismatch).

    ``created`` is False when ``exclusive`` and the key already existed (412): the upload is
    aborted then. Any failure aborts the upload too, so no parts linger; a SIGKILL leaves an
    incomplete upload that no listing shows and ``S3Store.abort_incomplete_uploads`` removes.

    ``checksum``: the parts' ``ChecksumAlgorithm`` (None: their signed sha256 checks them, s3_signing).
    """
    algorithm: dict[str, str] = {"ChecksumAlgorithm": checksum} if checksum else {}
    upload = call("create_multipart_upload", path, Key=key, **algorithm)
    upload_id = upload["UploadId"]
    try:
        with open(open_regular(source), "rb") as f:
            fd = f.fileno()
            before = os.fstat(fd)
            size = before.st_size
            if expect is not None and size != expect.size:
                raise mismatch(path, FileDigest("", size), expect, before, os.fstat(fd), path)
            part = part_size_for(size, chunk)
            digest = hashlib.sha256() if expect is not None or hashed else None
            failed = threading.Event()
            futures: list[Future[dict[str, Any]]] = []
            try:
                for number, offset in enumerate(range(0, size, part), start=1):
                    if failed.is_set():
                        break
                    futures.append(_read_and_submit(pool, budget, call, fd, key, path, upload_id, number,
                                                    offset, min(part, size - offset), digest, failed, algorithm))
            finally:
                _settle(futures)
            after = os.fstat(fd)
        parts = [f.result() for f in futures]
        got = FileDigest(digest.hexdigest(), size) if digest is not None else None
        if expect is not None and got != expect:
            raise mismatch(path, got or FileDigest("", size), expect, before, after, path)
        if hashed and moved(before, after):
            raise SourceChanged(path)
        etag = multipart_etag([p["ETag"] for p in parts])
        kwargs: dict[str, Any] = {"IfNoneMatch": "*"} if exclusive else {}
        try:
            call("complete_multipart_upload", path, Key=key, UploadId=upload_id,
                 MultipartUpload={"Parts": parts}, expect=("PreconditionFailed", "NoSuchUpload"), **kwargs)
        except ExpectedError as exc:
            _abort(call, key, path, upload_id)
            # NoSuchUpload after a retry: our first Complete went through, its reply was lost.
            return Sent(False, exc.retried or exc.code == "NoSuchUpload", etag, got, before)
        return Sent(True, False, etag, got, before)
    except BaseException:
        _abort(call, key, path, upload_id)
        raise


def _read_and_submit(pool: Executor, budget: ByteBudget, call: Call, fd: int, key: str, path: str,
                     upload_id: str, number: int, offset: int, length: int, digest: Any,
                     failed: threading.Event, algorithm: dict[str, str]) -> Future[dict[str, Any]]:
    """Read one part (after taking its bytes from the budget), hash it, start its upload."""
    taken = budget.acquire(length)
    buffer: PartBuffer | None = None
    try:
        buffer = PartBuffer(length)
        if read_into(fd, buffer.data, offset) != length:
            raise SourceChanged(path)  # shorter than when we started: rewritten under us
        if digest is not None:
            digest.update(buffer.data)
        future = pool.submit(_upload_part, call, key, path, upload_id, number, buffer, algorithm)
    except BaseException:
        if buffer is not None:
            buffer.close()
        budget.release(taken)
        raise

    def done(f: Future[dict[str, Any]], buffer: PartBuffer = buffer) -> None:
        if f.cancelled() or f.exception() is not None:
            failed.set()
        buffer.close()
        budget.release(taken)

    future.add_done_callback(done)
    return future


def _settle(futures: list[Future[Any]]) -> None:
    """Wait for all; on the first failure cancel what has not started and raise it."""
    done, pending = wait(futures, return_when=FIRST_EXCEPTION)
    failed = next((f for f in done if f.exception() is not None), None)
    if failed is not None:
        for future in pending:
            future.cancel()
        wait(pending)
        failed.result()


def _upload_part(call: Call, key: str, path: str, upload_id: str, number: int,
                 buffer: PartBuffer, algorithm: dict[str, str]) -> dict[str, Any]:
    body = buffer.data
    if isinstance(body, mmap.mmap):
        body.seek(0)  # a file-like body: botocore reads it (and seeks back for retries) itself
    reply = call("upload_part", path, Key=key, UploadId=upload_id, PartNumber=number,
                 Body=body if isinstance(body, mmap.mmap) else bytes(body), **algorithm)
    # The part's ETag is the MD5 of its bytes (S3 computes it): the object's ETag follows from
    # them (multipart_etag) without a second pass over the bytes here.
    part = {"PartNumber": number, "ETag": reply["ETag"]}
    if reply.get("ChecksumCRC32"):
        part["ChecksumCRC32"] = reply["ChecksumCRC32"]
    return part


def read_whole(source: Path, name: str, expect: FileDigest | None, budget: ByteBudget = TRANSFER_BUDGET
               ) -> tuple[PartBuffer, int, FileDigest, os.stat_result]:
    """A small file read once into a buffer taken from ``budget``: returns it, the bytes taken
    (to release after sending), the digest of the bytes read and the source's fstat before
    the read. Checked before anything is sent: against ``expect`` when given, else the file
    must have held still while it was read (SourceChanged)."""
    with open(open_regular(source), "rb") as f:
        fd = f.fileno()
        before = os.fstat(fd)
        size = before.st_size
        taken = budget.acquire(size)
        buffer: PartBuffer | None = None
        try:
            buffer = PartBuffer(size)
            got = read_into(fd, buffer.data, 0)
            after = os.fstat(fd)
            with memoryview(buffer.data) as view:
                digest = FileDigest(hashlib.sha256(view[:got]).hexdigest(), got)
            if expect is not None and digest != expect:
                raise mismatch(name, digest, expect, before, after, name)
            if expect is None and (got != size or moved(before, after)):
                raise SourceChanged(name)
        except BaseException:
            if buffer is not None:
                buffer.close()
            budget.release(taken)
            raise
    return buffer, taken, digest, before


def _abort(call: Call, key: str, path: str, upload_id: str) -> None:
    try:
        call("abort_multipart_upload", path, Key=key, UploadId=upload_id, expect=("NoSuchUpload",))
    except (ExpectedError, StoreError) as exc:
        # Not fatal: the upload stays invisible and prune aborts it later.
        log.debug("could not abort upload %s of %s: %s", upload_id, key, exc)


