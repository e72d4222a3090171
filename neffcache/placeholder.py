"""Placeholder NEFFs: what ``neffcache plan``'s recording compiler writes instead of compiling.

``plan`` learns which graphs a job will look up by running it once against a private scratch
cache with a stand-in ``neuronx-cc`` first on PATH (:mod:`neffcache.warmers.recorder`). That
stand-in records each compile it is asked for and, so the runtime moves on at once, writes a
placeholder where the NEFF goes. The runtime then stores it in the scratch cache like any NEFF.

A placeholder is no compiled graph: a device cannot load it, and a store that served it would
turn a cache miss into a crash on a Trainium host. So it carries a magic header no compiler
output starts with, and every place that commits an entry to a store (publish, hence push,
pull, tier promotion; the manifest built on ingest) refuses one whose NEFF begins with it
(:func:`placeholders_among`, raising :class:`~neffcache.errors.PlaceholderNeff`). The header
is followed by one JSON line naming the HLO it stands for (``plan`` matches scratch entries
to recorded compiles by it) and saying what it is, for whoever opens the file.

A value module: no imports from neffcache, so the recording compiler stays import-light.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

MAGIC = b"NEFFCACHE-PLACEHOLDER-NEFF/1\n"
FORMAT = "neffcache-placeholder-1"
NOTE = ("written by neffcache plan's recording compiler instead of compiling: not a NEFF, never to be "
        "served, published or copied into a store")
_MAX_HEADER = 4096


def placeholder_bytes(hlo_sha256: str, hlo_size: int) -> bytes:
    """The placeholder standing for the HLO with this digest and size."""
    header = {"format": FORMAT, "hlo_sha256": hlo_sha256, "hlo_size": hlo_size, "note": NOTE}
    return MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n"


def is_placeholder(data: bytes) -> bool:
    """True when ``data`` (a NEFF's bytes, or at least its first ``len(MAGIC)``) is a placeholder."""
    return data.startswith(MAGIC)


def read_placeholder(data: bytes) -> dict[str, Any] | None:
    """The header of a placeholder (``hlo_sha256``, ``hlo_size``), or None when ``data`` is not one
    or its header is not the JSON object a recorder writes (the bytes are untrusted)."""
    if not is_placeholder(data):
        return None
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + _MAX_HEADER)
    if end < 0:
        return None
    try:
        header = json.loads(data[len(MAGIC):end])
    except (ValueError, UnicodeDecodeError):
        return None
    return header if isinstance(header, dict) and header.get("format") == FORMAT else None


def file_is_placeholder(path: str | os.PathLike[str]) -> bool:
    """True when the file at ``path`` starts with the placeholder header (reads only that much).
    False when it cannot be read: the write that follows reports that, as it always did."""
    try:
        # O_NONBLOCK and a regular file only: a FIFO planted where a NEFF belongs is not waited
        # on (neffcache/regular.py has the general form; errors.py imports this module).
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return False
            return is_placeholder(fh.read(len(MAGIC)))
    except OSError:
        return False


def source_is_placeholder(source: bytes | os.PathLike[str] | str) -> bool:
    """A publisher's source (bytes in memory or a local file) is a placeholder."""
    if isinstance(source, bytes):
        return is_placeholder(source)
    return file_is_placeholder(Path(source))


def placeholders_among(files: Mapping[str, bytes | os.PathLike[str]], names: Iterable[str | None] | None = None
                       ) -> list[str]:
    """The names (of ``names``, default all of ``files``) whose source is a placeholder."""
    wanted = files.keys() if names is None else dict.fromkeys(n for n in names if n is not None and n in files)
    return sorted(name for name in wanted if source_is_placeholder(files[name]))


def refusal(name: str) -> str:
    """The one-line reason an entry holding placeholder ``name`` is refused (every refusal says it)."""
    return (f"{name} is a placeholder written by `neffcache plan` (no compiled graph): refused, nothing "
            "was committed")
