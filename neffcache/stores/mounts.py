"""Which filesystem a cache root is on, so a network mount is never treated as a local disk.

A root on NFS, Lustre or another network filesystem that several hosts write needs the shared
rules (fsynced leases, per-entry publish leases, lookups that a stale negative cache cannot
fool). Users pass ``fsx://`` for that; a plain path that turns out to be on such a mount is
switched to shared mode too, because forgetting the scheme must not cost correctness.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

MOUNTINFO = Path("/proc/self/mountinfo")
# Filesystems whose files other hosts may write at the same time.
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "lustre", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "gpfs", "beegfs", "9p",
    "afs", "orangefs", "pvfs2", "ocfs2", "gfs2", "wekafs",
})
NETWORK_FUSE_PREFIXES = ("fuse.ceph", "fuse.glusterfs", "fuse.sshfs", "fuse.s3fs", "fuse.mountpoint-s3",
                         "fuse.gcsfuse", "fuse.juicefs", "fuse.rclone", "fuse.goofys", "fuse.weka")
# Filesystems held in memory: a call on them never waits for a device or a server.
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})
_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in paths as \040, \011, \012, \134.
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[tuple[str, str]]:
    """(mount point, filesystem type) for each line of a /proc/<pid>/mountinfo."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        try:
            separator = fields.index("-")
            mounts.append((_unescape(fields[4]), fields[separator + 1]))
        except (ValueError, IndexError):
            continue  # a line this parser does not understand says nothing about our root
    return mounts


def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return Path(os.path.realpath(path))


def filesystem_type(path: str | os.PathLike[str], mountinfo: Path | None = None) -> str | None:
    """The type of the filesystem ``path`` is (or would be created) on; None when unknown."""
    try:
        mounts = parse_mountinfo((mountinfo or MOUNTINFO).read_text())
    except OSError:
        return None  # not Linux, or /proc not mounted: no evidence either way
    target = str(_existing_ancestor(Path(path)))
    best: tuple[int, str] | None = None
    for point, fstype in mounts:
        contains = point in (target, "/") or target.startswith(point.rstrip("/") + "/")
        # The last mount of the longest matching point is the one in effect (over-mounts).
        if contains and (best is None or len(point) >= best[0]):
            best = (len(point), fstype)
    return best[1] if best else None


def is_network_filesystem(fstype: str | None) -> bool:
    return fstype is not None and (fstype in NETWORK_FILESYSTEMS or fstype.startswith(NETWORK_FUSE_PREFIXES))


def is_memory_filesystem(fstype: str | None) -> bool:
    return fstype in MEMORY_FILESYSTEMS


def on_network_filesystem(path: str | os.PathLike[str], mountinfo: Path | None = None) -> str | None:
    """The network filesystem type ``path`` is on, or None for a local disk (or when unknown)."""
    fstype = filesystem_type(path, mountinfo)
    return fstype if is_network_filesystem(fstype) else None
