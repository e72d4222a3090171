"""File primitives the simulated runtime and compiler share.

They mirror what the real runtimes do (temp file + rename, O_EXCL lock files, O_APPEND logs)
and are written independently of neffcache's own stores on purpose: the simulation must not
borrow the code it is used to test. Import-light, since the compiler stand-in loads it on
every invocation.
"""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to a unique temp name beside ``path``, then rename it into place.

    A reader sees either no file or the whole file, even if we are killed mid-write.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def create_exclusive(path: Path, data: bytes = b"") -> bool:
    """Create ``path`` only if it does not exist (O_CREAT|O_EXCL); False if it already did."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        if data:
            os.write(fd, data)
    finally:
        os.close(fd)
    return True


def append_line(path: Path, line: str) -> None:
    """Append one line with a single O_APPEND write, so concurrent writers never interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line.rstrip("\n") + "\n").encode())
    finally:
        os.close(fd)
