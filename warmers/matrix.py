"""Shape buckets: the matrix of ``KEY=VALUE`` substitutions a warm-up runs its command over.

A bucket is one assignment of values to keys, e.g. ``{"SEQ": "512", "BATCH": "4"}``. Each key
becomes an environment variable of the workload and replaces ``{KEY}`` in its arguments, so
both styles of training script work::

    neffcache warm --bucket SEQ=128,512 -- python train.py --seq-len {SEQ}
    neffcache warm --bucket SEQ=128,512 -- python train.py        # reads $SEQ

Buckets come from ``--bucket KEY=V1,V2`` flags (the cartesian product of all keys) or from a
matrix file (JSON or TOML)::

    {"matrix": {"SEQ": [128, 512], "BATCH": [1, 4]},     # product, like a CI matrix
     "include": [{"SEQ": 2048, "BATCH": 1}]}             # extra buckets, verbatim

The order is the order given (keys in flag/file order, values in list order), which is what
makes ``--shard I/N`` deterministic: bucket ``k`` belongs to shard ``k % N`` on every host.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from neffcache.errors import ConfigError

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_VARIABLE = re.compile(r"^[A-Z_][A-Z0-9_]*$")
DEFAULT_KEY = "BUCKET"  # `--bucket 128,256` without a key


@dataclass(frozen=True)
class Bucket:
    """One shape bucket: its position in the matrix and its substitutions."""

    index: int
    values: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.values.items()) or "default"

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` with ``{KEY}`` replaced; unknown ``{NAME}`` is left alone (it may be the
        script's own syntax, e.g. a Python format string)."""
        return [_PLACEHOLDER_RE.sub(lambda m: self.values.get(m.group(1), m.group(0)), a) for a in argv]

    def env(self) -> dict[str, str]:
        return {**self.values, "NEFFCACHE_BUCKET": self.name}

    def tags(self) -> dict[str, str]:
        return {"bucket": self.name} if self.values else {}


@dataclass(frozen=True)
class Shard:
    """``--shard I/N``: this process does the I-th of N disjoint parts (0-based, like Kubernetes'
    JOB_COMPLETION_INDEX)."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str | None) -> Shard:
        if not text:
            return cls()
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if not match:
            raise ConfigError(f"--shard takes I/N (e.g. 0/4), not {text!r}")
        index, count = int(match.group(1)), int(match.group(2))
        if count < 1 or not 0 <= index < count:
            raise ConfigError(f"--shard {text}: I is 0-based and must be below N (0/{count} .. {count - 1}/{count})")
        return cls(index, count)

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"

    def owns_position(self, position: int) -> bool:
        return position % self.count == self.index

    def owns_name(self, name: str) -> bool:
        """For graphs: a stable hash, so hosts agree whatever order their listings come in."""
        if self.count == 1:
            return True
        digest = hashlib.sha256(name.encode()).digest()
        return int.from_bytes(digest[:8], "big") % self.count == self.index


def _check_key(key: str, where: str) -> str:
    if not _KEY_RE.match(key):
        raise ConfigError(f"{where}: bucket key {key!r} must be a variable name (letters, digits, _)")
    return key


def _scalar(value: object, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(f"{where}: bucket values must be strings or numbers, not {value!r}")
    return str(value)


def product(axes: Mapping[str, Sequence[str]]) -> list[dict[str, str]]:
    keys = list(axes)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(axes[k] for k in keys))]


def parse_bucket_flags(flags: Iterable[str]) -> list[dict[str, str]]:
    """``("SEQ=128,256", "BATCH=1")`` -> the product of the axes, in the order given."""
    axes: dict[str, list[str]] = {}
    for flag in flags:
        key, sep, raw = flag.partition("=")
        if not sep:
            if _VARIABLE.match(flag.strip()):
                # `--bucket SEQ` is a key whose values were forgotten, not one bucket named SEQ.
                raise ConfigError(f"--bucket {flag}: no values; write --bucket {flag.strip()}=V1,V2 "
                                  f"(a bare list such as --bucket 128,256 sets ${DEFAULT_KEY})")
            key, raw = DEFAULT_KEY, flag
        key = _check_key(key.strip(), f"--bucket {flag}")
        values = [v.strip() for v in raw.split(",") if v.strip()]
        if not values:
            raise ConfigError(f"--bucket {flag}: no values")
        axes.setdefault(key, [])
        axes[key].extend(v for v in values if v not in axes[key])
    return product(axes) if axes else []


def load_matrix_file(path: Path) -> list[dict[str, str]]:
    try:
        raw = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the matrix file {path}: {exc.strerror}") from None
    try:
        data = tomllib.loads(raw) if path.suffix == ".toml" else json.loads(raw)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        kind = "TOML" if path.suffix == ".toml" else "JSON"
        raise ConfigError(f"{path}: not valid {kind}: {exc}") from None
    if isinstance(data, list):  # a bare list of buckets
        data = {"include": data}
    if not isinstance(data, dict) or not set(data) <= {"matrix", "include"}:
        raise ConfigError(f"{path}: expected an object with 'matrix' and/or 'include'")
    rows: list[dict[str, str]] = []
    matrix = data.get("matrix") or {}
    if not isinstance(matrix, dict):
        raise ConfigError(f"{path}: 'matrix' must map keys to lists of values")
    axes: dict[str, list[str]] = {}
    for key, values in matrix.items():
        items = values if isinstance(values, list) else [values]
        axes[_check_key(str(key), str(path))] = [_scalar(v, str(path)) for v in items]
    if axes:
        rows.extend(product(axes))
    include = data.get("include") or []
    if not isinstance(include, list) or not all(isinstance(b, dict) for b in include):
        raise ConfigError(f"{path}: 'include' must be a list of objects")
    for bucket in include:
        rows.append({_check_key(str(k), str(path)): _scalar(v, str(path)) for k, v in bucket.items()})
    if not rows:
        raise ConfigError(f"{path}: no buckets")
    return rows


def build_buckets(flags: Iterable[str] = (), matrix_file: Path | None = None) -> list[Bucket]:
    """Every bucket, de-duplicated, in order; one empty bucket when none were asked for."""
    rows = parse_bucket_flags(flags)
    if matrix_file is not None:
        if rows:
            raise ConfigError("use --bucket or --matrix, not both")
        rows = load_matrix_file(matrix_file)
    seen: set[tuple[tuple[str, str], ...]] = set()
    unique = []
    for row in rows:
        marker = tuple(row.items())
        if marker not in seen:
            seen.add(marker)
            unique.append(row)
    return [Bucket(i, values) for i, values in enumerate(unique or [{}])]


def shard_buckets(buckets: Sequence[Bucket], shard: Shard) -> list[Bucket]:
    return [b for b in buckets if shard.owns_position(b.index)]
