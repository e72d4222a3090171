"""Why a graph missed: a missed graph against the nearest entries, field by field.

A miss is a key that drifted. Every key is made of the same parts (neffcache/keys.py's
:class:`~neffcache.keys.KeyParts`, JAX's ``explain_cache_misses`` habit): the HLO, the flags,
the compiler version, the target and the LNC, plus the rule by which the runtime turns them
into its key (layout A's flags-file era, neffcache/layouts/flags.py). So a miss is explained by
comparing what is known of the missed graph (:class:`GraphParts`, any part may be unknown)
with what is known of each entry that shares its HLO, its graph hash or its model tag
(:class:`Candidate`, found in the stores and the index by :mod:`neffcache.misses.nearest`),
and ranking them by closeness: the same HLO first, then the fewest differing fields.

Why the comparison is sound: a field is called different only when both sides know it (or,
for the flags of a layout-A key, when the layout recomputes the key from the entry's flags and
gets another one); an unknown field is reported as unknown and counts against closeness only
after every known difference. A field a layout can *recompute* is inferred rather than assumed:
when the entry's flags, under the missed graph's compiler and target, give exactly the missed
key, the flags are the same, whatever the key's hash hides. The wording of causes and fixes is
:mod:`neffcache.misses.causes`. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from neffcache.entry import Namespace
from neffcache.errors import ConfigError, FlagsFileError
from neffcache.instances import TARGETS
from neffcache.layouts import get_layout
from neffcache.layouts.base import Layout
from neffcache.misses.flagdiff import FlagDiff, diff_flags


class Field(StrEnum):
    """The parts of a key, in the order a comparison shows them."""

    LAYOUT = "layout"
    HLO = "hlo"
    COMPILER = "compiler"
    KEY_RULE = "key_rule"  # how the runtime of that compiler turns flags into its key
    TARGET = "target"
    LNC = "lnc"
    FLAGS = "flags"


class Match(StrEnum):
    SAME = "same"
    DIFFERENT = "different"
    UNKNOWN = "unknown"


class Source(StrEnum):
    """Where a candidate was found: a store the command was given, or the index (fleet-wide)."""

    STORE = "store"
    INDEX = "index"


@dataclass(frozen=True)
class GraphParts:
    """What is known of the parts of one graph's key; None (or empty tags) where unknown."""

    layout: str | None = None
    key: str | None = None
    compiler_version: str | None = None
    target: str | None = None
    lnc: int | None = None
    hlo_sha256: str | None = None
    hlo_size: int | None = None
    flags: tuple[str, ...] | None = None  # the user flags
    tags: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"layout": self.layout, "key": self.key, "compiler_version": self.compiler_version,
                "target": self.target, "lnc": self.lnc, "hlo_sha256": self.hlo_sha256,
                "hlo_size": self.hlo_size, "flags": list(self.flags) if self.flags is not None else None,
                "tags": dict(self.tags)}


@dataclass(frozen=True)
class Missed:
    """The graph a job looked for and did not find. ``path``: where the runtime looked (its entry
    path in a store), None when the namespace is unknown; ``origin``: what the user named."""

    path: str | None
    parts: GraphParts
    origin: str = ""
    status: str | None = None  # what a report said of it (miss, compiled, failed...)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "origin": self.origin, "status": self.status, **self.parts.to_json()}


@dataclass(frozen=True)
class Candidate:
    """An entry near a missed graph: its path, where it is held, its state and its parts."""

    path: str
    source: Source
    stores: tuple[str, ...]
    state: str
    parts: GraphParts
    why: str = ""  # why it was looked at: same HLO, same graph, same key, same model tag

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "source": self.source.value, "stores": list(self.stores), "state": self.state,
                "found_by": self.why, **self.parts.to_json()}


@dataclass(frozen=True)
class Difference:
    """One field of the comparison: the entry's value (``found``) and the missed graph's."""

    field: Field
    match: Match
    found: str | None = None
    wanted: str | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field.value, "match": self.match.value, "found": self.found,
                "wanted": self.wanted, "note": self.note}


@dataclass(frozen=True)
class Comparison:
    """A missed graph against one candidate: every field, the flags token by token, and the
    likely cause and the fix in one line each (:mod:`neffcache.misses.causes`)."""

    candidate: Candidate
    differences: tuple[Difference, ...]
    flags: FlagDiff | None
    cause: str = ""
    fix: str = ""

    def match(self, name: Field) -> Match:
        return next((d.match for d in self.differences if d.field is name), Match.UNKNOWN)

    def count(self, match: Match) -> int:
        return sum(1 for d in self.differences if d.match is match)

    def rank(self) -> tuple[int, int, int, int, int, int, str]:
        """Closeness, smallest first: the same HLO first, the fewest differing fields, the fewest
        unknown ones, the fewest differing flags, SUCCESS entries, entries of the given stores
        before the index's."""
        hlo = {Match.SAME: 0, Match.UNKNOWN: 1, Match.DIFFERENT: 2}[self.match(Field.HLO)]
        flags = self.flags.count + self.flags.reordered if self.flags is not None else 0
        return (hlo, self.count(Match.DIFFERENT), self.count(Match.UNKNOWN), flags, self.candidate.state != "SUCCESS",
                self.candidate.source is not Source.STORE, self.candidate.path)

    def to_json(self) -> dict[str, Any]:
        return {"entry": self.candidate.to_json(), "differences": [d.to_json() for d in self.differences],
                "differing": [d.field.value for d in self.differences if d.match is Match.DIFFERENT],
                "flags_diff": self.flags.to_json() if self.flags is not None else None,
                "cause": self.cause, "fix": self.fix}


def _layout_of(missed: GraphParts, cand: GraphParts) -> Layout | None:
    name = missed.layout or cand.layout
    try:
        return get_layout(name) if name else None
    except ConfigError:
        return None


def _plain(name: Field, found: object, wanted: object) -> Difference:
    if found is None or wanted is None:
        return Difference(name, Match.UNKNOWN, _text(found), _text(wanted))
    return Difference(name, Match.SAME if found == wanted else Match.DIFFERENT, _text(found), _text(wanted))


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _hlo(missed: GraphParts, cand: GraphParts, layout: Layout | None) -> Difference:
    """The HLO by digest; else a graph hash both keys carry (layout A's ``MODULE_<graph>``)."""
    if missed.hlo_sha256 and cand.hlo_sha256:
        return _plain(Field.HLO, cand.hlo_sha256, missed.hlo_sha256)
    if layout is not None and missed.key and cand.key and missed.layout == cand.layout:
        mine, theirs = layout.graph_of(missed.key), layout.graph_of(cand.key)
        if mine is not None and theirs is not None:
            same = Match.SAME if mine == theirs else Match.DIFFERENT
            return Difference(Field.HLO, same, theirs, mine, note="by the graph hash in the key")
        if missed.key == cand.key:
            return Difference(Field.HLO, Match.SAME, note="the same key")
    return Difference(Field.HLO, Match.UNKNOWN, cand.hlo_sha256, missed.hlo_sha256)


def _key_rule(missed: GraphParts, cand: GraphParts, layout: Layout | None) -> Difference | None:
    """The runtime's rule from flags to key, when the two compilers follow different ones."""
    if layout is None or not missed.compiler_version or not cand.compiler_version:
        return None
    mine, theirs = layout.key_rule(missed.compiler_version), layout.key_rule(cand.compiler_version)
    if mine is None or theirs is None or mine == theirs:
        return None
    newer = mine if (mine.since or "") > (theirs.since or "") else theirs
    return Difference(Field.KEY_RULE, Match.DIFFERENT, theirs.form, mine.form, note=f"changed at {newer.since}")


def infer_from_key(missed: GraphParts, cand: GraphParts) -> tuple[GraphParts, bool]:
    """The missed graph's parts with its flags (and target) filled in from ``cand`` when the
    layout, recomputing the missed key from the candidate's flags under the missed graph's
    compiler and target (each target, where the target is unknown), gets the missed key itself.

    Returns (parts, tried): ``tried`` is True when the layout could recompute the key at all,
    so a mismatch then means the flags (or the target) differ."""
    layout = _layout_of(missed, cand)
    if (missed.flags is not None or cand.flags is None or layout is None or not missed.key
            or missed.layout != cand.layout or not cand.key or layout.graph_of(missed.key) is None
            or layout.graph_of(missed.key) != layout.graph_of(cand.key)):
        return missed, False
    version = missed.compiler_version or cand.compiler_version
    targets = [missed.target] if missed.target else list(dict.fromkeys([cand.target, *TARGETS]))
    tried = False
    for target in targets:
        namespace = Namespace(layout.name, "", version, target, missed.lnc)
        try:
            key = layout.key_with_flags(missed.key, namespace, cand.flags)
        except FlagsFileError:
            continue
        tried = tried or key is not None
        if key == missed.key:
            return dataclasses.replace(missed, flags=cand.flags, target=missed.target or target), True
    return missed, tried


def _flags(missed: GraphParts, cand: GraphParts, layout: Layout | None, tried: bool
           ) -> tuple[Difference, FlagDiff | None]:
    if missed.flags is None or cand.flags is None:
        if tried:  # the layout recomputed the key from the entry's flags and got another one
            return Difference(Field.FLAGS, Match.DIFFERENT, " ".join(cand.flags or ()), None,
                              note="the key is not the one these flags give"), None
        return Difference(Field.FLAGS, Match.UNKNOWN, _joined(cand.flags), _joined(missed.flags)), None
    key_flags = layout.key_flags if layout is not None else list
    diff = diff_flags(key_flags(cand.flags), key_flags(missed.flags))
    return (Difference(Field.FLAGS, Match.SAME if diff.same else Match.DIFFERENT, _joined(cand.flags),
                       _joined(missed.flags)), diff)


def _joined(flags: Sequence[str] | None) -> str | None:
    return None if flags is None else " ".join(flags)


def compare(missed: GraphParts, cand: Candidate) -> Comparison:
    """The missed graph's parts against one candidate's, field by field (no cause yet)."""
    theirs = cand.parts
    layout = _layout_of(missed, theirs)
    original = missed
    missed, tried = infer_from_key(missed, theirs)
    flags, diff = _flags(missed, theirs, layout, tried)
    if original.flags is None and missed.flags is not None:
        flags = dataclasses.replace(flags, note="inferred: the key is the one these flags give")
    target = _plain(Field.TARGET, theirs.target, missed.target)
    if original.target is None and missed.target is not None:
        target = dataclasses.replace(target, note="inferred from the key")
    found = [_plain(Field.LAYOUT, theirs.layout, missed.layout), _hlo(missed, theirs, layout),
             _plain(Field.COMPILER, theirs.compiler_version, missed.compiler_version),
             _key_rule(missed, theirs, layout), target, _plain(Field.LNC, theirs.lnc, missed.lnc), flags]
    return Comparison(cand, tuple(d for d in found if d is not None), diff)


def nearest(comparisons: Sequence[Comparison]) -> list[Comparison]:
    """``comparisons`` nearest first (see :meth:`Comparison.rank`), one per entry path: an entry
    several sources know is compared as the nearest one's, held in all of their stores."""
    first: dict[str, Comparison] = {}
    for comparison in sorted(comparisons, key=Comparison.rank):
        path = comparison.candidate.path
        if path not in first:
            first[path] = comparison
            continue
        kept = first[path].candidate
        stores = tuple(dict.fromkeys([*kept.stores, *comparison.candidate.stores]))
        first[path] = dataclasses.replace(first[path], candidate=dataclasses.replace(kept, stores=stores))
    return list(first.values())
