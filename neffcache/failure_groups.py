"""Failed graphs grouped fleet-wide by the signature of their error (``neffcache failures``).

A :class:`Sighting` is one failed graph seen once: a FAILED entry's failure log in a store,
or an ``error`` event the index server holds. :func:`group_sightings` groups them by
signature (:func:`neffcache.failures.signature`): how many graphs, how often, first and last
seen, which compiler versions, models and teams, and one sample. The index server groups its
error events with these same functions (it may import only values), and the CLI merges the
index's groups with the stores' (:func:`merge_groups`), so a signature means one thing
everywhere.

A value module: data and pure functions. Groups read back from the server are untrusted
input: :meth:`FailureGroup.from_json` checks every field's type and bounds its lists.
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from neffcache.failures import SIGNATURE_HEX, FailureCause, FailureClass, classify_text, digest, first_error, pattern

MAX_PATHS = 100  # distinct graph paths a group lists (its count goes on)
_MAX_LABELS = 50  # compiler versions, models, teams a group lists


class SeenIn(enum.StrEnum):
    """Where a failure was seen: a store's failure log or the index server's error events."""

    STORE = "store"  # a FAILED entry's failure log
    INDEX = "index"  # an error event of the index server


@dataclass(frozen=True)
class Sighting:
    """One failed graph seen once."""

    signature: str
    cause: FailureCause
    pattern: str  # the normalised text the signature is computed from
    message: str  # the first error line, as written
    seen: float  # when: the log's mtime, the event's time
    path: str | None  # the entry, when known
    source: SeenIn
    compiler_version: str | None = None
    model: str = ""
    team: str = ""
    store: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "store": self.store, "seen": self.seen, "source": self.source,
                "compiler_version": self.compiler_version, "model": self.model, "team": self.team,
                "message": self.message}


@functools.lru_cache(maxsize=4096)
def _judged(text: str) -> tuple[str, FailureCause, str, str]:
    # Cached: a window's error events repeat a few messages thousands of times (the functions
    # are pure, so a cache cannot change an answer).
    verdict = classify_text(text)
    normalised = pattern(text, verdict)
    return digest(normalised), verdict.cause, normalised, first_error(text)


def sighting(text: str, *, seen: float, path: str | None, source: SeenIn, compiler_version: str | None = None,
             model: str = "", team: str = "", store: str | None = None) -> Sighting:
    """The sighting of a failure whose text (failure log, event message) is ``text``."""
    sig, cause, normalised, message = _judged(text)
    return Sighting(sig, cause, normalised, message, seen, path, source, compiler_version, model, team, store)


@dataclass
class FailureGroup:
    """Every sighting of one signature."""

    signature: str
    cause: FailureCause
    pattern: str
    graphs: int  # distinct failed graphs (at least: merged groups may share unlisted paths)
    occurrences: int  # sightings: failure logs plus error events
    first_seen: float
    last_seen: float
    compiler_versions: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    teams: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)  # the first MAX_PATHS distinct ones
    sample: dict[str, Any] = field(default_factory=dict)  # one sighting, a store's if any

    @property
    def failure_class(self) -> FailureClass:
        return self.cause.failure_class

    def to_json(self) -> dict[str, Any]:
        return {"signature": self.signature, "class": self.failure_class, "cause": self.cause,
                "pattern": self.pattern, "graphs": self.graphs, "occurrences": self.occurrences,
                "first_seen": self.first_seen, "last_seen": self.last_seen,
                "compiler_versions": self.compiler_versions, "models": self.models, "teams": self.teams,
                "sources": self.sources, "paths": self.paths, "sample": self.sample}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FailureGroup:
        """A group another process sent (the index server). Raises ValueError when it is not one."""
        sig = data.get("signature")
        if not isinstance(sig, str) or len(sig) != SIGNATURE_HEX or any(c not in "0123456789abcdef" for c in sig):
            raise ValueError(f"not a failure signature: {sig!r}")
        sample = data.get("sample")
        return cls(sig, FailureCause(str(data.get("cause"))), _text(data.get("pattern"), 4000),
                   _count(data.get("graphs")), _count(data.get("occurrences")), _time(data.get("first_seen")),
                   _time(data.get("last_seen")), _labels(data.get("compiler_versions")), _labels(data.get("models")),
                   _labels(data.get("teams")), _labels(data.get("sources")),
                   _labels(data.get("paths"), MAX_PATHS),
                   {str(k): v for k, v in sample.items() if isinstance(v, str | int | float | None)}
                   if isinstance(sample, dict) else {})


def _text(value: Any, limit: int) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected text, got {type(value).__name__}")
    return value[:limit]


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"expected a count, got {value!r}")
    return value


def _time(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"expected a time, got {value!r}")
    return float(value)


def _labels(value: Any, limit: int = _MAX_LABELS) -> list[str]:
    if not isinstance(value, list):
        raise ValueError(f"expected a list, got {type(value).__name__}")
    return [str(v)[:1024] for v in value if isinstance(v, str)][:limit]


def _sorted_union(*lists: Iterable[str], limit: int = _MAX_LABELS) -> list[str]:
    return sorted({v for values in lists for v in values if v})[:limit]


def _graph_keys(sightings: list[Sighting]) -> list[str]:
    """One key per failed graph: its path, or the sighting itself when it names none."""
    return list(dict.fromkeys(s.path if s.path else f"#{i}" for i, s in enumerate(sightings)))


def _group(sig: str, members: list[Sighting]) -> FailureGroup:
    members = sorted(members, key=lambda s: s.seen)
    stored = [s for s in members if s.source is SeenIn.STORE]
    sample = (stored or members)[-1]
    keys = _graph_keys(members)
    return FailureGroup(
        sig, sample.cause, sample.pattern, len(keys), len(members), members[0].seen, members[-1].seen,
        _sorted_union(s.compiler_version or "" for s in members), _sorted_union(s.model for s in members),
        _sorted_union(s.team for s in members), _sorted_union(s.source for s in members),
        [k for k in keys if not k.startswith("#")][:MAX_PATHS], sample.to_json())


def order(groups: Iterable[FailureGroup]) -> list[FailureGroup]:
    """Most graphs first, then the most recently seen."""
    return sorted(groups, key=lambda g: (-g.graphs, -g.last_seen, g.signature))


def group_sightings(sightings: Iterable[Sighting]) -> list[FailureGroup]:
    """``sightings`` grouped by signature, most graphs first."""
    by_sig: dict[str, list[Sighting]] = {}
    for s in sightings:
        by_sig.setdefault(s.signature, []).append(s)
    return order(_group(sig, members) for sig, members in by_sig.items())


def _merge(a: FailureGroup, b: FailureGroup) -> FailureGroup:
    paths = list(dict.fromkeys([*a.paths, *b.paths]))
    stored = a if SeenIn.STORE in a.sources else b if SeenIn.STORE in b.sources else None
    newest = a if a.last_seen >= b.last_seen else b
    return replace(a, graphs=max(a.graphs, b.graphs, len(paths)), occurrences=a.occurrences + b.occurrences,
                   first_seen=min(a.first_seen, b.first_seen), last_seen=max(a.last_seen, b.last_seen),
                   compiler_versions=_sorted_union(a.compiler_versions, b.compiler_versions),
                   models=_sorted_union(a.models, b.models), teams=_sorted_union(a.teams, b.teams),
                   sources=_sorted_union(a.sources, b.sources), paths=paths[:MAX_PATHS],
                   sample=(stored or newest).sample)


def merge_groups(*lists: Iterable[FailureGroup]) -> list[FailureGroup]:
    """Groups of several sources (the stores, the index) as one list: a signature once, its
    counts and lists combined (a graph both a store and the index know counts once when its
    path is listed)."""
    merged: dict[str, FailureGroup] = {}
    for groups in lists:
        for g in groups:
            merged[g.signature] = _merge(merged[g.signature], g) if g.signature in merged else g
    return order(merged.values())


def signature_prefix(text: str) -> str:
    """``text`` as a signature prefix (4 to 16 hex digits, lower case); ValueError if it is not one."""
    prefix = text.strip().lower()
    if len(prefix) < 4 or len(prefix) > SIGNATURE_HEX or any(c not in "0123456789abcdef" for c in prefix):
        raise ValueError(f"{text!r} is not a signature (4 to {SIGNATURE_HEX} hex digits, as "
                         "`neffcache failures` lists them)")
    return prefix


def resolve_signature(prefix: str, signatures: Iterable[str]) -> str:
    """The one signature of ``signatures`` that starts with ``prefix`` (a whole signature or a
    unique prefix of at least 4 hex digits). Raises ValueError saying why there is none."""
    prefix = signature_prefix(prefix)
    found = sorted({s for s in signatures if s.startswith(prefix)})
    if not found:
        raise ValueError(f"no failure has a signature starting with {prefix}")
    if len(found) > 1:
        raise ValueError(f"{prefix} is ambiguous: {', '.join(found[:10])}; give more digits")
    return found[0]


def version_of_label(label: str | None) -> str | None:
    """The compiler version in a toolchain label (the index's ``trn2-lnc2/neuronxcc-2.27...``),
    or None when the label names none (``unknown``)."""
    words = (label or "").rpartition("/")[2].split()
    _, sep, version = (words[0] if words else "").partition("-")
    return version if sep and version[:1].isdigit() else None
