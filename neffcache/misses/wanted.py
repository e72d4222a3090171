"""A graph a job will look up: what `plan` discovers and what `why-miss` explains.

It names where the runtime will look (``path``: the store-relative entry path, in the layout
and namespace of the job's toolchain) and, as far as they are known, the inputs that make its
key: the HLO digest and size, the user flags, the toolchain. `plan --json` writes one per graph
and `why-miss --from-report` reads them back, so :meth:`WantedGraph.from_json` treats its input
as untrusted: a report file is just a file (every field typed, the path checked like any path
from outside, sizes bounded).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from neffcache.errors import ConfigError, NeffcacheError
from neffcache.keys import safe_relpath
from neffcache.manifest import MAX_FLAG_LEN, MAX_FLAGS
from neffcache.toolchain import Toolchain

_HEX64 = frozenset("0123456789abcdef")
_MAX_TEXT = 1024


@dataclass(frozen=True)
class WantedGraph:
    path: str  # the entry path the runtime will look for, relative to a store root
    layout: str
    namespace: str
    key: str
    toolchain: Toolchain | None = None
    hlo_sha256: str | None = None
    hlo_size: int | None = None
    flags: tuple[str, ...] | None = None  # the user flags, as the runtime passes them; None: unknown
    bucket: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "layout": self.layout, "namespace": self.namespace, "key": self.key,
                "toolchain": self.toolchain.to_json() if self.toolchain else None,
                "hlo_sha256": self.hlo_sha256, "hlo_size": self.hlo_size,
                "flags": list(self.flags) if self.flags is not None else None,
                "bucket": self.bucket, "tags": dict(self.tags)}

    @classmethod
    def from_json(cls, data: object) -> WantedGraph:
        """One graph of a report; :class:`~neffcache.errors.ConfigError` naming the bad field."""
        if not isinstance(data, Mapping):
            raise ConfigError("a graph in the report is not an object")
        try:
            return cls(path=safe_relpath(_text(data, "path")), layout=_text(data, "layout"),
                       namespace=_text(data, "namespace", empty=True), key=_text(data, "key"),
                       toolchain=_toolchain(data.get("toolchain")), hlo_sha256=_digest(data.get("hlo_sha256")),
                       hlo_size=_size(data.get("hlo_size")), flags=_flags(data.get("flags")),
                       bucket=_optional_text(data, "bucket"), tags=_tags(data.get("tags")))
        except ConfigError:
            raise
        except NeffcacheError as exc:  # a path that could escape a root
            raise ConfigError(f"graph in the report: {exc}") from None


def _text(data: Mapping[str, Any], name: str, *, empty: bool = False) -> str:
    value = data.get(name)
    if not isinstance(value, str) or (not value and not empty) or len(value) > _MAX_TEXT:
        raise ConfigError(f"graph in the report: {name!r} must be a string of at most {_MAX_TEXT} characters")
    return value


def _optional_text(data: Mapping[str, Any], name: str) -> str | None:
    return None if data.get(name) is None else _text(data, name, empty=True)


def _toolchain(value: object) -> Toolchain | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigError("graph in the report: 'toolchain' must be an object")
    return Toolchain.from_json(value)  # validates version, target and LNC


def _digest(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) != 64 or not set(value) <= _HEX64:
        raise ConfigError("graph in the report: 'hlo_sha256' must be 64 lowercase hex characters")
    return value


def _size(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value < 2**53 or int(value) != value:
        raise ConfigError("graph in the report: 'hlo_size' must be a whole number of bytes")
    return int(value)


def _flags(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_FLAGS or not all(
            isinstance(f, str) and len(f) <= MAX_FLAG_LEN for f in value):
        raise ConfigError(f"graph in the report: 'flags' must be a list of at most {MAX_FLAGS} strings")
    return tuple(value)


def _tags(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 64 or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 256 for k, v in value.items()):
        raise ConfigError("graph in the report: 'tags' must be an object of at most 64 short strings")
    return dict(value)
