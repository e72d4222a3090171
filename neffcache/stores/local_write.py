"""How a local store writes a file: a unique temp name in the target directory, then a rename.

A reader (or ``kill -9``) never sees a prefix of a file: the bytes go to ``.<name>.neffcache-tmp-…``
next to the target and are renamed into place. An exclusive write (publish: first writer wins)
links the temp file to its name with ``link(2)``, which fails if the name exists, instead of
taking a ``flock``: Lustre, GPFS and some NFS mounts fake flock and let every caller "succeed".

On a shared mount (several hosts write it) files are made group-writable (0o664) and flushed
before the rename; directories are setgid and group-writable (0o2775) so every member of the
training group can publish and prune, whatever its umask.

Every name is reached through a directory descriptor (:mod:`neffcache.stores.safepath`): the
temp file is created ``O_EXCL | O_NOFOLLOW``, and a rename or link acts on names, never through
a symlink.
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path

from neffcache.regular import open_regular
from neffcache.stores.base import PRIVATE_FILE_MODE, TEMP_MARKER, FileSource
from neffcache.stores.safepath import SafeRoot, copy_fd, unlink_quietly, write_all

SHARED_FILE_MODE = 0o664
SHARED_DIR_MODE = 0o2775


def temp_name(name: str) -> str:
    return f".{name}{TEMP_MARKER}{secrets.token_hex(6)}"


def open_source(safe: SafeRoot, source: Path) -> int:
    """Open a file to copy in; one below the root (a staging file) is reached by the walk."""
    rel = safe.under(source)
    if rel is None:
        return open_regular(source)
    return safe.open_file(rel)


def publish_temp(fd: int, tmp: str, name: str, *, exclusive: bool) -> bool:
    try:
        if exclusive:
            try:
                # follow_symlinks=False: link the temp file itself (it is one, O_NOFOLLOW made it).
                os.link(tmp, name, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
            except FileExistsError:
                return False
            finally:
                unlink_quietly(fd, tmp)
        else:
            # rename(2) replaces a name that is a symlink by the file; it never writes through it.
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        unlink_quietly(fd, tmp)  # Ctrl-C mid-way too: leave no temp file behind
        raise
    return True


def write_temp(safe: SafeRoot, fd: int, tmp: str, source: FileSource, *, move: bool, shared: bool,
               private: bool = False) -> None:
    """Write ``source`` to the new name ``tmp`` in the directory ``fd`` (renamed in, with
    ``move``, when it is on the same filesystem); nothing is left behind on failure.
    ``private`` (bytes only): created PRIVATE_FILE_MODE under the umask, not made shared."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        if isinstance(source, bytes):
            out = os.open(tmp, flags, PRIVATE_FILE_MODE if private else 0o644, dir_fd=fd)
            try:
                write_all(out, source)
                finish(out, shared=shared, private=private)
            finally:
                os.close(out)
            return
        if move and move_in(safe, fd, tmp, source):
            if shared:
                out = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                try:
                    finish(out, shared=shared)
                finally:
                    os.close(out)
            return
        src = open_source(safe, source)
        try:
            out = os.open(tmp, flags, 0o644, dir_fd=fd)
            try:
                copy_fd(src, out)
                finish(out, shared=shared)
            finally:
                os.close(out)
        finally:
            os.close(src)
    except BaseException:
        unlink_quietly(fd, tmp)  # Ctrl-C mid-copy: leave no temp file behind
        raise


def move_in(safe: SafeRoot, fd: int, tmp: str, source: Path) -> bool:
    """Rename ``source`` to ``tmp`` (False: another filesystem, copy instead)."""
    rel = safe.under(source)
    try:
        if rel is None:
            os.rename(source, tmp, dst_dir_fd=fd)
        else:
            with safe.parent(rel) as (sfd, sname):
                os.rename(sname, tmp, src_dir_fd=sfd, dst_dir_fd=fd)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        return False
    return True


def finish(fd: int, *, shared: bool, private: bool = False) -> None:
    if shared:
        if not private:
            os.fchmod(fd, SHARED_FILE_MODE)
        # A host that crashes (not just a killed process) after the rename must not leave
        # every other host a NEFF whose blocks never reached the servers: flush first.
        os.fsync(fd)
