"""Where the entries nearest a missed graph are: the stores the command was given, and the index.

A store is listed once (:func:`~neffcache.scan.report.scan`, no file opened) and its entries
indexed by what a missed graph can share with them: the graph hash in a neuronxcc key (the
``MODULE_<graph>`` part recurs across flags and compiler versions), the key itself (a torchneuron
key recurs across compiler directories), the size of the HLO (a cheap first test of the same
HLO: only entries of exactly that size have their digest read, from the manifest or by hashing
the file). Only those entries have their manifest and flags file opened, once each, so a report
of a thousand missed graphs costs one listing per store and a few reads per graph. Entries of
the same model tag (a changed graph) are looked for only when nothing shares the graph, in at
most :data:`MAX_TAG_READS` manifests per store.

The index is asked fleet-wide, for entries of the same HLO digest or model tag
(``IndexClient.similar``) and of the same key (``find_entries``): it knows stores this command
was not given. Its answers are untrusted records, each checked as a report's graph is
(:meth:`~neffcache.misses.wanted.WantedGraph.from_json`); one that fails is skipped. With no
index configured, or one that does not answer, the stores' answer stands and says so.
Read-only.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from neffcache.entry import Entry, EntryState
from neffcache.errors import ConfigError, CorruptEntry, IndexServerError, NeffcacheError
from neffcache.index import Index
from neffcache.layouts import LAYOUTS, get_layout
from neffcache.layouts.flags_form import NamespaceForms, describe
from neffcache.manifest import Manifest, read_manifest, sha256_stream
from neffcache.misses.causes import Explanation, explain
from neffcache.misses.explain import FoundIn, GraphParts, Missed, NearEntry
from neffcache.misses.wanted import WantedGraph
from neffcache.scan.report import scan
from neffcache.stores.base import Store

log = logging.getLogger(__name__)
MAX_FLAGS_FILE = 1 << 20  # a flags file is a few hundred bytes; a bigger one is not read
MAX_TAG_READS = 2000  # manifests read per store looking for the same model tag
MAX_TAG_CANDIDATES = 5
MAX_INDEX_ANSWERS = 50
MODEL_TAG = "model"
ITSELF = "the entry itself"
SAME_GRAPH = ("same HLO", "same graph hash", "same key")
FROM_FILE = "its flags file"  # a candidate's flags form, read off its own flags file


@dataclass
class StoreCatalog:
    """One store's entries, indexed by what a missed graph can share with them."""

    store: Store
    entries: dict[str, Entry]
    by_graph: dict[tuple[str, str], list[Entry]] = field(default_factory=lambda: defaultdict(list))
    by_key: dict[str, list[Entry]] = field(default_factory=lambda: defaultdict(list))
    by_hlo_size: dict[int, list[Entry]] = field(default_factory=lambda: defaultdict(list))
    problems: list[str] = field(default_factory=list)
    _parts: dict[str, GraphParts] = field(default_factory=dict)
    _manifests: dict[str, Manifest | None] = field(default_factory=dict)
    _by_layout: dict[str, list[Entry]] | None = None

    @classmethod
    def build(cls, store: Store, progress: Callable[[int], None] | None = None) -> StoreCatalog:
        report = scan(store, progress=progress)
        catalog = cls(store, {e.path: e for e in report.entries})
        for entry in report.entries:
            layout = get_layout(entry.layout)
            graph = layout.graph_of(entry.key)
            if graph is not None:
                catalog.by_graph[(entry.layout, graph)].append(entry)
            catalog.by_key[entry.key].append(entry)
            hlo = layout.hlo_of(entry)
            if hlo is not None:
                catalog.by_hlo_size[entry.files[hlo].size].append(entry)
        return catalog

    # -- reading an entry's parts, once ------------------------------------------------------
    def manifest(self, entry: Entry) -> Manifest | None:
        if entry.path not in self._manifests:
            self._manifests[entry.path] = self._read_manifest(entry)
        return self._manifests[entry.path]

    def _read_manifest(self, entry: Entry) -> Manifest | None:
        if not entry.has_manifest:
            return None
        path = entry.store_path(entry.manifest_name)
        try:
            return read_manifest(self.store, path, size=entry.files[entry.manifest_name].size)
        except CorruptEntry as exc:
            self.problems.append(f"{self.store.url}/{path}: {'; '.join(exc.problems)}")
        except (NeffcacheError, OSError) as exc:
            self.problems.append(f"{self.store.url}/{path}: {exc}")
        return None

    def _flags_file(self, entry: Entry) -> tuple[tuple[str, ...] | None, str | None, str | None]:
        """(user flags, target, flags form) from the entry's flags file, as its layout reads it
        (the form only when the file backs the entry's key)."""
        layout = get_layout(entry.layout)
        name = layout.flags_of(entry)
        if name is None or entry.files[name].size > MAX_FLAGS_FILE:
            return None, None, None
        path = entry.store_path(name)
        try:
            with self.store.open_read(path) as stream:
                data = stream.read(MAX_FLAGS_FILE + 1)
            rule = layout.key_rule_of_file(entry.key, name, data)
            return (tuple(layout.read_user_flags(name, data)), layout.flags_target(name, data),
                    rule.form if rule is not None else None)
        except (ValueError, NeffcacheError, OSError) as exc:  # FlagsFileError is a ValueError
            self.problems.append(f"{self.store.url}/{path}: {exc}")
            return None, None, None

    def parts(self, entry: Entry) -> GraphParts:
        """What the entry says of its key: its namespace, manifest and flags file (cached)."""
        if entry.path not in self._parts:
            self._parts[entry.path] = self._read_parts(entry)
        return self._parts[entry.path]

    def _read_parts(self, entry: Entry) -> GraphParts:
        layout = get_layout(entry.layout)
        manifest = self.manifest(entry)
        ns = entry.namespace
        tc = manifest.toolchain if manifest is not None and manifest.toolchain else ns.toolchain
        flags, file_target, form = self._flags_file(entry)
        if flags is None and manifest is not None and not manifest.computed:
            flags = manifest.flags  # neffcache compiled it with these; an adopted entry's manifest only guessed
        hlo = layout.hlo_of(entry)
        digest = manifest.files.get(hlo) if manifest is not None and hlo else None
        return GraphParts(layout=entry.layout, key=entry.key,
                          compiler_version=tc.compiler_version if tc else ns.compiler_version,
                          target=tc.target if tc else ns.target or file_target, lnc=tc.lnc if tc else ns.lnc,
                          hlo_sha256=digest.sha256 if digest else None,
                          hlo_size=entry.files[hlo].size if hlo else None, flags=flags,
                          tags=dict(manifest.tags) if manifest is not None else {},
                          flags_form=form, form_rule=FROM_FILE if form is not None else None)

    def hlo_digest(self, entry: Entry) -> str | None:
        """The entry's HLO digest: its manifest's, else the file hashed (then remembered)."""
        parts = self.parts(entry)
        if parts.hlo_sha256 is not None:
            return parts.hlo_sha256
        hlo = get_layout(entry.layout).hlo_of(entry)
        if hlo is None:
            return None
        try:
            with self.store.open_read(entry.store_path(hlo)) as stream:
                digest = sha256_stream(stream).sha256
        except (NeffcacheError, OSError) as exc:
            self.problems.append(f"{self.store.url}/{entry.store_path(hlo)}: {exc}")
            return None
        self._parts[entry.path] = dataclasses.replace(parts, hlo_sha256=digest)
        return digest

    # -- the question -------------------------------------------------------------------------
    def near(self, missed: Missed) -> tuple[list[NearEntry], Entry | None]:
        """The entries near ``missed`` and the entry at its very path, if the store has one."""
        wanted = missed.parts
        found: dict[str, str] = {}  # path -> why it is near
        if wanted.layout and wanted.key:
            graph = get_layout(wanted.layout).graph_of(wanted.key)
            for entry in self.by_graph.get((wanted.layout, graph), []) if graph else []:
                found.setdefault(entry.path, "same graph hash")
        for entry in self.by_key.get(wanted.key or "", []):
            found.setdefault(entry.path, "same key")
        if wanted.hlo_sha256 and wanted.hlo_size is not None:
            for entry in self.by_hlo_size.get(wanted.hlo_size, []):
                if self.hlo_digest(entry) == wanted.hlo_sha256:
                    found[entry.path] = "same HLO"
        itself = self.entries.get(missed.path or "")
        if itself is not None:  # held (no miss here), or its state is the cause: never its own neighbour
            found.pop(itself.path, None)
            if itself.state is not EntryState.SUCCESS:
                found[itself.path] = ITSELF
        if not found and wanted.tags.get(MODEL_TAG):
            found.update(self._same_model(missed))
        return [self.candidate(self.entries[path], why) for path, why in found.items()], itself

    def _manifested(self, layout: str | None) -> Iterator[Entry]:
        """Entries with a manifest, those of ``layout`` first (lists made once per store)."""
        if self._by_layout is None:
            self._by_layout = defaultdict(list)
            for entry in sorted(self.entries.values(), key=lambda e: e.path):
                if entry.has_manifest:
                    self._by_layout[entry.layout].append(entry)
        first = self._by_layout.get(layout or "", [])
        return itertools.chain(first, *(v for k, v in self._by_layout.items() if k != layout))

    def _same_model(self, missed: Missed) -> dict[str, str]:
        model = missed.parts.tags[MODEL_TAG]
        bucket = missed.parts.tags.get("bucket")
        out: dict[str, str] = {}
        for entry in itertools.islice(self._manifested(missed.parts.layout), MAX_TAG_READS):
            tags = self.parts(entry).tags
            if tags.get(MODEL_TAG) == model and entry.path != missed.path:
                out[entry.path] = "same model tag" + (", same bucket" if bucket and tags.get("bucket") == bucket
                                                      else "")
        return dict(sorted(out.items(), key=lambda kv: ("same bucket" not in kv[1], kv[0]))[:MAX_TAG_CANDIDATES])

    def candidate(self, entry: Entry, why: str) -> NearEntry:
        return NearEntry(entry.path, FoundIn.STORE, (self.store.url,), entry.state.value, self.parts(entry), why)


# -- the index ------------------------------------------------------------------------------
def candidate_from_record(record: object, why: str) -> NearEntry | None:
    """A candidate from one index answer, or None when the record does not pass the checks a
    report's graph passes (it comes from over the network: untrusted)."""
    if not isinstance(record, Mapping):
        return None
    try:
        graph = WantedGraph.from_json(record)
    except (ConfigError, NeffcacheError):
        return None
    state = record.get("state")
    stores = record.get("stores")
    if state not in set(EntryState) or not isinstance(stores, list) or not all(
            isinstance(s, str) and 0 < len(s) <= 1024 for s in stores):
        return None
    tc = graph.toolchain
    parts = GraphParts(layout=graph.layout, key=graph.key, compiler_version=tc.compiler_version if tc else None,
                       target=tc.target if tc else None, lnc=tc.lnc if tc else None, hlo_sha256=graph.hlo_sha256,
                       hlo_size=graph.hlo_size, flags=graph.flags, tags=graph.tags)
    return NearEntry(graph.path, FoundIn.INDEX, tuple(stores[:64]), str(state), parts, why)


@dataclass
class IndexAsker:
    """Asks the index about one missed graph after another; once it failed to answer, it is not
    asked again (a report of a thousand graphs must not wait out a thousand timeouts)."""

    index: Index
    down: str | None = None

    def ask(self, missed: Missed, digests: list[str]) -> tuple[list[NearEntry], str]:
        """Index candidates for ``missed`` (by its HLO digest and ``digests`` of the entries the
        stores found sharing its graph, by its key, by its model tag) and what to say of the index."""
        if not self.index.enabled:
            return [], "not configured: the index was not asked (answered from the stores)"
        if self.down is not None:
            return [], self.down
        try:
            records = _records(self.index, missed, digests)
        except IndexServerError as exc:
            self.down = f"{self.index.url} did not answer ({exc}): answered from the stores only"
            return [], self.down
        candidates = [c for r, why in records if (c := candidate_from_record(r, why)) is not None]
        skipped = len(records) - len(candidates)
        return candidates, (f"asked {self.index.url}: {len(candidates)} entr{'y' if len(candidates) == 1 else 'ies'}"
                            + (f" ({skipped} malformed records skipped)" if skipped else ""))


def _records(index: Index, missed: Missed, digests: list[str]) -> list[tuple[Any, str]]:
    wanted = missed.parts
    records: list[tuple[Any, str]] = []
    for digest in list(dict.fromkeys(d for d in [wanted.hlo_sha256, *digests] if d))[:4]:
        records += [(r, "same HLO") for r in index.similar(hlo_sha256=digest, limit=MAX_INDEX_ANSWERS)]
    if wanted.key:
        found = itertools.islice(index.find_entries(key=wanted.key, page_size=MAX_INDEX_ANSWERS), MAX_INDEX_ANSWERS)
        records += [(r, "same key") for r in found]
    if wanted.tags.get(MODEL_TAG) and not records and not digests:
        model = wanted.tags[MODEL_TAG]
        records += [(r, "same model tag") for r in index.similar(model=model, limit=MAX_TAG_CANDIDATES)]
    return records


def with_form(graph: Missed, forms: NamespaceForms) -> Missed:
    """``graph`` with the flags form of the namespace it was looked for in, and how that was
    decided (its layout's forms only; a graph of unknown namespace keeps the version table)."""
    located = next((found for lay in LAYOUTS.values() if (found := lay.locate_entry(graph.path or ""))), None)
    if located is None or graph.parts.layout != located.namespace.layout:
        return graph
    namespace = located.namespace
    version = graph.parts.compiler_version
    decision = forms.decision(namespace)
    if decision is None or (version and namespace.compiler_version != version):
        return graph
    parts = dataclasses.replace(graph.parts, flags_form=decision.form, form_rule=decision.rule.value)
    return dataclasses.replace(graph, parts=parts, form_explanation=describe(decision),
                               form_decision=decision.to_json())


def why_miss(missed: Sequence[Missed], catalogs: Sequence[StoreCatalog], index: Index, *,
             progress: Callable[[int], None] | None = None, instance: str | None = None) -> list[Explanation]:
    """Every missed graph explained against the stores' entries and the index's: its key
    compared under the flags form its namespace's entries in these stores decide (the
    catalogs' listings: nothing listed again). ``instance``: the job's instance type, which the
    fixes' commands name."""
    asker = IndexAsker(index)
    searched = [c.store.url for c in catalogs]
    listed = {id(c.store): list(c.entries.values()) for c in catalogs}
    forms = NamespaceForms([c.store for c in catalogs], entries=lambda store: listed.get(id(store)))
    out = []
    for number, looked_for in enumerate(missed, 1):
        if progress is not None:
            progress(number)
        graph = with_form(looked_for, forms)
        candidates: list[NearEntry] = []
        held: list[str] = []
        for catalog in catalogs:
            near, itself = catalog.near(graph)
            candidates += near
            if itself is not None and itself.state is EntryState.SUCCESS:
                held.append(catalog.store.url)
        digests = [d for c in candidates if (d := c.parts.hlo_sha256) and c.why in SAME_GRAPH]
        found, note = asker.ask(graph, digests)
        for cand in found:
            if cand.path == graph.path and cand.state == EntryState.SUCCESS:
                held += cand.stores  # held where this command did not look: the index says where
            else:
                candidates.append(cand)
        out.append(explain(graph, candidates, held=list(dict.fromkeys(held)), searched=searched, index=note,
                           instance=instance))
    return out
