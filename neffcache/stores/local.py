"""A cache root on a local or shared filesystem (NVMe, EBS, FSx for Lustre, EFS, NFS).

Every write goes to a unique temp name in the target directory and is renamed into place,
so a reader (or ``kill -9``) never sees a prefix of a file. Exclusive writes use ``link(2)``,
which fails if the name exists, instead of ``flock``: Lustre, GPFS and some NFS mounts fake
flock and let every caller "succeed".

Shared mode (``fsx://`` or ``shared=True``) is for a mount several hosts write: files are
group-writable (0o664), directories setgid and group-writable (0o2775) so every member of
the training group can publish and prune, whatever its umask.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import BinaryIO

from neffcache.entry import FileInfo
from neffcache.errors import AccessDenied, EntryNotFound, StoreError, StoreUnavailable
from neffcache.keys import safe_relpath
from neffcache.layouts.base import TEMP_MARKER
from neffcache.stores.base import CONTROL_DIR, DirListing, Source, Store

SHARED_FILE_MODE = 0o664
SHARED_DIR_MODE = 0o2775


def _list_dirs(directories: list[str], root_len: int) -> tuple[list[str], list[DirListing]]:
    """List a batch of directories: (their subdirectories, their regular files)."""
    subdirs: list[str] = []
    listings: list[DirListing] = []
    add_dir, new = subdirs.append, tuple.__new__
    for directory in directories:
        rel = directory[root_len:]
        prefix = rel + "/" if rel else ""
        names: list[str] = []
        files: list[FileInfo] = []
        add_name, add_file = names.append, files.append
        try:
            with os.scandir(directory) as it:
                for item in it:
                    # d_type answers is_dir/is_file without a syscall: stat regular files only.
                    try:
                        if item.is_dir(follow_symlinks=False):
                            add_dir(item.path)
                            continue
                        if not item.is_file(follow_symlinks=False):
                            continue
                        st = item.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # removed while we listed: a concurrent prune or publish
                    if st.st_mode & 0o170000 == 0o100000:  # still a regular file
                        name = item.name
                        add_name(name)
                        # tuple.__new__ skips the NamedTuple's Python-level __new__: this runs
                        # once per file, hundreds of thousands of times a scan.
                        add_file(new(FileInfo, (prefix + name, st.st_size, st.st_mtime)))
        except (FileNotFoundError, NotADirectoryError):
            continue
        if files:
            listings.append(DirListing(rel, names, files))
    return subdirs, listings


def temp_name(name: str) -> str:
    return f".{name}{TEMP_MARKER}{secrets.token_hex(6)}"


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
        if not self.root.exists():
            if create and not read_only:
                self._makedirs(self.root)
            else:
                raise StoreUnavailable(f"cache root {self.root} does not exist", store=self.url)
        elif not self.root.is_dir():
            raise StoreUnavailable(f"cache root {self.root} is not a directory", store=self.url)

    # -- paths --------------------------------------------------------------------------------
    def _abs(self, path: str) -> Path:
        return self.root / safe_relpath(path)

    def local_path(self, path: str) -> Path | None:
        return self._abs(path)

    def _makedirs(self, directory: Path) -> None:
        for attempt in range(5):
            try:
                self._makedirs_once(directory)
                return
            except StoreError as exc:
                # A concurrent delete pruned an empty parent between our mkdir calls: again.
                if not isinstance(exc.__cause__, FileNotFoundError) or attempt == 4:
                    raise

    def _makedirs_once(self, directory: Path) -> None:
        if directory.is_dir():
            return
        try:
            if self.shared:
                # mkdir's mode is filtered by the umask: set the bits explicitly afterwards.
                missing = []
                probe = directory
                while not probe.exists():
                    missing.append(probe)
                    probe = probe.parent
                for d in reversed(missing):
                    with contextlib.suppress(FileExistsError):
                        d.mkdir()
                        os.chmod(d, SHARED_DIR_MODE)
            else:
                directory.mkdir(parents=True, exist_ok=True)
        except PermissionError as exc:
            raise AccessDenied(f"cannot create {directory}: {exc.strerror}", store=self.url) from exc
        except OSError as exc:
            raise StoreError(f"cannot create {directory}: {exc.strerror}", store=self.url) from exc

    # -- primitives ---------------------------------------------------------------------------
    def iter_files(self, prefix: str = "") -> Iterator[FileInfo]:
        for listing in self.iter_dirs(prefix):
            yield from listing.files

    def iter_dirs(self, prefix: str = "") -> Iterator[DirListing]:
        start = self._abs(prefix) if prefix else self.root
        root_len = len(str(self.root)) + 1
        pending = [str(start)]
        # Sequential while there is at most one directory to list: an entry directory (the
        # common small listing, load_entry's) costs no thread pool.
        while len(pending) == 1 or (pending and self.list_workers <= 1):
            subdirs, listings = _list_dirs([pending.pop()], root_len)
            pending.extend(subdirs)
            yield from listings
        if not pending:
            return
        # On Lustre/NFS every stat is a round trip to a metadata server: list many directories
        # at once. Batches keep the per-task overhead small next to the syscalls.
        with ThreadPoolExecutor(self.list_workers, thread_name_prefix="neffcache-list") as pool:
            running: set[Future[tuple[list[str], list[DirListing]]]] = set()
            while pending or running:
                while pending and len(running) < self.list_workers * 2:
                    size = max(1, min(64, len(pending) // self.list_workers))
                    batch, pending = pending[:size], pending[size:]
                    running.add(pool.submit(_list_dirs, batch, root_len))
                done, running = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    subdirs, listings = future.result()
                    pending.extend(subdirs)
                    yield from listings

    def stat(self, path: str) -> FileInfo | None:
        try:
            st = self._abs(path).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return FileInfo(safe_relpath(path), st.st_size, st.st_mtime)

    @contextlib.contextmanager
    def open_read(self, path: str) -> Iterator[BinaryIO]:
        try:
            stream = open(self._abs(path), "rb")  # noqa: SIM115 - closed below
        except (FileNotFoundError, NotADirectoryError):
            raise EntryNotFound(f"{path} not found in {self.url}", store=self.url, path=path) from None
        with stream:
            yield stream

    def get_file(self, path: str, dest: Path) -> None:
        try:
            shutil.copyfile(self._abs(path), dest)
        except (FileNotFoundError, NotADirectoryError):
            raise EntryNotFound(f"{path} not found in {self.url}", store=self.url, path=path) from None

    def _put_file(self, path: str, source: Source, *, exclusive: bool, move: bool) -> bool:
        final = self._abs(path)
        if exclusive and final.exists():
            return False  # cheap early answer; link(2) below is the real arbiter
        tmp = final.parent / temp_name(final.name)
        try:
            for attempt in range(3):
                self._makedirs(final.parent)
                try:
                    self._write_temp(tmp, source, move=move)
                    break
                except FileNotFoundError:
                    # A concurrent prune removed the (then empty) directory: make it again.
                    if attempt == 2 or (isinstance(source, Path) and not source.exists()):
                        raise
            if exclusive:
                try:
                    os.link(tmp, final)
                except FileExistsError:
                    return False
                finally:
                    tmp.unlink(missing_ok=True)
            else:
                os.replace(tmp, final)
        except PermissionError as exc:
            tmp.unlink(missing_ok=True)
            raise AccessDenied(f"cannot write {final}: {exc.strerror}", store=self.url, path=path) from exc
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if exc.errno == errno.EROFS:
                raise AccessDenied(f"{self.root} is mounted read-only", store=self.url) from exc
            message = f"cannot write {final}: {exc.strerror or exc}"
            raise StoreError(message, store=self.url, path=path) from exc
        except BaseException:
            tmp.unlink(missing_ok=True)  # Ctrl-C mid-copy: leave no temp file behind
            raise
        return True

    def _write_temp(self, tmp: Path, source: Source, *, move: bool) -> None:
        if isinstance(source, bytes):
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "wb") as out:
                out.write(source)
        elif move:
            try:
                os.rename(source, tmp)  # same filesystem: no copy at all
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                shutil.copyfile(source, tmp)
        else:
            shutil.copyfile(source, tmp)
        if self.shared:
            os.chmod(tmp, SHARED_FILE_MODE)
            # A host that crashes (not just a killed process) after the rename must not leave
            # every other host a NEFF whose blocks never reached the servers: flush first.
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _delete(self, paths: list[str]) -> int:
        removed = 0
        parents: set[Path] = set()
        for path in paths:
            target = self._abs(path)
            try:
                target.unlink()
                removed += 1
                parents.add(target.parent)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except PermissionError as exc:
                raise AccessDenied(f"cannot delete {target}: {exc.strerror}", store=self.url) from exc
        # Empty entry and shard directories would otherwise pile up (and slow every scan).
        for parent in sorted(parents, key=lambda p: len(p.parts), reverse=True):
            self._prune_empty_dirs(parent)
        return removed

    def _prune_empty_dirs(self, directory: Path) -> None:
        # Control directories (lease shards...) churn constantly and are few: keep them.
        if self._control in (directory, *directory.parents):
            return
        while directory != self.root and self.root in directory.parents:
            try:
                directory.rmdir()
            except OSError:
                return
            directory = directory.parent

    def move(self, src: str, dst: str) -> None:
        self.check_writable()
        target = self._abs(dst)
        self._makedirs(target.parent)
        try:
            os.replace(self._abs(src), target)
        except FileNotFoundError:
            raise EntryNotFound(f"{src} not found in {self.url}", store=self.url, path=src) from None
        self._prune_empty_dirs(self._abs(src).parent)

    @contextlib.contextmanager
    def staging_dir(self) -> Iterator[Path]:
        # Inside the root, so put_file(move=True) renames instead of copying.
        base = self.root / CONTROL_DIR / "staging"
        self._makedirs(base)
        tmp = base / f"{TEMP_MARKER.strip('.')}{secrets.token_hex(8)}"
        tmp.mkdir()
        try:
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
