"""Sizes and durations as people write and read them: the one unit system of neffcache.

Decimal units (kB = 1000 bytes, MB, GB, TB), as ``df -H`` and the S3 console print them;
:func:`parse_size` also accepts binary ones (KiB, MiB, GiB...) on input. A value module: it
imports nothing of neffcache, so the CLI and the server's dashboard both use it.
"""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "p": 10**15, "pb": 10**15, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40, "pib": 2**50}
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_NUMBER = re.compile(r"^\s*(?P<n>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[A-Za-z]*)\s*$")


def human_bytes(n: float, *, grouped: bool = False) -> str:
    """``1234567`` -> ``"1.2 MB"`` (decimal units); ``grouped`` adds thousands separators
    (``"1,234.5 TB"``), for the dashboard."""
    sep = "," if grouped else ""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:{sep}.0f} {unit}" if unit == "B" else f"{n:{sep}.1f} {unit}"
        n /= 1000
    return f"{n:{sep}.1f} PB"


def parse_size(text: str) -> int:
    """500G, 1.5T, 200MB, 64GiB, 1000 (bytes). Decimal units, as :func:`human_bytes` prints sizes."""
    match = _NUMBER.match(text)
    if not match or match.group("unit").lower() not in _UNITS:
        raise ValueError(f"{text!r} is not a size (e.g. 500G, 1.5T, 64GiB)")
    return int(float(match.group("n")) * _UNITS[match.group("unit").lower()])


def parse_duration(text: str) -> float:
    """30d, 12h, 90m, 2w, 3600s (a bare number is seconds)."""
    match = _NUMBER.match(text)
    unit = match.group("unit").lower() if match else ""
    if not match or (unit and unit not in _SECONDS):
        raise ValueError(f"{text!r} is not a duration (e.g. 30d, 12h, 90m)")
    return float(match.group("n")) * _SECONDS.get(unit, 1)


def plural(n: int, noun: str) -> str:
    """``plural(1, "toolchain")`` -> ``"1 toolchain"``, ``plural(2, "entry")`` -> ``"2 entries"``,
    ``plural(3, "miss")`` -> ``"3 misses"`` (thousands separated)."""
    if n == 1:
        return f"1 {noun}"
    if noun.endswith("y") and noun[-2:-1] not in ("a", "e", "i", "o", "u"):
        return f"{n:,} {noun[:-1]}ies"
    return f"{n:,} {noun}{'es' if noun.endswith(('s', 'sh', 'ch', 'x')) else 's'}"


def compile_time(seconds: float) -> str:
    """Compile time in the unit that fits (:func:`human_duration`): ``"0.5 s"``, ``"12 min"``,
    ``"3.2 h"`` — never ``0.00 compile hours`` for a few seconds."""
    return f"{human_duration(seconds)} of compile time"


def human_duration(seconds: float) -> str:
    """``42.0`` -> ``"42.0 s"``, ``5400`` -> ``"1.5 h"``: one unit, the largest that reads below 90 of it."""
    if seconds < 90:
        return f"{seconds:.1f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
