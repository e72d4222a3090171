"""The per-entry manifest, ``neffcache.json``: what an entry holds and how it was made.

sha256 and size of every file make the store content-verified end to end: an entry is
checked against its manifest on ingest and on every pull from a remote tier.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from neffcache.errors import CorruptEntry, InvalidKey
from neffcache.keys import safe_relpath
from neffcache.provenance import Provenance
from neffcache.regular import open_regular
from neffcache.signature import Signature
from neffcache.toolchain import Toolchain

MANIFEST_NAME = "neffcache.json"
SCHEMA_VERSION = 1
# Additive revisions of schema 1, which readers of older releases accept (they ignore unknown
# fields; a schema bump would make them call every new entry corrupt during a rolling upgrade).
# Minor 1: the manifest covers the commit marker too (model.done), see Layout.manifest_problems.
# Minor 2: it covers every file the runtime keeps in the entry (NxD's wrapped_neff.hlo), and may
# carry its provenance and a signature (neffcache/provenance.py, neffcache/signing.py).
SCHEMA_MINOR = 2
_CHUNK = 1 << 20

# Limits on a manifest from outside. Ours are a few hundred bytes, three levels deep, with a
# handful of files: these are orders of magnitude above any real one and far below harm.
MAX_MANIFEST_BYTES = 1 << 20
MAX_MANIFEST_DEPTH = 8
MAX_FILES = 1024
MAX_FILE_SIZE = 1 << 44  # 16 TiB: no NEFF comes near; 1e400 or 2**70 do not pass
MAX_TEXT = 1024  # layout, key, producer, tag keys and values, toolchain fields
MAX_FLAGS = 1024
MAX_FLAG_LEN = 8192
MAX_TAGS = 256
MAX_SECONDS = 1e7  # compile seconds: ~4 months
MAX_TIME = 32503680000.0  # created: before the year 3000
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
# A string (its closing quote optional, so an unterminated one costs one pass, not one per
# quote: no quadratic backtracking on hostile input) or a bracket.
_TOKEN_RE = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]')


@dataclass(frozen=True)
class FileDigest:
    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest:
    """The record of one published entry. ``files`` maps names relative to the entry."""

    layout: str
    key: str
    files: Mapping[str, FileDigest]
    toolchain: Toolchain | None
    flags: tuple[str, ...] = ()
    created: float = field(default_factory=time.time)
    producer: str = field(default_factory=socket.gethostname)
    compile_seconds: float | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    computed: bool = False  # True when made on ingest of an entry the runtime wrote
    schema: int = SCHEMA_VERSION
    minor: int = SCHEMA_MINOR
    provenance: Provenance | None = None  # who made it, how, from what, where, when
    signature: Signature | None = None  # over all of the above and the entry's path (signing.py)
    # Made by this process, not read from a store: publish signs it (neffcache/operations/publisher.py).
    # Never written: a manifest read back is carried, whoever made it.
    minted: bool = field(default=False, compare=False, repr=False)

    @property
    def size(self) -> int:
        return sum(d.size for d in self.files.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "minor": self.minor,
            "layout": self.layout,
            "key": self.key,
            "toolchain": self.toolchain.to_json() if self.toolchain else None,
            "flags": list(self.flags),
            "files": {n: {"sha256": d.sha256, "size": d.size} for n, d in sorted(self.files.items())},
            "created": self.created,
            "producer": self.producer,
            "compile_seconds": self.compile_seconds,
            "tags": dict(sorted(self.tags.items())),
            "computed": self.computed,
            **({"provenance": self.provenance.to_json()} if self.provenance is not None else {}),
            **({"signature": self.signature.to_json()} if self.signature is not None else {}),
        }

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_bytes(cls, raw: bytes, *, where: str = "<manifest>") -> Manifest:
        """Parse a manifest from outside: bounded size and nesting, finite numbers, typed fields.

        Anything else is :class:`CorruptEntry` naming the reason, never another exception: a
        manifest is untrusted input (any host that can write the store can write one).
        """
        if len(raw) > MAX_MANIFEST_BYTES:
            raise CorruptEntry(where, [f"manifest is {len(raw)} bytes, above the {MAX_MANIFEST_BYTES} byte limit"])
        depth = json_depth(raw)
        if depth > MAX_MANIFEST_DEPTH:
            raise CorruptEntry(where, [f"manifest nests deeper than {MAX_MANIFEST_DEPTH} levels"])
        try:
            data = json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
            raise CorruptEntry(where, [f"manifest is not JSON: {exc}"]) from None
        return cls.from_json(data, where=where)

    @classmethod
    def from_json(cls, data: Any, *, where: str = "<manifest>") -> Manifest:
        try:
            return cls._from_json(data)
        except _Bad as exc:
            raise CorruptEntry(where, [f"manifest is malformed: {exc}"]) from None

    @classmethod
    def _from_json(cls, data: Any) -> Manifest:
        if not isinstance(data, dict):
            raise _Bad("not a JSON object")
        schema = _int(data.get("schema"))
        if schema is None or not 1 <= schema <= SCHEMA_VERSION:
            raise _Bad(f"unsupported schema {_show(data.get('schema'))}")
        minor = _int(data.get("minor", 0))
        if minor is None or minor < 0:
            raise _Bad(f"'minor' must be a non-negative integer, not {_show(data.get('minor'))}")
        files = _files_from_json(data.get("files"))
        toolchain = _toolchain_from_json(data.get("toolchain"))
        flags = data.get("flags", [])
        if not isinstance(flags, list) or len(flags) > MAX_FLAGS or not all(
                isinstance(f, str) and len(f) <= MAX_FLAG_LEN for f in flags):
            raise _Bad(f"'flags' must be a list of at most {MAX_FLAGS} strings of at most {MAX_FLAG_LEN} characters")
        tags = data.get("tags") or {}
        if not isinstance(tags, dict) or len(tags) > MAX_TAGS or not all(
                isinstance(v, str) and len(k) <= MAX_TEXT and len(v) <= MAX_TEXT for k, v in tags.items()):
            raise _Bad(f"'tags' must be an object of at most {MAX_TAGS} strings of at most {MAX_TEXT} characters")
        raw_seconds = data.get("compile_seconds")
        compile_seconds = _number(raw_seconds)
        if raw_seconds is not None and (compile_seconds is None or not 0 <= compile_seconds <= MAX_SECONDS):
            raise _Bad(f"'compile_seconds' must be a number in 0..{MAX_SECONDS:.0f}, not {_show(raw_seconds)}")
        created = _number(data.get("created", 0.0))
        if created is None or not 0 <= created <= MAX_TIME:
            raise _Bad(f"'created' must be a time in 0..{MAX_TIME:.0f}, not {_show(data.get('created'))}")
        computed = data.get("computed", False)
        if not isinstance(computed, bool):
            raise _Bad(f"'computed' must be true or false, not {_show(computed)}")
        try:
            provenance = Provenance.from_json(data.get("provenance"))
            signature = Signature.from_json(data.get("signature"))
        except ValueError as exc:
            raise _Bad(str(exc)) from None
        return cls(
            layout=_text(data, "layout"),
            key=_text(data, "key"),
            files=files,
            toolchain=toolchain,
            flags=tuple(flags),
            created=created,
            producer=_text(data, "producer", default=""),
            compile_seconds=compile_seconds,
            tags=dict(tags),
            computed=computed,
            schema=schema,
            minor=minor,
            provenance=provenance,
            signature=signature,
        )

    def with_marker(self, name: str, content: bytes = b"") -> Manifest:
        """This manifest also covering the commit marker ``name`` written with ``content``
        (the 0-byte ``model.done``): a publisher that writes the marker itself records it."""
        if name in self.files:
            return self
        return dataclasses.replace(self, files={**self.files, name: sha256_bytes(content)})


class _Bad(ValueError):
    """One reason a manifest is malformed (becomes a CorruptEntry problem)."""


def _files_from_json(files_raw: Any) -> dict[str, FileDigest]:
    """A manifest's ``files``: each name a safe relative path, each digest a SHA-256 and a size."""
    if not isinstance(files_raw, dict) or not files_raw:
        raise _Bad("'files' must be a non-empty object")
    if len(files_raw) > MAX_FILES:
        raise _Bad(f"{len(files_raw)} files, above the limit of {MAX_FILES}")
    files: dict[str, FileDigest] = {}
    for name, digest in files_raw.items():
        try:
            rel = safe_relpath(name)
        except InvalidKey as exc:
            raise _Bad(f"file name {_show(name)}: {exc.reason}") from None
        if not isinstance(digest, dict):
            raise _Bad(f"files[{name!r}] must be an object")
        sha, size = digest.get("sha256"), _int(digest.get("size"))
        if not isinstance(sha, str) or not _SHA256_RE.match(sha):
            raise _Bad(f"files[{name!r}].sha256 must be 64 lowercase hex digits, not {_show(sha)}")
        if size is None or not 0 <= size <= MAX_FILE_SIZE:
            raise _Bad(f"files[{name!r}].size must be an integer in 0..{MAX_FILE_SIZE}, "
                       f"not {_show(digest.get('size'))}")
        files[rel] = FileDigest(sha, size)
    return files


def _toolchain_from_json(tc: Any) -> Toolchain | None:
    """A manifest's ``toolchain``: absent, or an object of short strings Toolchain accepts."""
    if tc is None:
        return None
    if not isinstance(tc, dict) or not all(isinstance(v, str | int) and not isinstance(v, bool)
                                           and len(str(v)) <= MAX_TEXT for v in tc.values()):
        raise _Bad(f"'toolchain' must be an object of short strings, not {_show(tc)}")
    try:
        return Toolchain.from_json(tc)
    except ValueError as exc:  # ConfigError included
        raise _Bad(f"toolchain: {exc}") from None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    """A JSON number as a finite float, or None (bools, strings, huge integers, NaN)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int):
        return float(value) if abs(value) <= 2**63 else None
    return value if math.isfinite(value) else None


def _text(data: Mapping[str, Any], name: str, *, default: str | None = None) -> str:
    value = data.get(name, default)
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise _Bad(f"{name!r} must be a string of at most {MAX_TEXT} characters, not {_show(value)}")
    return value


def _show(value: Any) -> str:
    """A short rendering of a bad value for a message (it may be huge: it came from outside)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _no_constant(name: str) -> Any:
    raise _Bad(f"{name} is not a number a manifest may hold")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Bad(f"{text[:40]} is out of range")
    return value


def json_depth(raw: bytes) -> int:
    """How deep the arrays and objects of a JSON text nest, without parsing it.

    ``json.loads`` recurses once per level and only then would a hook see the result, so a
    ``[[[[...`` bomb must be refused before it is parsed. One linear pass over strings (skipped:
    a bracket inside a string does not nest) and brackets; it stops once past the limit.
    """
    depth = deepest = 0
    for match in _TOKEN_RE.finditer(raw):
        token = match.group()
        if token[0] == 0x22:  # a string: its brackets do not nest
            continue
        if token in b"[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_MANIFEST_DEPTH:
                    return deepest
        else:
            depth -= 1
    return deepest


class _Readable(Protocol):
    def open_read(self, path: str) -> contextlib.AbstractContextManager[BinaryIO]: ...


def read_manifest(store: _Readable, path: str, *, where: str | None = None, size: int | None = None) -> Manifest:
    """Read and parse the manifest at ``path`` of ``store``, at most MAX_MANIFEST_BYTES + 1 bytes.

    ``size`` (from a listing) refuses an oversized manifest without opening it; otherwise a
    bounded read does (a 500 MiB ``neffcache.json`` costs one MiB of memory, not 500). Raises
    CorruptEntry for a bad manifest, the store's errors (EntryNotFound...) for a missing one.
    """
    where = where or path
    if size is not None and size > MAX_MANIFEST_BYTES:
        raise CorruptEntry(where, [f"manifest is {size} bytes, above the {MAX_MANIFEST_BYTES} byte limit"])
    with store.open_read(path) as stream:
        raw = stream.read(MAX_MANIFEST_BYTES + 1)
    if len(raw) > MAX_MANIFEST_BYTES:
        raise CorruptEntry(where, [f"manifest is above the {MAX_MANIFEST_BYTES} byte limit"])
    return Manifest.from_bytes(raw, where=where)


def sha256_stream(stream: BinaryIO) -> FileDigest:
    digest = hashlib.sha256()
    size = 0
    while chunk := stream.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return FileDigest(digest.hexdigest(), size)


def sha256_file(path: str | os.PathLike[str]) -> FileDigest:
    with open(open_regular(path), "rb") as f:  # a FIFO planted in a store: refused, never waited on
        digest = hashlib.file_digest(f, "sha256")
        return FileDigest(digest.hexdigest(), f.tell())


def sha256_bytes(data: bytes) -> FileDigest:
    return FileDigest(hashlib.sha256(data).hexdigest(), len(data))


def digest_files(root: Path, names: list[str]) -> dict[str, FileDigest]:
    return {name: sha256_file(root / name) for name in names}
