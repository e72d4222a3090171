"""Linux inotify, through ctypes: wake a write-back as soon as a local tier may have changed.

A hint, never the truth: the watcher (neffcache/replication/watch.py) lists the tier after a
wake-up and also every interval without one, so a lost event (the kernel's queue overflowed, a
directory created between its parent's event and our watch on it, more directories than the
watch budget) costs one interval, nothing more. Watches follow new directories as they appear;
symlinks are never followed (IN_DONT_FOLLOW, and ``os.scandir`` without following). Anything
that fails (no libc, no inotify, out of watches) makes :func:`open_watch` return None: polling.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import select
import struct
from pathlib import Path

log = logging.getLogger(__name__)
IN_MODIFY_CLOSE = 0x00000008  # IN_CLOSE_WRITE
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_ISDIR = 0x40000000
IN_Q_OVERFLOW = 0x00004000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_MASK = IN_MODIFY_CLOSE | IN_MOVED_TO | IN_CREATE | IN_DONT_FOLLOW
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len
MAX_WATCHES = 4096  # well under the default per-user limit (8192), other tools need theirs


class DirectoryWatch:
    """Watches ``root`` and its directories; :meth:`wait` says whether anything was created,
    moved in or written since the last call."""

    def __init__(self, libc: ctypes.CDLL, fd: int, root: Path) -> None:
        self._libc, self._fd = libc, fd
        self._dirs: dict[int, Path] = {}  # watch descriptor -> directory
        self._add_tree(root)

    def _add(self, directory: Path) -> None:
        if len(self._dirs) >= MAX_WATCHES:
            return
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(directory), _MASK | IN_ONLYDIR)
        if wd >= 0:
            self._dirs[wd] = directory

    def _add_tree(self, top: Path) -> None:
        stack = [top]
        while stack and len(self._dirs) < MAX_WATCHES:
            directory = stack.pop()
            self._add(directory)
            try:
                with os.scandir(directory) as it:
                    stack.extend(Path(e.path) for e in it if e.is_dir(follow_symlinks=False))
            except OSError:
                continue

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True when an event came (new directories are watched)."""
        ready, _, _ = select.select([self._fd], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return False
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _, length = _EVENT.unpack_from(data, offset)
            name = data[offset + _EVENT.size:offset + _EVENT.size + length].rstrip(b"\0")
            offset += _EVENT.size + length
            if mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO) and wd in self._dirs:
                self._add_tree(self._dirs[wd] / os.fsdecode(name))
        return True

    def close(self) -> None:
        os.close(self._fd)


def open_watch(root: Path | None) -> DirectoryWatch | None:
    """A watch on ``root`` (a local directory: a store's ``watchable_root``), or None where
    inotify is not to be had or there is nothing to watch (``root`` None: polling)."""
    if root is None:
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    except (OSError, AttributeError) as exc:
        log.debug("no inotify (%s): polling", exc)
        return None
    if fd < 0:
        log.debug("inotify_init1 failed (errno %d): polling", ctypes.get_errno())
        return None
    try:
        return DirectoryWatch(libc, fd, root)
    except OSError as exc:
        os.close(fd)
        log.debug("inotify on %s failed (%s): polling", root, exc)
        return None
