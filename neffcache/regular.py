"""Opening a file that must be a regular file, without ever blocking on what else it may be.

Anyone who can write a store (a co-tenant on a shared mount) can put a FIFO, a socket or a
device node where a lease, a manifest or a NEFF is expected. ``open(2)`` of a FIFO for reading
waits for a writer, for ever; reading a character device may never end. So every open of a
path that came from a store goes through :func:`open_regular`: it opens with ``O_NONBLOCK``
(a FIFO then opens at once, a device does not wait for a carrier), checks the type on the
*descriptor* with ``fstat`` (no window between a check and the use: whatever the name points
to meanwhile, the checked descriptor is the one read), and only then clears ``O_NONBLOCK``.
Anything but a regular file raises :class:`~neffcache.errors.UnsafePath` for that path only, a
per-item problem the caller reports and goes past.
"""

from __future__ import annotations

import os
import stat

from neffcache.errors import UnsafePath

READ = os.O_RDONLY | os.O_CLOEXEC


def kind(mode: int) -> str:
    """What a non-regular file is, for a message: "a FIFO", "a socket", "a directory"..."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return f"a special file (mode {mode:o})"


def not_regular(path: str, mode: int, store: str | None = None) -> UnsafePath:
    return UnsafePath(path, f"{kind(mode)}, not a regular file (not opened)", store=store)


def checked(fd: int, path: str, store: str | None = None) -> int:
    """``fd`` itself when it is a regular file (``O_NONBLOCK`` cleared); else it is closed and
    :class:`UnsafePath` raised."""
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise not_regular(path, mode, store)
        os.set_blocking(fd, True)  # regular files ignore it; later readers get plain semantics
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path: str | os.PathLike[str], flags: int = READ, mode: int = 0o644, *, dir_fd: int | None = None,
                 store: str | None = None, shown: str | None = None) -> int:
    """A descriptor of the regular file ``path`` (``flags`` as for ``os.open``); never blocks on
    a FIFO or device, raises UnsafePath for one (``shown``: the path to name in the message)."""
    fd = os.open(path, flags | os.O_NONBLOCK, mode, dir_fd=dir_fd)
    return checked(fd, shown if shown is not None else os.fsdecode(path), store)
