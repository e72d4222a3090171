"""An on-disk spool of batches waiting for the index server.

Each batch is one JSON file, written to a temporary name and renamed into place (readers never
see half a batch; a crash leaves at most a ``.tmp-*`` file that is swept later). A sender *claims*
a batch by renaming it, so two processes sharing the spool rarely send the same batch; if they do,
or if a process dies after the server answered but before it deleted the file, the resend is
harmless because the server skips event ids it has and entry registration is an upsert. Claims
by renaming work on the network filesystems where flock does not (neffcache/stores/local.py
says why flock is never trusted).

A spool directory is a file system anyone with the user's rights (or a bug) can write, so a
batch is read with bounds: at most :data:`MAX_BATCH_BYTES` (a batch :meth:`Spool.put` writes
holds at most a client's ``batch_size`` reports, a few MB), JSON nested at most
:data:`MAX_NESTING` levels, a known kind and a list of objects, from a regular file (a FIFO
is refused, never waited on). A batch that fails any of these is moved to ``rejected/`` with
its reason, once: it is never resent, never read again, and can no longer end the command that
delivers the spool (a deeply nested one raised RecursionError through ``flush`` and through
every command that reports to the index, again each time its stale claim was given back).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neffcache.regular import open_regular

log = logging.getLogger(__name__)

KINDS = ("entries", "events")  # delivery order: entries first, so hits can find what they hit
_CLAIM = ".claimed-"
_TMP = ".tmp-"
URL_FILE = "index-url"  # the URL a spool directory (named by its digest) waits for, for `flush`
STALE_CLAIM_SECONDS = 600.0
MAX_BATCH_BYTES = 64 << 20
MAX_NESTING = 32  # an item is an object of scalars, lists and small objects: a few levels


@dataclass(frozen=True)
class Batch:
    path: Path
    kind: str
    items: list[dict[str, Any]]


class Spool:
    def __init__(self, directory: Path, *, max_bytes: int = 512 * 1024 * 1024, url: str | None = None) -> None:
        self.directory = Path(directory)
        self.rejected_dir = self.directory / "rejected"
        self.max_bytes = max_bytes
        self.url = url

    def recorded_url(self) -> str | None:
        """The index URL this spool waits for, as its first writer recorded it (None if unknown)."""
        try:
            return (self.directory / URL_FILE).read_text(encoding="utf-8").strip()[:2048] or None
        except (OSError, UnicodeDecodeError):
            return None

    def _record_url(self) -> None:
        # The directory is named by a digest of the URL: without this file, a spool left by a
        # command run with another --index-url could not say which index it waits for.
        if self.url is None or (self.directory / URL_FILE).exists():
            return
        tmp = self.directory / f"{_TMP}{URL_FILE}-{uuid.uuid4().hex[:8]}"
        tmp.write_text(self.url + "\n", encoding="utf-8")
        os.replace(tmp, self.directory / URL_FILE)

    def put(self, kind: str, items: list[dict[str, Any]]) -> Path:
        """Write one batch durably; returns its path. Raises OSError if the disk refuses."""
        if kind not in KINDS:
            raise ValueError(f"unknown spool kind {kind!r}")
        self.directory.mkdir(parents=True, exist_ok=True)
        self._record_url()
        # The item count in the name lets a command say how many reports wait without reading them.
        name = f"{time.time_ns():020d}-{os.getpid()}-{uuid.uuid4().hex[:8]}-n{len(items)}.{kind}.json"
        tmp = self.directory / f"{_TMP}{name}"
        data = json.dumps({"kind": kind, "items": items}, separators=(",", ":")).encode()
        try:
            with open(tmp, "wb") as fh:
                written = fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            if written != len(data):  # buffered writes raise on a short write; say so if one did not
                raise OSError(errno.ENOSPC, f"short write: {written} of {len(data)} bytes", str(tmp))
            final = self.directory / name
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()  # a partial batch is no batch: never leave it to be swept later
            raise
        _fsync_dir(self.directory)
        self._enforce_cap()
        return final

    def pending(self) -> list[Path]:
        """Unclaimed batches, entries before events, oldest first within a kind."""
        if not self.directory.is_dir():
            return []
        files = [p for p in self.directory.iterdir() if p.is_file() and p.name.endswith(".json")
                 and not p.name.startswith(_TMP)]
        return sorted(files, key=lambda p: (KINDS.index(_kind_of(p)) if _kind_of(p) in KINDS else 9, p.name))

    def pending_reports(self) -> tuple[int, int]:
        """(batches, reports) waiting. Reports are counted from the names; a batch of an older
        release (no count in its name) is read, up to a bound, else counted as one."""
        batches = self.pending()
        reports = 0
        for path in batches:
            count = _count_of(path)
            if count is None:
                count = 1
                with contextlib.suppress(OSError, ValueError):
                    if path.stat().st_size <= 16 << 20:
                        count = len(load_batch(path)[1])
            reports += count
        return len(batches), reports

    def claim(self, path: Path) -> Path | None:
        """Take a batch for sending; None if another process took it first."""
        claimed = path.with_name(f"{path.name}{_CLAIM}{os.getpid()}-{uuid.uuid4().hex[:6]}")
        try:
            os.rename(path, claimed)
        except FileNotFoundError:
            return None
        with contextlib.suppress(OSError):
            os.utime(claimed)  # the claim's age, for stale-claim recovery
        return claimed

    def read(self, claimed: Path) -> Batch | None:
        """The claimed batch; None when it cannot be read (then it is in ``rejected/``, reported
        once here, with its reason beside it)."""
        try:
            kind, items = load_batch(claimed)
        except (OSError, ValueError) as exc:
            log.warning("unreadable spool file %s (%s); moved to %s", claimed.name, exc, self.rejected_dir)
            with contextlib.suppress(OSError):
                self.reject(claimed, f"unreadable: {exc}")
            return None
        return Batch(claimed, kind, items)

    def done(self, claimed: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            claimed.unlink()

    def unclaim(self, claimed: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.rename(claimed, claimed.with_name(claimed.name.split(_CLAIM, 1)[0]))

    def reject(self, claimed: Path, reason: str, items: list[dict[str, Any]] | None = None) -> None:
        """Keep a batch the server refused (4xx) for a human to look at; never resend it."""
        self.rejected_dir.mkdir(parents=True, exist_ok=True)
        base = claimed.name.split(_CLAIM, 1)[0]
        target = self.rejected_dir / base
        if items is None:
            with contextlib.suppress(FileNotFoundError):
                os.replace(claimed, target)
        else:
            target.write_text(json.dumps({"kind": _kind_of(claimed), "items": items}))
        (self.rejected_dir / f"{base}.reason.txt").write_text(reason + "\n")

    def recover_stale(self, older_than: float = STALE_CLAIM_SECONDS) -> int:
        """Give back claims whose sender died, and sweep abandoned temp files."""
        if not self.directory.is_dir():
            return 0
        now, recovered = time.time(), 0
        for path in self.directory.iterdir():
            try:
                age = now - path.stat().st_mtime
            except FileNotFoundError:
                continue
            if _CLAIM in path.name and age > older_than:
                self.unclaim(path)
                recovered += 1
            elif path.name.startswith(_TMP) and age > older_than:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        return recovered

    def size(self) -> tuple[int, int]:
        """(files, bytes) waiting, claimed ones included."""
        files = list(self._all())
        return len(files), sum(_size(p) for p in files)

    def _all(self) -> Iterator[Path]:
        if self.directory.is_dir():
            yield from (p for p in self.directory.iterdir()
                        if p.is_file() and not p.name.startswith(_TMP) and p.name != URL_FILE)

    def _enforce_cap(self) -> None:
        files = sorted(self._all(), key=lambda p: p.name)
        total = sum(_size(p) for p in files)
        while total > self.max_bytes and len(files) > 1:
            victim = files.pop(0)
            total -= _size(victim)
            log.warning("index spool over %d bytes: dropping the oldest batch %s", self.max_bytes, victim.name)
            with contextlib.suppress(FileNotFoundError):
                victim.unlink()


def load_batch(path: Path) -> tuple[str, list[dict[str, Any]]]:
    """(kind, items) of a batch file, read within the module docstring's bounds; ValueError
    (or OSError) saying which one it breaks."""
    with open(open_regular(path), "rb") as fh:
        raw = fh.read(MAX_BATCH_BYTES + 1)
    if len(raw) > MAX_BATCH_BYTES:
        raise ValueError(f"larger than {MAX_BATCH_BYTES} bytes")
    if _nesting(raw) > MAX_NESTING:
        raise ValueError(f"JSON nested more than {MAX_NESTING} levels")
    try:
        data = json.loads(raw)
    except RecursionError:  # unreachable after the nesting check; kept as the last line of defence
        raise ValueError("JSON nested too deeply") from None
    if not isinstance(data, dict) or data.get("kind") not in KINDS or not isinstance(data.get("items"), list):
        raise ValueError("not a spool batch (an object with a known kind and a list of items)")
    items = data["items"]
    if not all(isinstance(item, dict) for item in items):
        raise ValueError("an item that is not an object")
    return str(data["kind"]), items


def _nesting(raw: bytes) -> int:
    """The deepest nesting of ``[``/``{`` in JSON text, brackets inside strings not counted:
    linear, and no recursion (json.loads recurses once per level)."""
    # Strings out first: what is left is punctuation, numbers and literals.
    brackets = _STRINGS.sub(b'""', raw).translate(None, _NOT_BRACKETS)
    # +1 for an opening bracket, -1 for a closing one: the running sum is the depth (C loops only).
    return max(itertools.accumulate(map(_SIGN.__getitem__, brackets)), default=0)


_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_SIGN = [1 if b in b"[{" else -1 for b in range(256)]


def _kind_of(path: Path) -> str:
    parts = path.name.split(_CLAIM, 1)[0].split(".")
    return parts[-2] if len(parts) >= 3 else ""


def _count_of(path: Path) -> int | None:
    stem = path.name.split(_CLAIM, 1)[0].split(".", 1)[0]
    tail = stem.rsplit("-", 1)[-1]
    return int(tail[1:]) if tail.startswith("n") and tail[1:].isdigit() else None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _fsync_dir(directory: Path) -> None:
    # The rename is durable only once the directory entry is; best effort where O_DIRECTORY is unsupported.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
