"""Reading from S3: ranged parallel downloads hashed as they are written, resumable reads.

A body that breaks mid-stream (a reset connection after the headers came back) is beyond
botocore's retries: the readers here resume from the last byte they got, with ``IfMatch``
on the ETag so a resumed read can never splice two versions of an object together.
Uploads are in :mod:`neffcache.stores.s3_transfer`.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, wait
from pathlib import Path
from typing import Any

from neffcache.errors import StoreError
from neffcache.manifest import FileDigest
from neffcache.stores.budget import TRANSFER_BUDGET, ByteBudget
from neffcache.stores.hashed_io import PIECE, PartBuffer, write_all
from neffcache.stores.s3_errors import NETWORK_ERRORS
from neffcache.stores.s3_transfer import Call, backoff, part_size_for

STREAM_ATTEMPTS = 6
# Bytes asked of a response body per read. Each read allocates a fresh bytes object outside the
# transfer budget, once per download in flight (--parallel of them, and the ranges of big
# objects): 1 MiB pieces took a pull of 300 entries at --parallel 64 to 197 MB peak RSS (glibc
# keeps freed blocks of that size in its per-thread arenas), 256 KiB pieces to 127 MB.
READ_PIECE = 256 << 10


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
                data = body.read(min(READ_PIECE, end - offset))
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
