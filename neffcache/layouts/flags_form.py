"""Which flags form a ``neuronxcc`` namespace's entries are named by: decided from its own entries.

The form of the flags file, and so the ``+<suffix>`` of every ``MODULE_<graph>+<suffix>`` name,
follows the libneuronxla release installed beside the compiler, not the compiler version
(:mod:`neffcache.layouts.flags`). A command that names entries (``rewarm``, ``upgrade-report``,
``why-miss``) therefore asks the namespace itself:

1. **entries**: the newest committed SUCCESS entries of the namespace (:data:`SAMPLE` of them,
   among the first :data:`LISTED` entry directories a listing yields: never the whole namespace
   of a million-entry tree) have their flags file read (at most :data:`MAX_FLAGS_BYTES`, never
   through a symlink: the stores refuse them). An entry is evidence only when its flags file
   hashes to its own suffix: the runtime named it from those very bytes, so its form is the
   form of the runtime that wrote it. The **newest** such entry decides (the release installed
   now wrote it; an SDK patch can switch forms under one compiler version); entries of other
   forms are counted and reported. A flags file that is missing, too big, binary or in no
   form, or that does not hash to its suffix, is counted and ignored, never fatal;
2. **version table**, for a namespace with no evidence: :func:`~neffcache.layouts.flags.form_by_version`,
   which says when a version was shipped with two forms;
3. **override**: the operator forces a form (``--flags-form``); the entries are still read, so a
   disagreement is reported.

Across several stores (tiers) the first store with evidence decides; another store whose
evidence says otherwise gives a note. The decision is a value (:class:`FormDecision`): the form,
the rule that decided, the evidence and a one-line explanation; :meth:`FormDecision.apply`
puts the form on the namespace (``Namespace.flags_form``), the one place the code that names
entries reads it from (:meth:`NeuronxccLayout.flags_form`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from neffcache.entry import Entry, EntryState, FileInfo, Namespace
from neffcache.errors import FlagsFileError, NeffcacheError
from neffcache.layouts import flags as flagsfile
from neffcache.layouts import get_layout
from neffcache.layouts.flags import FLAGS_JSON, FLAGS_TXT
from neffcache.layouts.neuronxcc import NeuronxccLayout
from neffcache.layouts.records import Located
from neffcache.stores.base import Store

SAMPLE = 16  # flags files read per namespace and store, newest entries first
LISTED = 1024  # entry directories a listing looks at per namespace and store
MAX_FLAGS_BYTES = 64 << 10  # a flags file is a few hundred bytes
_LAYOUT = get_layout(NeuronxccLayout.name)  # the registry's: the one runtime whose keys have forms


class Rule(StrEnum):
    """What decided a namespace's form."""

    ENTRIES = "entries"
    TABLE = "version table"
    OVERRIDE = "override"


@dataclass(frozen=True)
class Evidence:
    """What one store's entries of a namespace say of its form."""

    store: str | None = None
    read: int = 0  # entries whose flags file was looked at
    forms: Mapping[str, int] = field(default_factory=dict)  # entries whose file backs their name, per form
    mismatched: int = 0  # flags file does not hash to the suffix: ignored
    string_hashed: int = 0  # of those, a JSON list whose joined string hashes to the suffix (reported)
    unreadable: int = 0  # missing, too big, unreadable, or in no form
    newest: str | None = None  # the newest entry with a backing flags file (decides)
    newest_form: str | None = None

    @property
    def verified(self) -> int:
        return sum(self.forms.values())

    def counts(self) -> str:
        """``3 list, 1 text`` (most first)."""
        return ", ".join(f"{n} {form}" for form, n in sorted(self.forms.items(), key=lambda kv: (-kv[1], kv[0])))

    def ignored(self) -> str:
        parts = []
        if self.mismatched:
            parts.append(f"{self.mismatched} whose flags file does not match the suffix"
                         + (f" ({self.string_hashed} named by the md5 of the joined flag string)"
                            if self.string_hashed else ""))
        if self.unreadable:
            parts.append(f"{self.unreadable} unreadable")
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"store": self.store, "entries_read": self.read, "forms": dict(self.forms),
                "mismatched": self.mismatched, "string_hashed": self.string_hashed,
                "unreadable": self.unreadable, "newest": self.newest, "newest_form": self.newest_form}


@dataclass(frozen=True)
class FormDecision:
    """The flags form decided for one namespace, by which rule, on what evidence."""

    namespace: str
    form: str | None  # None: undecidable (the version cannot be read and nothing else says)
    rule: Rule
    explanation: str
    evidence: Evidence = field(default_factory=Evidence)
    ambiguous: bool = False  # the version table's version was seen with two forms
    notes: tuple[str, ...] = ()

    def apply(self, namespace: Namespace) -> Namespace:
        """``namespace`` with this form on it (unchanged when undecided)."""
        if self.form is None or namespace.flags_form == self.form:
            return namespace
        return dataclasses.replace(namespace, flags_form=self.form)

    def to_json(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "form": self.form, "rule": self.rule.value,
                "explanation": self.explanation, "ambiguous": self.ambiguous,
                "evidence": self.evidence.to_json(), "notes": list(self.notes)}


def has_forms(namespace: Namespace) -> bool:
    """True for a namespace whose entries are named by a flags form (the ``neuronxcc`` runtime)."""
    return namespace.layout == _LAYOUT.name


# -- one entry ---------------------------------------------------------------------------------
def _read(store: Store, entry: Entry, name: str) -> bytes | None:
    info = entry.files.get(name)
    if info is None or info.size > MAX_FLAGS_BYTES:
        return None
    try:
        with store.open_read(entry.store_path(name)) as stream:
            data = stream.read(MAX_FLAGS_BYTES + 1)
    except (NeffcacheError, OSError):
        return None
    return data if len(data) <= MAX_FLAGS_BYTES else None


def entry_form(store: Store, entry: Entry) -> tuple[flagsfile.FlagsForm | None, str]:
    """(form, verdict) of one entry's flags file: the form when the file backs the entry's
    name (verdict ``"ok"``), else None and why (``"mismatch"``, ``"string-hashed"``,
    ``"unreadable"``). Each flags file the entry holds is tried, the JSON one first."""
    verdict = "unreadable"
    for name in (FLAGS_JSON, FLAGS_TXT):
        if name not in entry.files:
            continue
        data = _read(store, entry, name)
        if data is None:
            continue
        form = flagsfile.adopted_form(entry.key, name, data)
        if form is not None:
            return form, "ok"
        if flagsfile.suffix_problem(entry.key, data) is None:
            continue  # it hashes to the suffix but is in no form: garbage the runtime hashed
        try:
            anomaly = flagsfile.string_hashed_list(entry.key, name, data)
        except (ValueError, RecursionError):
            anomaly = False
        verdict = "string-hashed" if anomaly else "mismatch"
    return None, verdict


def own_namespace(store: Store, entry: Entry) -> Namespace:
    """``entry``'s namespace with the form its own flags file says (unchanged when it says none,
    or the layout has no forms): for a job that compiles into the very entry a runtime
    extracted (two-phase warm), whose name the runtime already gave in its own form."""
    if not has_forms(entry.namespace):
        return entry.namespace
    form, _ = entry_form(store, entry)
    return dataclasses.replace(entry.namespace, flags_form=form.name) if form is not None else entry.namespace


# -- one store ---------------------------------------------------------------------------------
def listed_entries(store: Store, namespace: Namespace) -> list[Entry]:
    """The committed SUCCESS entries among the first :data:`LISTED` entry directories of
    ``namespace`` that a listing of ``store`` yields (a directory whose listing had a problem,
    a symlink, say, is left out)."""
    found: dict[str, dict[str, FileInfo]] = {}
    broken: set[str] = set()
    listings = store.iter_dirs(namespace.path)
    try:
        for listing in listings:
            located = _entry_of(listing.directory)
            if located is None or located.namespace.path != namespace.path:
                continue
            if listing.directory not in found and len(found) >= LISTED:
                break
            found.setdefault(listing.directory, {}).update(zip(listing.names, listing.files, strict=True))
            if listing.problems:
                broken.add(listing.directory)
    finally:
        close = getattr(listings, "close", None)
        if close is not None:
            close()
    entries = []
    for directory, files in found.items():
        located = _entry_of(directory)
        if located is None or directory in broken:
            continue
        entry = _LAYOUT.classify(located, files, None)
        if entry.state is EntryState.SUCCESS and entry.committed:
            entries.append(entry)
    return entries


def _entry_of(directory: str) -> Located | None:
    """The entry whose directory is ``directory`` (its layout's role for it)."""
    role = _LAYOUT.directory_role(directory)
    return None if role is None else role.entry


def newest_first(entries: Iterable[Entry]) -> list[Entry]:
    return sorted(entries, key=lambda e: (-e.mtime, e.path))


def evidence(store: Store, namespace: Namespace, entries: Iterable[Entry] | None = None) -> Evidence:
    """What ``store``'s entries of ``namespace`` say: ``entries`` when the caller listed them
    already (only the namespace's committed SUCCESS ones are used), else a bounded listing."""
    pool = listed_entries(store, namespace) if entries is None else [
        e for e in entries if e.namespace.path == namespace.path and e.state is EntryState.SUCCESS and e.committed]
    forms: Counter[str] = Counter()
    verdicts: Counter[str] = Counter()
    newest: tuple[str, str] | None = None
    sample = newest_first(pool)[:SAMPLE]
    for entry in sample:
        form, verdict = entry_form(store, entry)
        verdicts[verdict] += 1
        if form is not None:
            forms[form.name] += 1
            if newest is None:
                newest = (entry.key, form.name)
    return Evidence(store.url, len(sample), dict(forms), verdicts["mismatch"] + verdicts["string-hashed"],
                    verdicts["string-hashed"], verdicts["unreadable"],
                    newest[0] if newest else None, newest[1] if newest else None)


# -- the decision ------------------------------------------------------------------------------
def by_table(namespace: Namespace) -> FormDecision:
    """The version table's answer for a namespace without evidence."""
    version = namespace.compiler_version or ""
    answer = flagsfile.form_by_version(version)
    if answer is None:
        return FormDecision(namespace.path, None, Rule.TABLE,
                            f"no entry says the flags form and compiler version {version!r} cannot be read: "
                            "pass --flags-form")
    text = f"no entry says the flags form: the version table gives {answer.form.name} for neuronx-cc {version}"
    if answer.ambiguous:
        both = " and ".join(f.name for f in (*answer.also_seen, answer.form))
        short = ".".join(map(str, (flagsfile.version_key(version) or ())))
        text += (f"; but {short} was shipped with both forms ({both}): warm one graph with the runtime "
                 "first, or pass --flags-form")
    return FormDecision(namespace.path, answer.form.name, Rule.TABLE, text, ambiguous=answer.ambiguous)


def _from_entries(namespace: Namespace, ev: Evidence) -> FormDecision:
    text = f"the newest entry whose flags file matches its suffix ({ev.newest} in {ev.store}) is {ev.newest_form}"
    if len(ev.forms) > 1:
        text += f"; entries disagree ({ev.counts()} of {ev.read} read), the newest decides"
    else:
        text += f" ({ev.verified} of {ev.read} read agree)"
    if ev.ignored():
        text += f"; ignored: {ev.ignored()}"
    return FormDecision(namespace.path, ev.newest_form, Rule.ENTRIES, text, ev)


def decide(stores: Sequence[Store], namespace: Namespace, *, override: str | None = None,
           entries: Callable[[Store], Iterable[Entry] | None] | None = None) -> FormDecision | None:
    """The form of ``namespace`` across ``stores`` (fastest first); None when its layout has no
    flags forms. ``override``: a form forced by the operator. ``entries``: a store's entries
    when the caller listed them already (None: list the namespace, bounded)."""
    if not has_forms(namespace):
        return None
    if override is not None and override not in flagsfile.CHOOSABLE:
        raise FlagsFileError(f"unknown flags form {override!r}; choose one of {', '.join(flagsfile.CHOOSABLE)}")
    found = [evidence(store, namespace, entries(store) if entries else None) for store in stores]
    with_evidence = [ev for ev in found if ev.verified]
    notes = []
    decision: FormDecision
    if with_evidence:
        decision = _from_entries(namespace, with_evidence[0])
        notes += [f"{ev.store} says {ev.newest_form} ({ev.counts()}), {with_evidence[0].store} decided "
                  f"{decision.form}" for ev in with_evidence[1:] if ev.newest_form != decision.form]
    else:
        decision = by_table(namespace)
        ignored = [f"{ev.store}: {ev.ignored()}" for ev in found if ev.ignored()]
        if ignored:
            notes.append("entries read but not evidence: " + "; ".join(ignored))
    if override is not None:
        said = f"the namespace's {decision.rule.value} said {decision.form}"
        text = f"forced by --flags-form ({said})"
        if decision.form != override and decision.rule is Rule.ENTRIES:
            notes.append(f"--flags-form {override} overrides the namespace's own entries "
                         f"({decision.evidence.counts()}): the runtime that wrote them will not find what is written")
        decision = FormDecision(namespace.path, override, Rule.OVERRIDE, text, decision.evidence)
    return dataclasses.replace(decision, notes=tuple(notes)) if notes else decision


def describe(decision: FormDecision) -> str:
    """One line for a report: ``<namespace>: flags form <form> (<rule>): <explanation>``."""
    return f"{decision.namespace}: flags form {decision.form or '?'} ({decision.rule.value}): {decision.explanation}"


class NamespaceForms:
    """The decision per namespace path, made once (a command names many entries of one
    namespace), from any thread."""

    def __init__(self, stores: Sequence[Store], *, override: str | None = None,
                 entries: Callable[[Store], Iterable[Entry] | None] | None = None) -> None:
        if override is not None and override not in flagsfile.CHOOSABLE:
            raise FlagsFileError(f"unknown flags form {override!r}; choose one of {', '.join(flagsfile.CHOOSABLE)}")
        self.stores = list(stores)
        self.override = override
        self.entries = entries
        self.decided: dict[str, FormDecision] = {}
        self._lock = threading.Lock()

    def __call__(self, namespace: Namespace) -> Namespace:
        """``namespace`` with its decided form on it (unchanged for a layout without forms)."""
        decision = self.decision(namespace)
        return decision.apply(namespace) if decision is not None else namespace

    def decision(self, namespace: Namespace) -> FormDecision | None:
        """The decision for ``namespace`` (None for a layout without forms), made once."""
        if not has_forms(namespace):
            return None
        with self._lock:
            decision = self.decided.get(namespace.path)
            if decision is None:
                decision = decide(self.stores, namespace, override=self.override, entries=self.entries)
                assert decision is not None  # has_forms
                self.decided[namespace.path] = decision
        return decision

    def decisions(self) -> list[FormDecision]:
        with self._lock:
            return [self.decided[path] for path in sorted(self.decided)]
