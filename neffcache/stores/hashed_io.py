"""Moving bytes with their digest taken in the same read, and writes that are never short.

The rule this serves ("publish exactly what was verified", README.md "Trust it"): the bytes that are
hashed are the bytes that are written or sent. A file hashed in one read and copied in a
second can change in between, and the copy is then published under a manifest that does not
describe it. So every copy here hashes the very buffer it writes or sends, and the caller
compares the digest with the manifest before the commit marker.

A mismatch is diagnosed from the source's ``fstat`` before and after the read: a file whose
size, mtime or ctime moved was rewritten under us (:class:`SourceChanged`, retry later); one
that held still simply does not match its manifest (:class:`CorruptEntry`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import mmap
import os
from pathlib import Path

from neffcache.errors import CorruptEntry, SourceChanged
from neffcache.manifest import FileDigest
from neffcache.regular import open_regular

PIECE = 1 << 20
# Full-disk errnos: the destination is out of space, quota, or per-file size limit.
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_MMAP_MIN = 1 << 20
SETTLE = 1.0  # seconds; see settled()


def is_no_space(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an error it was raised from) is a full destination."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS:
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def write_all(fd: int, data: bytes | memoryview | mmap.mmap) -> None:
    """``os.write`` until every byte is written: a short write is retried, and a write that
    makes no progress is the full disk it almost always means."""
    view = memoryview(data)
    try:
        while view:
            n = os.write(fd, view)
            if n <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            view = view[n:]
    finally:
        view.release()


def read_into(fd: int, buffer: mmap.mmap | bytearray, offset: int) -> int:
    """Fill ``buffer`` from ``fd`` at ``offset``; returns the bytes read (fewer only at EOF)."""
    view = memoryview(buffer)
    got = 0
    try:
        while got < len(view):
            n = os.preadv(fd, [view[got:]], offset + got)
            if n == 0:
                break
            got += n
    finally:
        view.release()
    return got


class PartBuffer:
    """One part's bytes. Big ones are anonymous mmaps: unmapped the moment they are closed,
    so many threads allocating and freeing 8 MiB never leave RSS in malloc arenas."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.data: mmap.mmap | bytearray = mmap.mmap(-1, size) if size >= _MMAP_MIN else bytearray(size)

    def close(self) -> None:
        if isinstance(self.data, mmap.mmap):
            # A view still exported (a failed request's traceback): the GC unmaps it later.
            with contextlib.suppress(BufferError):
                self.data.close()


def mismatch(name: str, got: FileDigest, expect: FileDigest, before: os.stat_result | None,
             after: os.stat_result | None, where: str) -> Exception:
    """The error for bytes that did not hash to ``expect``: changed under us, or corrupt."""
    if before is not None and after is not None and moved(before, after):
        return SourceChanged(name)
    if got.size != expect.size and after is not None and after.st_size == expect.size:
        return SourceChanged(name)  # it was short or long while we read, and is not now
    return CorruptEntry(where, [f"{name}: sha256 {got.sha256[:12]}… ({got.size} B), manifest says "
                                f"{expect.sha256[:12]}… ({expect.size} B)"])


def check_bytes(name: str, data: bytes, expect: FileDigest) -> None:
    """In-memory bytes cannot change under us: a mismatch is a manifest that does not describe them."""
    got = FileDigest(hashlib.sha256(data).hexdigest(), len(data))
    if got != expect:
        raise mismatch(name, got, expect, None, None, name)


def moved(before: os.stat_result, after: os.stat_result) -> bool:
    """Whether a file's fstat says it was written (or replaced) between the two calls."""
    return (before.st_size, before.st_mtime_ns, before.st_ctime_ns, before.st_ino) != (
        after.st_size, after.st_mtime_ns, after.st_ctime_ns, after.st_ino)


def settled(before: os.stat_result, started: float) -> bool:
    """Whether the file was last modified well before ``started`` (when its read began).

    File timestamps are coarse (the kernel's tick, a few milliseconds), so a write during the
    read that lands in the same tick as the write before it leaves mtime and ctime unchanged:
    :func:`moved` cannot see it. A file modified SETTLE seconds or more before its read
    began would show any such write; a younger one must be read twice to be trusted."""
    return max(before.st_mtime, before.st_ctime) < started - SETTLE


def copy_hashed(source: Path, dest: Path) -> tuple[FileDigest, os.stat_result, os.stat_result]:
    """Copy ``source`` to a new file ``dest`` in one read, hashing what is written; returns
    (digest of the bytes written, the source's fstat before, after)."""
    digest = hashlib.sha256()
    size = 0
    buffer = bytearray(PIECE)
    with open(open_regular(source), "rb", buffering=0) as src:
        before = os.fstat(src.fileno())
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(buffer)
            try:
                while n := src.readinto(view):
                    chunk = view[:n]
                    digest.update(chunk)
                    write_all(fd, chunk)
                    chunk.release()
                    size += n
            finally:
                view.release()
        finally:
            os.close(fd)
        after = os.fstat(src.fileno())
    return FileDigest(digest.hexdigest(), size), before, after


def hash_file(path: Path) -> tuple[FileDigest, os.stat_result, os.stat_result]:
    """sha256 of a file, with its fstat before and after the read (for :func:`mismatch`)."""
    with open(open_regular(path), "rb") as f:
        before = os.fstat(f.fileno())
        digest = hashlib.file_digest(f, "sha256")
        size = f.tell()
        after = os.fstat(f.fileno())
    return FileDigest(digest.hexdigest(), size), before, after
