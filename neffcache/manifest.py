"""The per-entry manifest, ``neffcache.json``: what an entry holds and how it was made.

sha256 and size of every file make the store content-verified end to end: an entry is
checked against its manifest on ingest and on every pull from a remote tier.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from neffcache.errors import CorruptEntry
from neffcache.keys import safe_relpath
from neffcache.toolchain import Toolchain

MANIFEST_NAME = "neffcache.json"
SCHEMA_VERSION = 1
_CHUNK = 1 << 20


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

    @property
    def size(self) -> int:
        return sum(d.size for d in self.files.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
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
        }

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_bytes(cls, raw: bytes, *, where: str = "<manifest>") -> Manifest:
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CorruptEntry(where, [f"manifest is not JSON: {exc}"]) from None
        return cls.from_json(data, where=where)

    @classmethod
    def from_json(cls, data: Any, *, where: str = "<manifest>") -> Manifest:
        if not isinstance(data, dict):
            raise CorruptEntry(where, ["manifest is not a JSON object"])
        schema = data.get("schema")
        if not isinstance(schema, int) or schema > SCHEMA_VERSION or schema < 1:
            raise CorruptEntry(where, [f"unsupported manifest schema {schema!r}"])
        try:
            files = {
                safe_relpath(str(name)): FileDigest(str(d["sha256"]), int(d["size"]))
                for name, d in data["files"].items()
            }
            tc = data.get("toolchain")
            return cls(
                layout=str(data["layout"]),
                key=str(data["key"]),
                files=files,
                toolchain=Toolchain.from_json(tc) if tc else None,
                flags=tuple(str(f) for f in data.get("flags", [])),
                created=float(data.get("created", 0.0)),
                producer=str(data.get("producer", "")),
                compile_seconds=(
                    float(data["compile_seconds"]) if data.get("compile_seconds") is not None else None
                ),
                tags={str(k): str(v) for k, v in (data.get("tags") or {}).items()},
                computed=bool(data.get("computed", False)),
                schema=schema,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptEntry(where, [f"manifest is malformed: {exc!r}"]) from None


def sha256_stream(stream: BinaryIO) -> FileDigest:
    digest = hashlib.sha256()
    size = 0
    while chunk := stream.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return FileDigest(digest.hexdigest(), size)


def sha256_file(path: str | os.PathLike[str]) -> FileDigest:
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256")
        return FileDigest(digest.hexdigest(), f.tell())


def sha256_bytes(data: bytes) -> FileDigest:
    return FileDigest(hashlib.sha256(data).hexdigest(), len(data))


def digest_files(root: Path, names: list[str]) -> dict[str, FileDigest]:
    return {name: sha256_file(root / name) for name in names}
