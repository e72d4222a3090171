"""Why a graph missed: a missed graph against the nearest entries, field by field.

A miss is a key that drifted. Every key is made of the same parts (neffcache/keys.py's
:class:`~neffcache.keys.KeyParts`, JAX's ``explain_cache_misses`` habit): the HLO, the flags,
the compiler version, the target and the LNC, plus the rule by which the runtime turns them
into its key (neuronxcc's flags-file form, neffcache/layouts/flags.py: the missed graph's is
its namespace's decided form, neffcache/layouts/flags_form.py; an entry's is read off its own
flags file; either falls back to the version table, and each says which rule gave it). So a miss is explained by
comparing what is known of the missed graph (:class:`GraphParts`, any part may be unknown)
with what is known of each entry that shares its HLO, its graph hash or its model tag
(:class:`NearEntry`, found in the stores and the index by :mod:`neffcache.misses.nearest`),
and ranking them by closeness: the same HLO first, then the fewest differing fields.

Why the comparison is sound: a field is called different only when both sides know it (or,
for the flags of a neuronxcc key, when the layout recomputes the key from the entry's flags and
gets another one); an unknown field is reported as unknown and counts against closeness only
after every known difference. A field a layout can *recompute* is inferred rather than assumed:
when the entry's flags, under the missed graph's compiler, target and flags form, give exactly
the missed key, the flags are the same, whatever the key's hash hides; and when they give it
only under another form, that form is the one the job's runtime keys by (an md5 match is
proof), whatever its namespace's entries say. The wording of causes and fixes is
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


class FoundIn(StrEnum):
    """Where a near entry was found: a store the command was given, or the index (fleet-wide)."""

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
    # The rule by which the key was made (neuronxcc's flags form) and what said so: "entries",
    # "version table", "override" (a namespace's decision), "its flags file", "inferred from the key".
    flags_form: str | None = None
    form_rule: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"layout": self.layout, "key": self.key, "compiler_version": self.compiler_version,
                "target": self.target, "lnc": self.lnc, "hlo_sha256": self.hlo_sha256,
                "hlo_size": self.hlo_size, "flags": list(self.flags) if self.flags is not None else None,
                "tags": dict(self.tags), "flags_form": self.flags_form, "flags_form_rule": self.form_rule}


@dataclass(frozen=True)
class Missed:
    """The graph a job looked for and did not find. ``path``: where the runtime looked (its entry
    path in a store), None when the namespace is unknown; ``origin``: what the user named."""

    path: str | None
    parts: GraphParts
    origin: str = ""
    status: str | None = None  # what a report said of it (miss, compiled, failed...)
    # How the flags form of the namespace it was looked for in was decided (one line, and the
    # decision as JSON), when its layout has forms.
    form_explanation: str = ""
    form_decision: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "origin": self.origin, "status": self.status, **self.parts.to_json(),
                "flags_form_decision": dict(self.form_decision) if self.form_decision is not None else None}


@dataclass(frozen=True)
class NearEntry:
    """An entry near a missed graph: its path, where it is held, its state and its parts."""

    path: str
    source: FoundIn
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

    candidate: NearEntry
    differences: tuple[Difference, ...]
    flags: FlagDiff | None
    cause: str = ""
    fix: str = ""
    # The job settings behind differing flags, as the layout names them (:meth:`Layout.job_settings`):
    # (variable, the entry's value, the job's), every one of them when some differ.
    settings: tuple[tuple[str, str, str], ...] = ()

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
                self.candidate.source is not FoundIn.STORE, self.candidate.path)

    def to_json(self) -> dict[str, Any]:
        return {"entry": self.candidate.to_json(), "differences": [d.to_json() for d in self.differences],
                "differing": [d.field.value for d in self.differences if d.match is Match.DIFFERENT],
                "flags_diff": self.flags.to_json() if self.flags is not None else None,
                "settings": [{"variable": v, "found": f, "wanted": w} for v, f, w in self.settings],
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
    """The HLO by digest; else a graph hash both keys carry (neuronxcc's ``MODULE_<graph>``)."""
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


def _namespace(layout: Layout, parts: GraphParts, version: str | None = None, target: str | None = None,
               form: str | None = None) -> Namespace:
    """A namespace of ``parts``' toolchain and flags form, to ask the layout about its keys."""
    return Namespace(layout.name, "", version or parts.compiler_version, target or parts.target, parts.lnc,
                     form if form is not None else parts.flags_form)


def _rule_of(layout: Layout, parts: GraphParts) -> tuple[str, str] | None:
    """(form, what said so) of the rule ``parts``' key was made by, None when unknown."""
    if not parts.compiler_version and not parts.flags_form:
        return None
    try:
        rule = layout.key_rule(_namespace(layout, parts))
    except FlagsFileError:
        return None
    if rule is None:
        return None
    return rule.form, parts.form_rule or "version table"


def _key_rule(missed: GraphParts, cand: GraphParts, layout: Layout | None) -> Difference | None:
    """The runtime's rule from flags to key on each side, and what said so: a difference when
    the job's runtime keys by another rule than the entry was named by."""
    if layout is None or missed.layout != cand.layout:
        return None
    mine, theirs = _rule_of(layout, missed), _rule_of(layout, cand)
    if mine is None or theirs is None:
        return None
    note = f"job's: {mine[1]}; entry's: {theirs[1]}"
    return Difference(Field.KEY_RULE, Match.SAME if mine[0] == theirs[0] else Match.DIFFERENT, theirs[0], mine[0],
                      note=note)


def infer_from_key(missed: GraphParts, cand: GraphParts) -> tuple[GraphParts, bool]:
    """The missed graph's parts with its flags (and target, and flags form) filled in from
    ``cand`` when the layout, recomputing the missed key from the candidate's flags under the
    missed graph's compiler, target (each target, where the target is unknown) and flags form
    (its decided one first, then the layout's others), gets the missed key itself.

    Returns (parts, tried): ``tried`` is True when the layout could recompute the key at all,
    so a mismatch then means the flags (or the target) differ."""
    layout = _layout_of(missed, cand)
    if (missed.flags is not None or cand.flags is None or layout is None or not missed.key
            or missed.layout != cand.layout or not cand.key or layout.graph_of(missed.key) is None
            or layout.graph_of(missed.key) != layout.graph_of(cand.key)):
        return missed, False
    version = missed.compiler_version or cand.compiler_version
    targets = [missed.target] if missed.target else list(dict.fromkeys([cand.target, *TARGETS]))
    forms: list[str | None] = [missed.flags_form]
    forms += [f for f in layout.flags_forms() if f != missed.flags_form and (version or missed.flags_form)]
    tried = False
    for form in forms:
        for target in targets:
            namespace = _namespace(layout, missed, version, target, form)
            try:
                key = layout.key_with_flags(missed.key, namespace, cand.flags)
            except FlagsFileError:
                continue
            tried = tried or key is not None
            if key == missed.key:
                found = dataclasses.replace(missed, flags=cand.flags, target=missed.target or target)
                if form != missed.flags_form:
                    found = dataclasses.replace(found, flags_form=form, form_rule="inferred from the key")
                return found, True
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


def compare(missed: GraphParts, cand: NearEntry) -> Comparison:
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
    return Comparison(cand, tuple(d for d in found if d is not None), diff,
                      settings=_settings(layout, theirs.flags, missed.flags) if flags.match is Match.DIFFERENT else ())


def _settings(layout: Layout | None, found: Sequence[str] | None, wanted: Sequence[str] | None
              ) -> tuple[tuple[str, str, str], ...]:
    """The job settings behind the entry's flags and the job's, when some differ; () when the
    layout's flags come from one setting (the flags then say all there is)."""
    if layout is None or found is None or wanted is None:
        return ()
    theirs, mine = layout.job_settings(found), layout.job_settings(wanted)
    if len(theirs) < 2 or theirs == mine:
        return ()
    return tuple((name, theirs[name], mine.get(name, "")) for name in theirs)


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
