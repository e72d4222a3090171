"""Removing files below a local cache root through directory descriptors held for one batch.

A prune removes an entry in three phases (marker, blobs, anchor: neffcache/layouts/base.py's
``removal_phases``), after listing it again to compare it with the plan. Walked from the root
for every phase, that cost an entry a dozen ``openat``s more than ``rm -rf`` pays; a
:class:`LocalRemoval` instead opens each directory of a batch once (the walk of
:mod:`neffcache.stores.safepath`, no symlink followed) and does every listing, ``fstatat``,
``unlinkat`` and ``rmdir`` of the batch relative to that descriptor.

Why holding the descriptors keeps the containment argument true:

- a descriptor is only ever obtained by the walk that refuses a symlink in every component,
  so every name acted on is a name *in that directory inode*; an ``unlinkat`` of a name that
  is a symlink removes the link, never its target, and ``rmdir`` of a link fails;
- the names a batch unlinks are the ones its own listing found in that same inode (the caller
  compares the listing with the plan first): a file another tool adds under a new name
  meanwhile is never named, and keeps its directory (``rmdir`` fails: not empty);
- a directory renamed away (even out of the root) after it was opened takes the batch's
  descriptor with it: the batch then only removes, inside it, the files it listed there
  itself. The walk-per-phase it replaces had the same window, between each walk and its unlink;
- the cache of descriptors is bounded (:attr:`BatchDirs.LIMIT`), and a descriptor is used only
  before the next one is opened (eviction may close it), so one is never reused stale;
- what was found missing is remembered for the batch only (a stamp directory that does not
  exist is not looked for once per entry): the batch is short, and a stamp left behind only
  makes an entry look used. A caller that needs to see files made during the batch does not
  look through it (a prune reads last-use stamps afresh; neffcache/prune/run.py says why its
  look for publish leases may go through the batch).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

from neffcache.entry import FileInfo
from neffcache.errors import AccessDenied, UnsafePath
from neffcache.keys import is_canonical_relpath, listed_relpath
from neffcache.stores.base import CONTROL_DIR
from neffcache.stores.safepath import BatchDirs, MissingDir, SafeRoot


class LocalRemoval:
    """One batch of reads and removals below ``safe``'s root; use as a context manager."""

    def __init__(self, safe: SafeRoot) -> None:
        self.safe = safe
        self.dirs = BatchDirs(safe)
        self.missing: set[str] = set()

    def __enter__(self) -> LocalRemoval:
        return self

    def __exit__(self, *exc: object) -> None:
        self.dirs.close()

    def _gone(self, rel: str) -> bool:
        while rel:
            if rel in self.missing:
                return True
            rel = rel.rpartition("/")[0]
        return False

    def directory(self, rel: str) -> int | None:
        """The descriptor of ``rel`` (owned by the batch: use it before opening another), or
        None when it is not there. Raises UnsafePath for a symlinked component."""
        if self.missing and self._gone(rel):
            return None
        try:
            return self.dirs.open(rel)
        except MissingDir as exc:  # the topmost missing directory: its whole subtree is missing
            self.missing.add(exc.rel)
            return None
        except (FileNotFoundError, NotADirectoryError):
            self.missing.add(rel)
            return None
        except PermissionError as exc:
            raise AccessDenied(f"cannot open {self.safe.root}/{rel}: {exc.strerror}", store=self.safe.store,
                               path=rel) from exc

    def list_files(self, rel: str) -> list[FileInfo]:
        """A local store's ``iter_files(rel)``: the files below ``rel``, subdirectories included
        (vLLM's entries nest theirs). In-root file links count with their target's size; any
        other link, and a file that went away meanwhile, is left out."""
        fd = self.directory(rel)
        if fd is None:
            return []
        out: list[FileInfo] = []
        subdirs: list[str] = []
        prefix = f"{rel}/" if rel else ""
        with os.scandir(fd) as it:  # its own duplicate of fd: valid whatever the cache closes
            for item in it:
                try:
                    if item.is_dir(follow_symlinks=False):
                        subdirs.append(prefix + item.name)
                        continue
                    if item.is_file(follow_symlinks=False):
                        st = item.stat(follow_symlinks=False)
                    elif item.is_symlink():
                        st = self.safe.resolve_listed_link(fd, rel, item.name)  # walks from the root
                    else:
                        continue
                except (FileNotFoundError, NotADirectoryError, UnsafePath):
                    continue
                if stat.S_ISREG(st.st_mode):
                    out.append(FileInfo(prefix + item.name, st.st_size, st.st_mtime))
        for sub in subdirs:  # after the loop: opening them may evict ``fd`` from the cache
            out.extend(self.list_files(sub))
        return out

    def stat(self, path: str) -> FileInfo | None:
        """A local store's ``stat``, the directory's descriptor held (an in-root file link is
        followed by a walk from the root, as :meth:`SafeRoot.stat` does)."""
        head, _, name = path.rpartition("/")
        fd = self.directory(head)
        if fd is None:
            return None
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                st = self.safe.stat(path)[1]
        except (FileNotFoundError, NotADirectoryError):
            return None
        return FileInfo(path, st.st_size, st.st_mtime) if stat.S_ISREG(st.st_mode) else None

    def exists(self, path: str) -> bool:
        """``Store.exists`` (a file, or an in-root link to one), as of the batch's directories."""
        return self.stat(path) is not None

    def discard(self, paths: Iterable[str], *, prune_dirs: bool = False) -> None:
        """``Store.discard`` of a local store (paths from its listing or neffcache's own names).

        A name outside the key character set (``MODULE_1 (copy)+…``, bytes that are not
        UTF-8) is removed by its raw name: it came from this store's listing, and every
        unlink goes through a descriptor of its directory, so no component can be a link and
        ``listed_relpath`` refuses the only names that could climb (``..``, empty)."""
        paths = list(paths)
        if not all(is_canonical_relpath(p) for p in paths):
            paths = [listed_relpath(p) for p in paths]
        self.unlink(paths, prune_dirs=prune_dirs, control=True)

    def unlink(self, paths: list[str], *, prune_dirs: bool = True, control: bool = False) -> int:
        """Unlink store-relative ``paths`` (already safe); returns how many existed. A name that
        is a symlink loses the link, never its target. ``prune_dirs`` removes the directories
        the unlinks emptied (``control``: also those under ``.neffcache/``)."""
        removed = 0
        parents: list[str] = []
        by_dir: dict[str, list[str]] = {}
        for path in paths:
            head, _, name = path.rpartition("/")
            by_dir.setdefault(head, []).append(name)
        for head, names in by_dir.items():
            fd = self.directory(head)
            if fd is None:
                continue
            gone = 0
            for name in names:
                try:
                    os.unlink(name, dir_fd=fd)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                except PermissionError as exc:
                    path = f"{head}/{name}" if head else name
                    raise AccessDenied(f"cannot delete {self.safe.root}/{path}: {exc.strerror}",
                                       store=self.safe.store, path=path) from exc
                gone += 1
            if gone:
                removed += gone
                parents.append(head)
        # Empty entry and shard directories would otherwise pile up (and slow every scan).
        if prune_dirs:
            self.remove_empty_dirs(parents, control=control)
        return removed

    def remove_empty_dirs(self, directories: Iterable[str], *, control: bool = False) -> None:
        """Remove each directory and its parents while they are empty; never the root, never
        through a symlink (rmdir of a link fails), and ``.neffcache/`` only with ``control``."""
        full: set[str] = set()  # found not empty: every entry of a namespace shares one parent
        todo = sorted(set(directories), key=lambda p: p.count("/"), reverse=True)
        pending = set(todo)  # tried in their turn, after every deeper one: not climbed into before
        for directory in todo:
            pending.discard(directory)
            rel = directory
            while rel and rel not in full and (rel == directory or rel not in pending):
                if not control and (rel == CONTROL_DIR or rel.startswith(CONTROL_DIR + "/")):
                    break  # lease shards and the like churn constantly and are few: keep them
                head, _, name = rel.rpartition("/")
                try:
                    fd = self.directory(head)
                    if fd is None:
                        break
                    self.dirs.forget(rel)
                    os.rmdir(name, dir_fd=fd)
                except OSError:
                    full.add(rel)
                    break
                self.missing.add(rel)
                rel = head
