"""Moving bytes to and from S3: multipart uploads, ranged parallel downloads, resumable reads.

Why not boto3's TransferManager: it starts executors per call and adds per-object overhead
that dominates for the many small files of a cache (HLOs, flags, markers), and it cannot
put ``If-None-Match`` on CompleteMultipartUpload. So small objects go in one PutObject or
GetObject, big ones in parts on the store's shared pool.

A body that breaks mid-stream (a reset connection after the headers came back) is beyond
botocore's retries: the readers here resume from the last byte they got, with ``IfMatch``
on the ETag so a resumed read can never splice two versions of an object together.
"""

from __future__ import annotations

import hashlib
import io
import logging
import mmap
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Executor, Future, wait
from pathlib import Path
from typing import Any

from neffcache.errors import SourceChanged, StoreError
from neffcache.manifest import FileDigest
from neffcache.stores.budget import TRANSFER_BUDGET, ByteBudget
from neffcache.stores.hashed_io import PIECE, PartBuffer, mismatch, read_into, write_all
from neffcache.stores.s3_errors import NETWORK_ERRORS

log = logging.getLogger(__name__)
MAX_PARTS = 10_000
MIN_PART = 5 << 20  # S3 refuses smaller parts (except the last)
STREAM_ATTEMPTS = 6

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


def multipart_etag(part_md5s: list[bytes]) -> str:
    """The ETag S3 gives an object assembled from parts with these MD5 digests."""
    return f'"{hashlib.md5(b"".join(part_md5s)).hexdigest()}-{len(part_md5s)}"'  # noqa: S324


def upload_multipart(call: Call, pool: Executor, *, key: str, path: str, source: Path, chunk: int,
                     exclusive: bool, expect: FileDigest | None = None,
                     budget: ByteBudget = TRANSFER_BUDGET) -> tuple[bool, bool, str]:
    """Upload ``source`` in parallel parts; returns (created, retried, expected_etag).

    One sequential reader (this thread) reads each part once into a buffer taken from
    ``budget``, feeds it to sha256 in order, and hands that same buffer to the pool to upload;
    the buffer goes back to the budget when its part is sent. With ``expect``, the digest of
    what was sent must match before CompleteMultipartUpload: the object never becomes visible
    otherwise (SourceChanged or CorruptEntry, see hashed_io.mismatch).

    ``created`` is False when ``exclusive`` and the key already existed (412): the upload is
    aborted then. Any failure aborts the upload too, so no parts linger; a SIGKILL leaves an
    incomplete upload that no listing shows and ``S3Store.abort_incomplete_uploads`` removes.
    """
    upload = call("create_multipart_upload", path, Key=key, ChecksumAlgorithm="CRC32")
    upload_id = upload["UploadId"]
    try:
        with open(source, "rb") as f:
            fd = f.fileno()
            before = os.fstat(fd)
            size = before.st_size
            if expect is not None and size != expect.size:
                raise mismatch(path, FileDigest("", size), expect, before, os.fstat(fd), path)
            part = part_size_for(size, chunk)
            digest = hashlib.sha256() if expect is not None else None
            failed = threading.Event()
            futures: list[Future[tuple[dict[str, Any], bytes]]] = []
            try:
                for number, offset in enumerate(range(0, size, part), start=1):
                    if failed.is_set():
                        break
                    futures.append(_read_and_submit(pool, budget, call, fd, key, path, upload_id, number,
                                                    offset, min(part, size - offset), digest, failed))
            finally:
                _settle(futures)
            after = os.fstat(fd)
        results = [f.result() for f in futures]
        if digest is not None and expect is not None:
            got = FileDigest(digest.hexdigest(), size)
            if got != expect:
                raise mismatch(path, got, expect, before, after, path)
        parts = [r[0] for r in results]
        etag = multipart_etag([r[1] for r in results])
        kwargs: dict[str, Any] = {"IfNoneMatch": "*"} if exclusive else {}
        try:
            call("complete_multipart_upload", path, Key=key, UploadId=upload_id,
                 MultipartUpload={"Parts": parts}, expect=("PreconditionFailed", "NoSuchUpload"), **kwargs)
        except ExpectedError as exc:
            _abort(call, key, path, upload_id)
            # NoSuchUpload after a retry: our first Complete went through, its reply was lost.
            return False, exc.retried or exc.code == "NoSuchUpload", etag
        return True, False, etag
    except BaseException:
        _abort(call, key, path, upload_id)
        raise


def _read_and_submit(pool: Executor, budget: ByteBudget, call: Call, fd: int, key: str, path: str,
                     upload_id: str, number: int, offset: int, length: int, digest: Any,
                     failed: threading.Event) -> Future[tuple[dict[str, Any], bytes]]:
    """Read one part (after taking its bytes from the budget), hash it, start its upload."""
    taken = budget.acquire(length)
    buffer: PartBuffer | None = None
    try:
        buffer = PartBuffer(length)
        if read_into(fd, buffer.data, offset) != length:
            raise SourceChanged(path)  # shorter than when we started: rewritten under us
        if digest is not None:
            digest.update(buffer.data)
        future = pool.submit(_upload_part, call, key, path, upload_id, number, buffer)
    except BaseException:
        if buffer is not None:
            buffer.close()
        budget.release(taken)
        raise

    def done(f: Future[tuple[dict[str, Any], bytes]], buffer: PartBuffer = buffer) -> None:
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
                 buffer: PartBuffer) -> tuple[dict[str, Any], bytes]:
    body = buffer.data
    if isinstance(body, mmap.mmap):
        body.seek(0)  # a file-like body: botocore reads it (and seeks back for retries) itself
    reply = call("upload_part", path, Key=key, UploadId=upload_id, PartNumber=number,
                 Body=body if isinstance(body, mmap.mmap) else bytes(body), ChecksumAlgorithm="CRC32")
    part = {"PartNumber": number, "ETag": reply["ETag"]}
    if reply.get("ChecksumCRC32"):
        part["ChecksumCRC32"] = reply["ChecksumCRC32"]
    return part, hashlib.md5(buffer.data).digest()  # noqa: S324 - S3's ETag scheme, not security


def read_whole(source: Path, name: str, expect: FileDigest | None, budget: ByteBudget = TRANSFER_BUDGET
               ) -> tuple[PartBuffer, int]:
    """A small file read once into a buffer taken from ``budget`` (returns it and the bytes
    taken, to release after sending), checked against ``expect`` before anything is sent."""
    with open(source, "rb") as f:
        fd = f.fileno()
        before = os.fstat(fd)
        size = before.st_size
        taken = budget.acquire(size)
        buffer: PartBuffer | None = None
        try:
            buffer = PartBuffer(size)
            got = read_into(fd, buffer.data, 0)
            after = os.fstat(fd)
            if expect is not None:
                digest = FileDigest(hashlib.sha256(memoryview(buffer.data)[:got]).hexdigest(), got)
                if digest != expect:
                    raise mismatch(name, digest, expect, before, after, name)
            elif got != size:
                raise SourceChanged(name)
        except BaseException:
            if buffer is not None:
                buffer.close()
            budget.release(taken)
            raise
    return buffer, taken


def _abort(call: Call, key: str, path: str, upload_id: str) -> None:
    try:
        call("abort_multipart_upload", path, Key=key, UploadId=upload_id, expect=("NoSuchUpload",))
    except (ExpectedError, StoreError) as exc:
        # Not fatal: the upload stays invisible and prune aborts it later.
        log.debug("could not abort upload %s of %s: %s", upload_id, key, exc)


def download(call: Call, pool: Executor, *, key: str, path: str, dest: Path, chunk: int,
             threshold: int, budget: ByteBudget = TRANSFER_BUDGET) -> FileDigest:
    """Write the object to ``dest`` (a new file), hashing the bytes as they are written;
    returns their digest, for the caller to check before it publishes anything.

    Big objects come in parallel ranges into buffers taken from ``budget``; this thread
    hashes and writes them strictly in order (sha256 is sequential), so the bytes hashed are
    the bytes written, and at most the budget's worth of parts wait in memory.
    """
    reply = call("get_object", path, Key=key)
    size = int(reply["ContentLength"])
    etag = str(reply.get("ETag", ""))
    digest = hashlib.sha256()
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        def sink(data: bytes, offset: int) -> None:
            digest.update(data)
            write_all(fd, data)

        if size <= threshold:
            _drain(call, reply, sink, key, path, etag, 0, size)
            return FileDigest(digest.hexdigest(), size)
        # The first range comes from the reply we already have; closing it early discards
        # that one connection, which is cheaper than a separate HEAD on every object.
        part = part_size_for(size, chunk)
        _drain(call, reply, sink, key, path, etag, 0, part)  # closes the reply's body
        _ordered_ranges(call, pool, budget, key, path, etag, part, size, sink)
    finally:
        os.close(fd)
    return FileDigest(digest.hexdigest(), size)


def _ordered_ranges(call: Call, pool: Executor, budget: ByteBudget, key: str, path: str, etag: str,
                    part: int, size: int, sink: Callable[[bytes, int], None]) -> None:
    """Fetch [part, size) in parallel ranges; hand them to ``sink`` in order."""
    starts = list(range(part, size, part))
    pending: deque[tuple[Future[None], PartBuffer, int, int]] = deque()
    following = 0
    try:
        while following < len(starts) or pending:
            # Start as many ranges as the budget allows; wait for it only with nothing in
            # flight (waiting while holding parts only we can release could deadlock).
            while following < len(starts):
                start = starts[following]
                length = min(part, size - start)
                taken = budget.try_acquire(length) if pending else budget.acquire(length)
                if taken is None:
                    break
                try:
                    buffer = PartBuffer(length)
                except BaseException:
                    budget.release(taken)
                    raise
                pending.append((pool.submit(_fetch_range, call, buffer, key, path, etag, start, start + length),
                                buffer, taken, start))
                following += 1
            future, buffer, taken, start = pending.popleft()
            try:
                future.result()
                with memoryview(buffer.data) as view:
                    sink(view, start)  # type: ignore[arg-type]
            finally:
                buffer.close()
                budget.release(taken)
    finally:
        for future, _, _, _ in pending:
            future.cancel()
        wait([f for f, _, _, _ in pending])
        for _, buffer, taken, _ in pending:
            buffer.close()
            budget.release(taken)


def range_get(call: Call, key: str, path: str, etag: str, start: int, end: int) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"IfMatch": etag} if etag else {}
    return call("get_object", path, Key=key, Range=f"bytes={start}-{end - 1}", **kwargs)


def _fetch_range(call: Call, buffer: PartBuffer, key: str, path: str, etag: str, start: int, end: int) -> None:
    def sink(data: bytes, offset: int) -> None:
        buffer.data[offset - start:offset - start + len(data)] = data

    _drain(call, range_get(call, key, path, etag, start, end), sink, key, path, etag, start, end)


def _drain(call: Call, reply: dict[str, Any], sink: Callable[[bytes, int], None], key: str, path: str,
           etag: str, start: int, end: int) -> None:
    """Hand body bytes [start, end) to ``sink`` in order, resuming from the last good byte
    on a reset."""
    offset = start
    body = reply["Body"]
    attempt = 0
    try:
        while offset < end:
            try:
                data = body.read(min(PIECE, end - offset))
                if not data:
                    raise ConnectionError(f"the body of {key} ended at {offset} of {end}")
            except NETWORK_ERRORS as exc:
                attempt += 1
                if attempt >= STREAM_ATTEMPTS:
                    raise StoreError(f"reading {path} kept failing: {exc}", path=path) from exc
                _close(body)  # a broken connection must not linger in the pool
                backoff(attempt)
                body = range_get(call, key, path, etag, offset, end)["Body"]
                continue
            sink(data, offset)
            offset += len(data)
    finally:
        _close(body)


def _close(body: Any) -> None:
    try:
        body.close()
    except NETWORK_ERRORS:
        pass
    except OSError:
        pass


class ObjectReader(io.RawIOBase):
    """A readable stream over one object that survives connection resets (see module doc)."""

    def __init__(self, call: Call, key: str, path: str, reply: dict[str, Any]) -> None:
        super().__init__()
        self._call = call
        self._key = key
        self._path = path
        self._body = reply["Body"]
        self._size = int(reply["ContentLength"])
        self._etag = str(reply.get("ETag", ""))
        self._pos = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        want = min(len(view), self._size - self._pos)
        if want <= 0:
            return 0
        for attempt in range(1, STREAM_ATTEMPTS + 1):
            try:
                data = self._body.read(want)
                if not data:
                    raise ConnectionError(f"the body of {self._key} ended early")
                break
            except NETWORK_ERRORS as exc:
                if attempt == STREAM_ATTEMPTS:
                    raise StoreError(f"reading {self._path} kept failing: {exc}", path=self._path) from exc
                _close(self._body)
                backoff(attempt)
                self._body = range_get(self._call, self._key, self._path, self._etag, self._pos,
                                       self._size)["Body"]
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def readall(self) -> bytes:
        chunks = []
        while chunk := self.read(PIECE):
            chunks.append(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        try:
            _close(self._body)
        finally:
            super().close()
