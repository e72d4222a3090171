"""A cache root on a local or shared filesystem (NVMe, EBS, FSx for Lustre, EFS, NFS).

Every write goes to a unique temp name in the target directory and is renamed into place,
so a reader (or ``kill -9``) never sees a prefix of a file. Exclusive writes use ``link(2)``,
which fails if the name exists, instead of ``flock``: Lustre, GPFS and some NFS mounts fake
flock and let every caller "succeed".

Shared mode (``fsx://`` or ``shared=True``) is for a mount several hosts write: files are
group-writable (0o664), directories setgid and group-writable (0o2775) so every member of
the training group can publish and prune, whatever its umask.

Nothing leaves the root: every path below it is reached by a descriptor walk that follows no
symlink (:mod:`neffcache.stores.safepath`), for reads, writes, renames and deletes alike,
``.neffcache/`` and the staging directory included. Symlinks found below the root:

- a link to a *file inside the root* is listed with its target's size and read through (the
  target walked again from the root). The Hugging Face hub's cache (``snapshots/<rev>/x ->
  ../../blobs/<sha>``), which optimum-neuron's Hub proxy reproduces, is built of such links;
  refusing them would call good entries corrupt, and reading them cannot leave the root;
- a link out of the root, a dangling link and a link to a directory are never followed: a
  listing reports them in ``DirListing.problems`` (a scan makes their entry CORRUPT) and an
  operation on a path through them raises :class:`~neffcache.errors.UnsafePath`;
- writes and deletes act on a link itself (rename replaces it, unlink removes it), never on
  what it points to; a write or delete whose directory is a link is refused.

``local_path`` hands out a path callers open themselves (boto3 uploads, the compiler): it is
returned only after the same walk found no link on the way (an in-root file link is resolved to
its target's path). What is left is the window between that check and the caller's open; reads
this store does itself (``open_read``, ``get_file``, ``put_file`` from a file below the root,
such as a staging file) go through descriptors and have none.

The store is the interface and its error mapping; the work is done by four modules beside it:
:mod:`~neffcache.stores.local_listing` (the walk a scan runs), :mod:`~neffcache.stores.local_write`
(temp name, rename, ``link(2)``, shared modes), :mod:`~neffcache.stores.local_remove` (batch
deletes through descriptors held for the batch) and :mod:`~neffcache.stores.safepath` (the
descriptor walk).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, cast

from neffcache.entry import FileInfo
from neffcache.errors import AccessDenied, EntryNotFound, StoreError, StoreUnavailable, UnsafePath
from neffcache.keys import is_canonical_relpath, safe_relpath
from neffcache.regular import not_regular, open_regular
from neffcache.stores.base import CONTROL_DIR, PRIVATE_DIRS, TEMP_MARKER, FileSource, Store
from neffcache.stores.local_in_step import walk_together
from neffcache.stores.local_listing import list_threaded, walk
from neffcache.stores.local_remove import LocalRemoval
from neffcache.stores.local_write import SHARED_DIR_MODE, publish_temp, temp_name, write_temp
from neffcache.stores.mounts import filesystem_type, is_memory_filesystem
from neffcache.stores.safepath import DIR_FLAGS, SafeRoot, copy_fd, lexists
from neffcache.stores.walk import DirListing, WalkItem, WalkPlan

log = logging.getLogger(__name__)



class LocalStore(Store):
    scheme = "file"

    def __init__(self, root: str | os.PathLike[str], *, shared: bool = False, read_only: bool = False,
                 create: bool = True, url: str | None = None, list_workers: int | None = None) -> None:
        self.root = Path(root).absolute()
        self.shared = shared
        # Shared mounts pay a network round trip per stat: list with many threads there. A
        # local disk answers from the dentry cache in a microsecond or two, and threads only
        # add GIL handoffs around each stat (a 100k-entry scan took twice as long with 4).
        self.list_workers = list_workers if list_workers is not None else (16 if shared else 1)
        super().__init__(url or ("fsx://" if shared else "file://") + str(self.root), read_only=read_only)
        self._control = self.root / CONTROL_DIR
        # The root is reopened by path for every operation (not one descriptor held): a root
        # that is replaced (a remount, a restore) is then served like before.
        self._safe = SafeRoot(str(self.root), self.url, dir_mode=SHARED_DIR_MODE if shared else None)
        self.created = False  # whether opening it made the root (a typo'd path says so: push/pull)
        if not self.root.exists():
            if create and not read_only:
                self._make_root()
                self.created = True
            else:
                raise StoreUnavailable(f"cache root {self.root} does not exist", store=self.url)
        elif not self.root.is_dir():
            raise StoreUnavailable(f"cache root {self.root} is not a directory", store=self.url)

    # -- paths --------------------------------------------------------------------------------
    @property
    def local_root(self) -> Path | None:
        return self.root

    @property
    def single_writer(self) -> bool:
        # Several hosts write a shared mount, and an NFS client may answer a lookup of a name
        # another host just created from its negative-lookup cache.
        return not self.shared

    # -- what sets a directory apart from an object store (neffcache/stores/roles.py) ---------
    @property
    def runtime_root(self) -> Path | None:
        return self.root

    @property
    def watchable_root(self) -> Path | None:
        return self.root

    @property
    def host_locks_visible(self) -> bool:
        # A shared mount too: /proc/locks lists the locks this host's processes hold on it.
        return True

    @property
    def may_be_pruned_by_group(self) -> bool:
        # Shared or not: another process may open this same root unshared and prune by group.
        return True

    @property
    def batches_lease_releases(self) -> bool:
        return False

    @property
    def can_fill(self) -> bool:
        return True

    def free_bytes(self) -> int | None:
        try:
            st = os.statvfs(self.root)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize

    @property
    def calls_wait(self) -> bool:
        return not is_memory_filesystem(filesystem_type(self.root))

    def local_path(self, path: str) -> Path | None:
        """The file's path, checked: no component below the root is a symlink, and an in-root
        file link is resolved to its target (callers hand the path to boto3 and to the
        compiler, which take no descriptor). Raises UnsafePath otherwise."""
        rel = safe_relpath(path)
        try:
            real, st = self._safe.stat(rel)
        except (FileNotFoundError, NotADirectoryError):
            return self.root / rel  # nothing there: the caller's own open says so
        except PermissionError as exc:
            raise AccessDenied(f"cannot read {self.root / rel}: {exc.strerror}", store=self.url, path=path) from exc
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            # A FIFO or device: its caller would open it by name and wait for ever. (One
            # swapped in after this check is caught by that open: neffcache/regular.py.)
            raise not_regular(rel, st.st_mode, self.url)
        return self.root / real

    def _make_root(self) -> None:
        # The root itself is the operator's choice: made by path, symlinks above it are theirs.
        try:
            if self.shared:
                # mkdir's mode is filtered by the umask: set the bits explicitly afterwards.
                missing = []
                probe = self.root
                while not probe.exists():
                    missing.append(probe)
                    probe = probe.parent
                for d in reversed(missing):
                    with contextlib.suppress(FileExistsError):
                        d.mkdir()
                        os.chmod(d, SHARED_DIR_MODE)
            else:
                self.root.mkdir(parents=True, exist_ok=True)
        except PermissionError as exc:
            raise AccessDenied(f"cannot create {self.root}: {exc.strerror}", store=self.url) from exc
        except OSError as exc:
            raise StoreError(f"cannot create {self.root}: {exc.strerror}", store=self.url) from exc

    # -- primitives ---------------------------------------------------------------------------
    def iter_files(self, prefix: str = "") -> Iterator[FileInfo]:
        for listing in self.iter_dirs(prefix):
            yield from listing.files

    def iter_dirs(self, prefix: str = "") -> Iterator[DirListing]:
        # Without a plan the walk yields listings only (no count, no batch).
        return cast(Iterator[DirListing], self._iter_dirs(prefix, None, None))

    def walk(self, prefix: str = "", plan: WalkPlan | None = None) -> Iterator[WalkItem]:
        # The depth-first walk counts and holds back what the plan names; the threaded listing
        # (shared mounts) does neither (yet): it lists, which gives the same answer.
        if plan is None or self.list_workers > 1:
            yield from self.iter_dirs(prefix)
            return
        held: dict[str, list[str]] = {}  # group -> its trees the walk held back
        yield from self._iter_dirs(prefix, plan, held)
        for group, trees in sorted(held.items()):
            yield from walk_together(self._safe, sorted(trees), plan, group)

    def _iter_dirs(self, prefix: str, plan: WalkPlan | None, held: dict[str, list[str]] | None
                   ) -> Iterator[WalkItem]:
        start = safe_relpath(prefix) if prefix else ""
        try:
            fd = self._safe.open_dir(start)
        except (FileNotFoundError, NotADirectoryError):
            return
        except PermissionError as exc:
            raise AccessDenied(f"cannot list {self.root / start}: {exc.strerror}", store=self.url) from exc
        if self.list_workers <= 1:
            yield from walk(self._safe, fd, start, plan, held)
        else:
            yield from list_threaded(self._safe, fd, start, self.list_workers)

    def stat(self, path: str) -> FileInfo | None:
        rel = safe_relpath(path)
        try:
            _, st = self._safe.stat(rel)
        except (FileNotFoundError, NotADirectoryError):
            return None
        # A directory (or a fifo, a socket) is not a file of the store: S3 and fsspec answer
        # None for a "directory" too, so callers never mistake a prefix for an entry's file.
        if not stat.S_ISREG(st.st_mode):
            return None
        return FileInfo(rel, st.st_size, st.st_mtime)

    def _open_fd(self, path: str) -> int:
        try:
            return self._safe.open_file(safe_relpath(path))
        except (FileNotFoundError, NotADirectoryError):
            raise EntryNotFound(f"{path} not found in {self.url}", store=self.url, path=path) from None
        except PermissionError as exc:
            raise AccessDenied(f"cannot read {path} in {self.url}: {exc.strerror}", store=self.url,
                               path=path) from exc

    @contextlib.contextmanager
    def open_read(self, path: str) -> Iterator[BinaryIO]:
        with os.fdopen(self._open_fd(path), "rb") as stream:
            yield stream

    def get_file(self, path: str, dest: Path) -> None:
        src = self._open_fd(path)
        try:
            out = self._open_dest(dest)
            try:
                copy_fd(src, out)
            finally:
                os.close(out)
        finally:
            os.close(src)

    def _open_dest(self, dest: Path) -> int:
        """Open a caller's local file for writing; one below our root (a staging file) is
        reached by the walk, so a swapped link cannot redirect it."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        rel = self._safe.under(dest)
        if rel is None:
            return open_regular(dest, flags)
        with self._safe.parent(rel) as (fd, name):
            return open_regular(name, flags | os.O_NOFOLLOW, dir_fd=fd, store=self.url, shown=rel)

    def _put_file(self, path: str, source: FileSource, *, exclusive: bool, move: bool) -> bool:
        rel = safe_relpath(path)
        head, _, name = rel.rpartition("/")
        try:
            for attempt in range(3):
                fd = self._safe.open_dir(head, create=True)
                try:
                    if exclusive and lexists(fd, name):
                        return False  # cheap early answer; link(2) below is the real arbiter
                    tmp = temp_name(name)
                    try:
                        write_temp(self._safe, fd, tmp, source, move=move, shared=self.shared,
                                   private=isinstance(source, bytes) and rel.startswith(PRIVATE_DIRS))
                    except FileNotFoundError:
                        # A concurrent prune removed the (then empty) directory: make it again.
                        if attempt == 2 or (isinstance(source, Path) and not source.exists()):
                            raise
                        continue
                    return publish_temp(fd, tmp, name, exclusive=exclusive)
                finally:
                    os.close(fd)
        except UnsafePath:
            raise
        except PermissionError as exc:
            raise AccessDenied(f"cannot write {self.root / rel}: {exc.strerror}", store=self.url, path=path) from exc
        except OSError as exc:
            if exc.errno == errno.EROFS:
                raise AccessDenied(f"{self.root} is mounted read-only", store=self.url) from exc
            message = f"cannot write {self.root / rel}: {exc.strerror or exc}"
            raise StoreError(message, store=self.url, path=path) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _delete(self, paths: list[str]) -> int:
        return self.unlink_many([safe_relpath(p) for p in paths])

    def discard(self, paths: Iterable[str], *, prune_dirs: bool = False) -> None:
        # Straight to the descriptor walk, which never follows a symlink: ``delete`` would also
        # count. The paths come from this store's listing or from neffcache's own names (prune
        # discards 100k entries' files in a few calls), so one regex finds the few that need
        # the full check, which costs more than the unlink itself at that scale.
        self.check_writable()
        paths = list(paths)
        if not all(is_canonical_relpath(p) for p in paths):
            paths = [safe_relpath(p) for p in paths]
        self.unlink_many(paths, prune_dirs=prune_dirs, control=True)

    def exists(self, path: str) -> bool:
        # One lstat for the common answer (nothing there); a hit is confirmed through the walk,
        # which refuses a symlink on the way.
        rel = safe_relpath(path)
        if not os.path.lexists(f"{self.root}/{rel}"):
            return False
        return self.stat(rel) is not None

    def unlink_many(self, paths: list[str], *, prune_dirs: bool = True, control: bool = False) -> int:
        """Unlink store-relative ``paths`` (already safe), each directory walked to once; a name
        that is a symlink loses the link, never its target. Returns how many existed.

        ``prune_dirs`` removes the directories the unlinks emptied (``control``: also those
        under ``.neffcache/``, which otherwise churn and are kept)."""
        with self.removal() as batch:
            return batch.unlink(paths, prune_dirs=prune_dirs, control=control)

    def remove_empty_dirs(self, directories: Iterable[str], *, control: bool = False) -> None:
        """Remove each directory and its parents while they are empty; never the root, never
        through a symlink (rmdir of a link fails), and ``.neffcache/`` only with ``control``."""
        with self.removal() as batch:
            batch.remove_empty_dirs(directories, control=control)

    def removal(self) -> LocalRemoval:
        """A batch of reads and removals through directory descriptors opened once
        (:mod:`neffcache.stores.local_remove`)."""
        return LocalRemoval(self._safe)

    def move(self, src: str, dst: str) -> None:
        self.check_writable()
        s, d = safe_relpath(src), safe_relpath(dst)
        shead, _, sname = s.rpartition("/")
        try:
            sfd = self._safe.open_dir(shead)
            try:
                with self._safe.parent(d, create=True) as (dfd, dname):
                    os.replace(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
            finally:
                os.close(sfd)
        except (FileNotFoundError, NotADirectoryError):
            raise EntryNotFound(f"{src} not found in {self.url}", store=self.url, path=src) from None
        self.remove_empty_dirs([shead])

    @contextlib.contextmanager
    def staging_dir(self) -> Iterator[Path]:
        # Inside the root, so put_file(move=True) renames instead of copying. Made and removed
        # through the walk; files in it are read back through the walk too (put_file, get_file).
        base = f"{CONTROL_DIR}/staging"
        name = f"{TEMP_MARKER.strip('.')}{secrets.token_hex(8)}"
        try:
            with self._safe.parent(f"{base}/{name}", create=True) as (fd, _):
                os.mkdir(name, 0o777, dir_fd=fd)
                if self.shared:
                    sub = os.open(name, DIR_FLAGS, dir_fd=fd)
                    try:
                        os.fchmod(sub, SHARED_DIR_MODE)
                    finally:
                        os.close(sub)
        except UnsafePath:
            raise
        except PermissionError as exc:
            raise AccessDenied(f"cannot create {self.root / base}: {exc.strerror}", store=self.url) from exc
        except OSError as exc:
            raise StoreError(f"cannot create {self.root / base}: {exc.strerror}", store=self.url) from exc
        try:
            yield self.root / base / name
        finally:
            try:
                with self._safe.parent(f"{base}/{name}") as (fd, _):
                    # rmtree with dir_fd is the descriptor-based walk that never follows a link.
                    shutil.rmtree(name, dir_fd=fd, ignore_errors=True)
            except OSError as exc:
                log.warning("left staging directory %s/%s in %s: %s", base, name, self.url, exc)
