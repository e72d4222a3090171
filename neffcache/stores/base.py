"""The store interface: a few primitives each backend implements.

Everything bigger (scan, publish, verify, transfer, prune) is built once on top of these, in
its own module, so a new backend is a page of code (fsspec's habit). Paths are always
store-relative POSIX paths that went through :func:`neffcache.keys.safe_relpath`.

The primitives' contract (neffcache.testing.store_contract checks every backend against it):

- ``put_file`` makes a file visible only whole: a reader sees the old state or the complete
  new file, never a prefix. With ``exclusive=True`` it never replaces an existing file and
  returns False instead (the first writer wins).
- ``iter_files`` lists every file below a prefix; files of unfinished writes may appear only
  under names containing ``.neffcache-tmp-`` (so scans can count them as garbage).
- ``delete`` removes what exists and ignores what does not.
- ``walk(prefix, plan)`` is ``iter_dirs`` steered by a scan's plan (stores/walk.py): a store may
  count and hold back what the plan names, or just list.
- ``put_file(..., expect=digest)`` makes the file visible only if the bytes it wrote or sent,
  hashed in the same read, match ``digest``; otherwise it raises SourceChanged (the source was
  rewritten while it was read) or CorruptEntry, and nothing is left at ``path``.
- ``put_hashed(path, source)`` writes a local file whole and returns the sha256 of the bytes it
  wrote or sent, taken in the same read (a publisher computing a manifest from what it sent);
  a source that moved while it was read raises SourceChanged and is not made visible.
- a destination that is full raises NoSpace, whatever the backend's own error.

Every difference between backends that the code above needs is a method or property here, so
nothing outside ``stores/`` asks which class a store is (tests/stores/test_interface.py):

- ``move(src, dst)`` moves a file within the store: a rename where the backend has one, else
  copy and delete (the default). A missing ``src`` raises EntryNotFound.
- ``discard(paths, prune_dirs=...)`` removes files without counting them; ``prune_dirs`` also
  removes the directories that emptied, ``.neffcache/`` ones included, never the root.
- ``remove_empty_dirs(dirs, control=...)`` removes each directory and its parents while they
  are empty (never the root); a no-op on object stores, which have no directories.
- ``exists(path)`` is ``stat(path) is not None``, answered as cheaply as the backend can.
- ``incomplete_uploads(older_than)`` lists writes the backend started and nobody finished that
  it keeps (and bills) invisibly — S3 multipart uploads; ``abort_uploads`` removes them and
  returns how many it aborted. Both are empty where a backend has no such thing.
- ``removal()`` is a batch of reads and removals a prune's chunk goes through: the store's own
  calls by default, directory descriptors held for the batch on a local store
  (:mod:`neffcache.stores.removal`).
- ``created`` says whether opening the store made it (a typo'd path; push and pull say so).

What a backend *is*, as far as the code above acts on it (a directory a runtime can use? can it
fill up? do its lease releases batch? does ``/proc/locks`` see its locks?), is a member of
:class:`~neffcache.stores.roles.StoreRoles`, which Store inherits; ``local_root`` and
``single_writer`` are among them. Code outside ``stores/`` never tests ``local_root`` for None
to work such an answer out itself (tests/stores/test_interface.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from neffcache.entry import FileInfo
from neffcache.errors import EntryNotFound, NoSpace, ReadOnlyStore, SourceChanged
from neffcache.manifest import FileDigest
from neffcache.stores.hashed_io import (
    PIECE,
    check_bytes,
    copy_hashed,
    hash_file,
    is_no_space,
    mismatch,
    moved,
    settled,
    write_all,
)
from neffcache.stores.removal import Removal, StoreRemoval
from neffcache.stores.roles import StoreRoles
from neffcache.stores.walk import DirListing, WalkItem, WalkPlan

FileSource = Path | bytes  # what put_file writes: a local file (``move`` may consume it) or the bytes
CONTROL_DIR = ".neffcache"  # leases, stamps, quarantine: never part of a layout
# Files under these are the store owner's records (the action journal): a directory store
# creates them PRIVATE_FILE_MODE filtered by the umask, even on a shared mount where every other
# file is made group-writable. Group-readable so the team's operators read the history;
# never group-writable (a co-tenant would rewrite who removed what) nor world-readable.
PRIVATE_DIRS = (f"{CONTROL_DIR}/history/",)
PRIVATE_FILE_MODE = 0o640
# In the name of every file a store writes before it is complete (temp files, staging dirs):
# scans count such names as garbage, layouts leave them out of an entry, prune removes them.
TEMP_MARKER = ".neffcache-tmp-"


@dataclass(frozen=True)
class IncompleteUpload:
    """A write a store started and nobody finished (an S3 multipart upload of a killed
    publisher): invisible, but billed."""

    path: str
    upload_id: str
    initiated: float


class Store(StoreRoles, ABC):
    """Where bytes live. Subclasses implement the abstract primitives and answer the
    :class:`StoreRoles` questions that differ from an object store's."""

    scheme: str = ""
    created: bool = False  # whether opening the store made it (see the module docstring)

    def __init__(self, url: str, *, read_only: bool = False) -> None:
        self.url = url
        self.read_only = read_only

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # -- primitives ---------------------------------------------------------------------------
    @abstractmethod
    def iter_files(self, prefix: str = "") -> Iterator[FileInfo]:
        """Every file below ``prefix`` (a directory path, "" for all), in no set order."""

    @abstractmethod
    def stat(self, path: str) -> FileInfo | None:
        """The file at ``path``, or None when there is none."""

    @abstractmethod
    def open_read(self, path: str) -> contextlib.AbstractContextManager[BinaryIO]:
        """A binary stream of the file; raises EntryNotFound when it is missing."""

    @abstractmethod
    def _put_file(self, path: str, source: FileSource, *, exclusive: bool, move: bool) -> bool:
        """Backend part of :meth:`put_file` (the read-only check is done already)."""

    @abstractmethod
    def _delete(self, paths: list[str]) -> int:
        """Backend part of :meth:`delete`; returns how many files existed."""

    # -- conveniences with defaults a backend may override for speed --------------------------
    def iter_dirs(self, prefix: str = "") -> Iterator[DirListing]:
        """``iter_files`` grouped by directory. A directory may come in several listings (this
        default groups runs of consecutive files: an object store lists in key order)."""
        directory: str | None = None
        names: list[str] = []
        files: list[FileInfo] = []
        for info in self.iter_files(prefix):
            head, _, name = info.path.rpartition("/")
            if head != directory:
                if files and directory is not None:
                    yield DirListing(directory, names, files)
                directory, names, files = head, [], []
            names.append(name)
            files.append(info)
        if files and directory is not None:
            yield DirListing(directory, names, files)

    def walk(self, prefix: str = "", plan: WalkPlan | None = None) -> Iterator[WalkItem]:
        """The listings below ``prefix`` as a scan's plan would have them (stores/walk.py): a
        store that can may count what the plan's rules cover (``Counted``) and hold back the
        trees it names to list them in step afterwards (``InStep``); it need not, so the caller
        gives the same answer either way. Default: :meth:`iter_dirs` (an object store lists
        keys, not trees)."""
        return iter(self.iter_dirs(prefix))

    def put_file(self, path: str, source: FileSource, *, exclusive: bool = False, move: bool = False,
                 expect: FileDigest | None = None) -> bool:
        """Write a whole file atomically. ``move`` lets the store consume a local source file.
        With ``expect``, what is written must hash to it (see the module docstring)."""
        self.check_writable()
        with self._no_space(path):
            if expect is None:
                return self._put_file(path, source, exclusive=exclusive, move=move)
            return self._put_verified(path, source, exclusive=exclusive, move=move, expect=expect)

    def put_hashed(self, path: str, source: Path, *, exclusive: bool = False) -> FileDigest | None:
        """Write the local file ``source`` whole at ``path``; the sha256 of the bytes written or
        sent, taken in the read that writes or sends them (None when ``exclusive`` and a file
        is there already: nothing was written).

        The backend checks that the source's fstat held still over that read before it makes
        the file visible (SourceChanged otherwise). File timestamps are coarse, though, so a
        source modified moments before its read began (hashed_io.settled) is read a second
        time and must hash the same: a write landing in the same clock tick would otherwise go
        unseen, and bytes torn by it would be published under a manifest made to match them."""
        self.check_writable()
        started = time.time()
        with self._no_space(path):
            sent = self._put_hashed(path, source, exclusive=exclusive)
        if sent is None:
            return None
        digest, before = sent
        if not settled(before, started):
            again, first, last = hash_file(source)
            if again != digest or moved(before, first) or moved(first, last):
                raise SourceChanged(path)
        return digest

    def _put_hashed(self, path: str, source: Path, *, exclusive: bool) -> tuple[FileDigest, os.stat_result] | None:
        """Backend part of :meth:`put_hashed`: (digest, the source's fstat before the read), or
        None when ``exclusive`` found a file there. This default copies the source into the
        staging directory in one hashed pass and publishes that private copy by move; S3 hashes
        the bytes it sends instead."""
        with self.staging_dir() as staging:
            copy = staging / "hashed.part"
            got, before, after = copy_hashed(source, copy)
            if moved(before, after):
                raise SourceChanged(path)
            if not self._put_file(path, copy, exclusive=exclusive, move=True):
                return None
        return got, before

    @contextlib.contextmanager
    def _no_space(self, path: str) -> Iterator[None]:
        """A full destination is NoSpace, whatever the backend's own error."""
        try:
            yield
        except NoSpace:
            raise
        except OSError as exc:
            if is_no_space(exc):
                raise NoSpace(self.url, path=path, reason=_strerror(exc)) from exc
            raise

    def _put_verified(self, path: str, source: FileSource, *, exclusive: bool, move: bool,
                      expect: FileDigest) -> bool:
        """Backend part of a verified :meth:`put_file`. This default copies a file source into
        the store's staging directory in one hashed read/write pass, checks the digest, and
        publishes that private copy by move; a backend that sends bytes from its own read
        (S3) overrides it."""
        if isinstance(source, bytes):
            check_bytes(path, source, expect)
            return self._put_file(path, source, exclusive=exclusive, move=move)
        if move:
            # The caller hands over a private copy: hash it where it lies, then consume it.
            got, before, after = hash_file(source)
            if got != expect:
                raise mismatch(path, got, expect, before, after, path)
            return self._put_file(path, source, exclusive=exclusive, move=True)
        with self.staging_dir() as staging:
            copy = staging / "verified.part"
            got, before, after = copy_hashed(source, copy)
            if got != expect:
                raise mismatch(path, got, expect, before, after, path)
            return self._put_file(path, copy, exclusive=exclusive, move=True)

    def delete(self, paths: Iterable[str]) -> int:
        """Remove ``paths`` (missing ones are fine); returns how many existed."""
        self.check_writable()
        return self._delete(list(paths))

    def discard(self, paths: Iterable[str], *, prune_dirs: bool = False) -> None:
        """:meth:`delete` without the count, for callers that do not need it: a store where
        counting costs requests (S3 lists the parents first) overrides this. ``prune_dirs``
        removes the directories the removals emptied (see :meth:`remove_empty_dirs`)."""
        paths = list(paths)
        self.delete(paths)
        if prune_dirs:
            self.remove_empty_dirs({p.rpartition("/")[0] for p in paths}, control=True)

    def remove_empty_dirs(self, directories: Iterable[str], *, control: bool = False) -> None:
        """Remove each directory and its parents while they are empty; never the root, and
        ``.neffcache/`` ones only with ``control``. Object stores have no directories: no-op."""

    def move(self, src: str, dst: str) -> None:
        """Move a file within the store (EntryNotFound when ``src`` is missing). This default
        copies and deletes; a backend with a rename overrides it."""
        local = self.local_path(src)
        if local is not None and not local.exists():
            raise EntryNotFound(f"{src} not found in {self.url}", store=self.url, path=src)
        self.put_file(dst, local if local is not None else self.read_bytes(src))
        self.delete([src])

    def exists(self, path: str) -> bool:
        """Whether a file is at ``path``: ``stat(path) is not None``, cheaper where a backend can."""
        return self.stat(path) is not None

    def incomplete_uploads(self, older_than: float | None = None) -> list[IncompleteUpload]:
        """Unfinished writes the backend keeps invisibly, started ``older_than`` seconds ago or
        earlier (all with None). None on most backends."""
        return []

    def abort_uploads(self, uploads: Iterable[IncompleteUpload]) -> int:
        """Abort ``uploads``; returns how many were still there to abort."""
        self.check_writable()
        return 0

    def removal(self) -> Removal:
        """A batch of reads and removals (a prune's chunk): the store's own calls here; a local
        store holds each directory open for the batch."""
        return StoreRemoval(self)

    def read_bytes(self, path: str) -> bytes:
        with self.open_read(path) as stream:
            return stream.read()

    def get_file(self, path: str, dest: Path) -> FileDigest | None:
        """Copy a file to a new local path (not atomically: ``dest`` is the caller's temp file).

        Returns the digest of the bytes written, taken as they were written, or None from a
        backend that copies without hashing (the caller then hashes ``dest`` itself)."""
        digest = hashlib.sha256()
        size = 0
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            with self.open_read(path) as src:
                while chunk := src.read(PIECE):
                    digest.update(chunk)
                    write_all(fd, chunk)
                    size += len(chunk)
        finally:
            os.close(fd)
        return FileDigest(digest.hexdigest(), size)

    def local_path(self, path: str) -> Path | None:
        """A local filesystem path of the file, for stores that have one (zero-copy reads)."""
        return None

    @contextlib.contextmanager
    def staging_dir(self) -> Iterator[Path]:
        """A local directory for downloads that ``put_file(move=True)`` can consume cheaply."""
        with tempfile.TemporaryDirectory(prefix="neffcache-") as tmp:
            yield Path(tmp)

    def check_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyStore(f"store {self.url} is read-only", store=self.url)

    def close(self) -> None:
        """Release connections and threads (no-op for most stores)."""


def _strerror(exc: BaseException) -> str:
    while exc.__cause__ is not None and not (isinstance(exc, OSError) and exc.strerror):
        exc = exc.__cause__
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
