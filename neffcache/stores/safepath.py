"""Paths below a store root, resolved without following a symlink in any component.

A shared cache root is writable by a whole training group, so any member can replace a
directory below it with a symlink to somewhere else (``.neffcache -> /home/alice``). A path
joined with pathlib and handed to ``open``/``unlink`` follows such a link, and a prune or a
pull then deletes or writes outside the store. Checking the components first (``lstat`` each)
leaves a window between the check and the use; this module closes it the ``openat`` way:

- the root is opened as given (the operator chose it, symlinks in it are theirs);
- every directory below it is opened relative to its parent's descriptor with
  ``O_DIRECTORY | O_NOFOLLOW``, so a component that is a symlink fails instead of being
  followed, whatever happens to the names meanwhile;
- the final operation (open, mkdir, link, rename, unlink, rmdir, stat) runs relative to the
  parent's descriptor, with ``O_NOFOLLOW`` / ``follow_symlinks=False`` on the last name;
- a file is opened ``O_NONBLOCK`` and its type checked on the descriptor: a FIFO, socket or
  device planted where a file belongs is an UnsafePath for that path, never a hang.

Symlinks to files inside the root are followed for reads only, by resolving the link text
*lexically* against the link's directory and walking the result again from the root (so the
target is held to the same rules). The Hugging Face hub's layout (``snapshots/<rev>/model.neff
-> ../../blobs/<sha>``), which optimum-neuron's Hub proxy reproduces, is made of exactly such
links, and a cache manager that called those entries corrupt would throw away good NEFFs.
Writes and deletes never go through a link: a rename or unlink of a name that is a symlink
acts on the link itself. A link that points outside the root, a dangling one and a link to a
directory are never followed: the operation raises :class:`UnsafePath` for that path only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import resource
import stat
from collections.abc import Iterator

from neffcache.errors import UnsafePath
from neffcache.regular import open_regular

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_LINK_HOPS = 8  # a chain of in-root links longer than this is refused (and a loop ends)


def copy_fd(src: int, dst: int) -> int:
    """Copy from ``src``'s position to its end into ``dst``; returns the bytes copied.

    ``copy_file_range`` lets the kernel copy (or reflink) without the bytes crossing into
    Python; ``sendfile`` is the older kernel path; a read/write loop is the last resort. Every
    write's count is checked: a short write is retried, never silently dropped.
    """
    total = 0
    for fast in (_copy_file_range, _sendfile):
        try:
            while (n := fast(src, dst)) > 0:
                total += n
            return total
        except OSError as exc:
            # Not supported here (other filesystem, old kernel): fall back, unless bytes moved.
            if total or exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP,
                                          errno.ENOTSUP, errno.EBADF):
                raise
    while chunk := os.read(src, 1 << 20):
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst, view):]
        total += len(chunk)
    return total


def _copy_file_range(src: int, dst: int) -> int:
    return os.copy_file_range(src, dst, 1 << 30)


def _sendfile(src: int, dst: int) -> int:
    return os.sendfile(dst, src, None, 1 << 30)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class SafeRoot:
    """Opens directories and files below ``root`` the openat way (see the module docstring)."""

    def __init__(self, root: str, store: str, *, dir_mode: int | None = None) -> None:
        self.root = root.rstrip("/") or "/"
        self.store = store
        self.dir_mode = dir_mode  # shared mounts: set explicitly, mkdir's mode is filtered by the umask

    def unsafe(self, path: str, reason: str) -> UnsafePath:
        return UnsafePath(path, reason, store=self.store)

    def open_root(self) -> int:
        return os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def open_dir(self, rel: str, *, create: bool = False, base: tuple[int, str] | None = None) -> int:
        """A descriptor of the directory ``rel`` ("" for the root); the caller closes it.

        ``base`` is (descriptor, its path) of an ancestor already opened the same way, to start
        the walk there. Raises FileNotFoundError / NotADirectoryError when it is not there (and
        ``create`` is false), UnsafePath when a component is a symlink.
        """
        if base is not None and (rel == base[1] or rel.startswith(base[1] + "/") or not base[1]):
            done = base[1]
            rest = rel[len(done):].lstrip("/") if done else rel
            if rest and "/" not in rest:  # one step down (BatchDirs' every open): no dup to close again
                return self._step(base[0], rest, rel, create)
            fd = os.dup(base[0])
        else:
            fd = self.open_root()
            done, rest = "", rel
        try:
            for part in rest.split("/") if rest else ():
                done = f"{done}/{part}" if done else part
                nfd = self._step(fd, part, done, create)
                os.close(fd)
                fd = nfd
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _step(self, fd: int, part: str, path: str, create: bool) -> int:
        for _ in range(3):
            try:
                return os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and self.is_link(fd, part):
                    raise self.unsafe(path, "a symlinked directory (not followed)") from None
                raise
            try:
                os.mkdir(part, 0o777, dir_fd=fd)
            except FileExistsError:
                continue  # made by someone else meanwhile (or a symlink: the open above says)
            nfd = os.open(part, DIR_FLAGS, dir_fd=fd)
            if self.dir_mode is not None:
                os.fchmod(nfd, self.dir_mode)
            return nfd
        # Made and removed again three times over (a concurrent prune of empty directories).
        raise FileNotFoundError(errno.ENOENT, "directory keeps disappearing", path)

    @staticmethod
    def is_link(fd: int, name: str) -> bool:
        try:
            return stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
        except OSError:
            return False

    @contextlib.contextmanager
    def parent(self, rel: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
        """(descriptor of ``rel``'s directory, ``rel``'s last name)."""
        head, _, name = rel.rpartition("/")
        fd = self.open_dir(head, create=create)
        try:
            yield fd, name
        finally:
            os.close(fd)

    def link_target(self, fd: int, head: str, name: str) -> str:
        """The store-relative path the symlink ``head/name`` names, when it stays in the root.

        Resolved lexically (``a/b/../c`` is ``a/c``): the result is then walked from the root
        with no link followed, so a link cannot borrow another link's way out.
        """
        path = f"{head}/{name}" if head else name
        text = os.readlink(name, dir_fd=fd)
        if text.startswith("/"):
            full = posixpath.normpath(text)
            prefix = self.root.rstrip("/") + "/"
            if not full.startswith(prefix):
                raise self.unsafe(path, f"a symlink pointing outside the root (to {text})")
            target = full[len(prefix):]
        else:
            target = posixpath.normpath(posixpath.join(head, text))
            if target == ".." or target.startswith("../") or target == ".":
                raise self.unsafe(path, f"a symlink pointing outside the root (to {text})")
        if not target or target == ".":
            raise self.unsafe(path, "a symlink to the root")
        return target

    def open_file(self, rel: str, flags: int = READ_FLAGS) -> int:
        """A descriptor of the regular file ``rel`` for reading, through in-root file links only.

        A FIFO, socket or device raises UnsafePath instead of blocking: the open is
        ``O_NONBLOCK`` and the type is checked on the descriptor (neffcache/regular.py)."""
        path = rel
        for _ in range(MAX_LINK_HOPS):
            head, _, name = path.rpartition("/")
            fd = self.open_dir(head)
            try:
                try:
                    return open_regular(name, flags, dir_fd=fd, store=self.store, shown=rel)
                except OSError as exc:
                    if exc.errno != errno.ELOOP or not self.is_link(fd, name):
                        raise
                path = self._hop(fd, head, name, rel)
            finally:
                os.close(fd)
        raise self.unsafe(rel, f"more than {MAX_LINK_HOPS} symlinks in a row")

    def stat(self, rel: str) -> tuple[str, os.stat_result]:
        """(the path of the file itself, its stat) after following in-root file links."""
        path = rel
        for _ in range(MAX_LINK_HOPS):
            head, _, name = path.rpartition("/")
            fd = self.open_dir(head)
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISLNK(st.st_mode):
                    return path, st
                path = self._hop(fd, head, name, rel)
            finally:
                os.close(fd)
        raise self.unsafe(rel, f"more than {MAX_LINK_HOPS} symlinks in a row")

    def _hop(self, fd: int, head: str, name: str, origin: str) -> str:
        """The next path of a link chain (one step: the loops above bound the chain); refuses
        links out of the root, links to directories and dangling links."""
        target = self.link_target(fd, head, name)
        thead, _, tname = target.rpartition("/")
        try:
            tfd = self.open_dir(thead)
        except (FileNotFoundError, NotADirectoryError):
            raise self.unsafe(origin, "a dangling symlink") from None
        except UnsafePath as exc:
            raise self.unsafe(origin, f"a symlink to {target}, through {exc.reason}") from None
        try:
            st = os.stat(tname, dir_fd=tfd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            raise self.unsafe(origin, "a dangling symlink") from None
        finally:
            os.close(tfd)
        if stat.S_ISDIR(st.st_mode):
            raise self.unsafe(origin, "a symlink to a directory (not followed)")
        return target

    def resolve_listed_link(self, fd: int, head: str, name: str) -> os.stat_result:
        """The stat of the file an in-root link found by a listing names; UnsafePath with the
        reason otherwise."""
        path = f"{head}/{name}" if head else name
        return self.stat(self._hop(fd, head, name, path))[1]

    def under(self, path: str | os.PathLike[str]) -> str | None:
        """``path`` relative to the root when it lies below it (staging files), else None."""
        full = os.path.abspath(path)
        prefix = self.root.rstrip("/") + "/"
        return full[len(prefix):] if full.startswith(prefix) and len(full) > len(prefix) else None


class MissingDir(FileNotFoundError):
    """:meth:`BatchDirs.open` found no directory ``rel`` in its parent (which it opened): the
    topmost missing one of the path asked for, which a caller may remember for its batch."""

    def __init__(self, rel: str) -> None:
        super().__init__(errno.ENOENT, "no such directory", rel)
        self.rel = rel


class BatchDirs:
    """Directory descriptors of one batch operation: each ancestor is walked to once (a prune
    of 100k entries opens each namespace directory once, not once per file).

    A descriptor it returns is valid until the next :meth:`open`: beyond :attr:`LIMIT` the
    least recently used is closed (so a caller uses one before asking for another)."""

    # Descriptors held at most: a prune chunk's 256 entry directories and their parents (512 for
    # layout B's two shard directories an entry), four chunks at a time, within the process's limit.
    LIMIT = max(32, min(1024, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 16))

    def __init__(self, safe: SafeRoot) -> None:
        self.safe = safe
        self.fds: dict[str, int] = {}

    def __enter__(self) -> BatchDirs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self, rel: str) -> int:
        """The directory's descriptor, owned by the cache (do not close it)."""
        fd = self.fds.pop(rel, None)
        if fd is not None:
            self.fds[rel] = fd  # most recently used last: eviction takes the least recently used
            return fd
        if rel:
            head = rel.rpartition("/")[0]
            base = self.open(head)
            try:
                fd = self.safe.open_dir(rel, base=(base, head))
            except FileNotFoundError as exc:
                raise MissingDir(rel) from exc  # this one: its parent is there
        else:
            fd = self.safe.open_root()
        if len(self.fds) >= self.LIMIT:
            os.close(self.fds.pop(next(iter(self.fds))))  # the least recently used
        self.fds[rel] = fd
        return fd

    def forget(self, rel: str) -> None:
        fd = self.fds.pop(rel, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        fds, self.fds = self.fds, {}
        for fd in fds.values():
            os.close(fd)


def lexists(fd: int, name: str) -> bool:
    """Whether ``name`` exists in the directory ``fd`` (a symlink counts, never followed)."""
    try:
        os.stat(name, dir_fd=fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def unlink_quietly(fd: int, name: str) -> None:
    """Unlink ``name`` in the directory ``fd`` if it is still there (a temp file being cleaned up)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=fd)
