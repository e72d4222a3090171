"""Scanning a store: every entry by namespace and state, as an immutable report.

One listing pass (``iter_files``) feeds every layout; nothing is opened unless manifests are
asked for, so a scan of a large root costs about what ``find`` costs. Entries that
contradict themselves are reported as CORRUPT with their problems, never raised
(huggingface_hub's ``scan_cache_dir`` habit): one bad entry must not hide the rest.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from neffcache.entry import Entry, EntryState, FileInfo, Namespace
from neffcache.errors import CorruptEntry, EntryNotFound
from neffcache.layouts import LAYOUTS, Located, locate
from neffcache.layouts.base import TEMP_MARKER
from neffcache.layouts.neuronxcc import NeuronxccLayout
from neffcache.layouts.torchneuron import TorchNeuronLayout
from neffcache.manifest import Manifest, read_manifest
from neffcache.stores.base import CONTROL_DIR, DirListing, Store

log = logging.getLogger(__name__)
Progress = Callable[[int], None]
CONTROL_PREFIX = CONTROL_DIR + "/"


@dataclass(frozen=True)
class NamespaceSummary:
    namespace: Namespace
    entries: int
    size: int
    states: dict[str, int]


@dataclass(frozen=True)
class ScanReport:
    store: str
    entries: tuple[Entry, ...]
    garbage: tuple[FileInfo, ...]  # temp files of interrupted writes, orphans
    warnings: tuple[str, ...]
    seconds: float
    control_files: int = 0
    uncommitted: tuple[Entry, ...] = ()  # writes that never reached their commit marker

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    @property
    def garbage_size(self) -> int:
        return sum(f.size for f in self.garbage) + sum(e.size for e in self.uncommitted)

    @property
    def garbage_count(self) -> int:
        """Temp files plus uncommitted entries: what ``prune --garbage`` would look at."""
        return len(self.garbage) + len(self.uncommitted)

    def by_state(self) -> dict[str, int]:
        counts = Counter(e.state.value for e in self.entries)
        return {s.value: counts.get(s.value, 0) for s in EntryState}

    def namespaces(self) -> list[NamespaceSummary]:
        groups: dict[Namespace, list[Entry]] = defaultdict(list)
        for e in self.entries:
            groups[e.namespace].append(e)
        out = []
        for ns, entries in sorted(groups.items(), key=lambda kv: (kv[0].layout, kv[0].path)):
            states = Counter(e.state.value for e in entries)
            out.append(NamespaceSummary(ns, len(entries), sum(e.size for e in entries), dict(states)))
        return out

    def find(self, path: str) -> Entry | None:
        for e in self.entries:
            if e.path == path:
                return e
        return None

    def to_json(self) -> dict[str, object]:
        return {
            "store": self.store,
            "entries": len(self.entries),
            "size": self.size,
            "states": self.by_state(),
            "namespaces": [
                {
                    "layout": s.namespace.layout,
                    "path": s.namespace.path,
                    "compiler_version": s.namespace.compiler_version,
                    "target": s.namespace.target,
                    "lnc": s.namespace.lnc,
                    "entries": s.entries,
                    "size": s.size,
                    "states": s.states,
                }
                for s in self.namespaces()
            ],
            "garbage": {"files": len(self.garbage), "uncommitted_entries": len(self.uncommitted),
                        "size": self.garbage_size,
                        "paths": [g.path for g in self.garbage[:100]]
                        + [e.path for e in self.uncommitted[:100]]},
            "warnings": list(self.warnings),
            "seconds": round(self.seconds, 3),
        }


@dataclass
class _Group:
    located: Located
    files: dict[str, FileInfo] = field(default_factory=dict)


def group_files(files: Iterable[FileInfo], progress: Progress | None = None
                ) -> tuple[dict[str, _Group], list[FileInfo], int]:
    """Assign listed files to entries; return (groups by entry path, garbage, control-file count)."""
    listings = (DirListing(head, [name], [info])
                for info in files for head, _, name in (info.path.rpartition("/"),))
    return group_dirs(listings, progress)


def group_dirs(listings: Iterable[DirListing], progress: Progress | None = None
               ) -> tuple[dict[str, _Group], list[FileInfo], int]:
    """:func:`group_files` for listings by directory (``Store.iter_dirs``): the fast path."""
    groups: dict[str, _Group] = {}
    garbage: list[FileInfo] = []
    control = 0
    count = 0
    layouts = list(LAYOUTS.values())
    neuronxcc = LAYOUTS["neuronxcc"]
    assert isinstance(neuronxcc, NeuronxccLayout)
    # Layout A keeps an entry's files in one directory: resolve each directory once, not
    # each file (a scan of 100k entries would otherwise run 400k regex matches). A directory
    # may come in several listings.
    entry_dirs: dict[str, _Group | None] = {}
    namespaces: dict[str, Namespace | None] = {}
    for listing in listings:
        directory, names, files = listing
        if progress is not None:
            before, count = count, count + len(files)
            if count // 5000 != before // 5000:
                progress(count)
        in_control = directory == CONTROL_DIR or directory.startswith(CONTROL_PREFIX)
        # Names hold no "/": a marker found in the joined names lies within one name.
        if TEMP_MARKER in "/".join(names):
            kept_names: list[str] = []
            kept_files: list[FileInfo] = []
            for name, info in zip(names, files, strict=True):
                if TEMP_MARKER in name:
                    garbage.append(info)
                else:
                    kept_names.append(name)
                    kept_files.append(info)
            if not in_control:
                names, files = kept_names, kept_files
        if in_control:
            control += len(files)  # temp files there too: they are control files and garbage
            continue
        if not files:
            continue  # no group for a directory of temp files only
        if directory in entry_dirs:
            group = entry_dirs[directory]
        else:
            found = neuronxcc.locate_dir(directory, namespaces)
            group = entry_dirs[directory] = _Group(found) if found is not None else None
            if group is not None:
                groups[group.located.path] = group
        if group is not None:
            group.files.update(zip(names, files, strict=True))
            continue
        for info in files:
            located = None
            for layout in layouts:
                located = layout.locate(info.path)
                if located is not None:
                    break
            if located is None:
                if not any(lay.is_runtime_file(info.path) for lay in layouts):
                    garbage.append(info)
                continue
            other = groups.get(located.path)
            if other is None:
                other = groups[located.path] = _Group(located)
            other.files[located.name] = info
    return groups, garbage, control


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a scan builds its objects.

    A scan allocates millions of small objects that never form cycles; as they pile up,
    CPython's full collections walk them and the rest of the heap again and again (with the
    previous report alive, 7.0 s of a 100k-entry scan instead of 3.9 s). The pause defers one
    pass rather than saving it: the next collection finds whatever it would have found during
    the scan. Only re-enabled if it was enabled, so overlapping scans in several threads leave
    the collector as they found it.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _read_manifest(store: Store, group: _Group, manifest_name: str) -> tuple[Manifest | None, str | None]:
    path = f"{group.located.base}/{manifest_name}" if group.located.base else manifest_name
    try:
        listed = group.files.get(manifest_name)
        return read_manifest(store, path, where=path, size=listed.size if listed else None), None
    except CorruptEntry as exc:
        return None, "; ".join(exc.problems)
    except (EntryNotFound, FileNotFoundError):
        return None, None


def scan(store: Store, *, prefix: str = "", read_manifests: bool = False, layout: str | None = None,
         progress: Progress | None = None, workers: int = 16) -> ScanReport:
    """Scan ``store`` (below ``prefix``). ``read_manifests`` opens every manifest (slower)."""
    started = time.monotonic()
    # Reading manifests is I/O (and JSON) bound: let the collector run through those scans.
    with contextlib.nullcontext() if read_manifests else _gc_paused():
        return _scan(store, started, prefix=prefix, read_manifests=read_manifests, layout=layout,
                     progress=progress, workers=workers)


def _scan(store: Store, started: float, *, prefix: str, read_manifests: bool, layout: str | None,
          progress: Progress | None, workers: int) -> ScanReport:
    groups, garbage, control = group_dirs(store.iter_dirs(prefix), progress)
    warnings: list[str] = []

    def build(group: _Group) -> Entry:
        lay = LAYOUTS[group.located.namespace.layout]
        manifest, error = (None, None)
        if read_manifests:
            name = lay.plan_entry(group.located.namespace, group.located.key).manifest_name
            if name in group.files:
                manifest, error = _read_manifest(store, group, name)
        return lay.classify(group.located, group.files, manifest, error)

    selected = [g for g in groups.values() if layout is None or g.located.namespace.layout == layout]
    if read_manifests and len(selected) > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            entries = list(pool.map(build, selected))
    else:
        entries = [build(g) for g in selected]
    entries.sort(key=lambda e: e.path)
    committed = [e for e in entries if e.committed]
    for e in committed:
        if e.state is EntryState.CORRUPT:
            warnings.append(f"{e.path}: {'; '.join(e.problems)}")
    return ScanReport(store.url, tuple(committed), tuple(sorted(garbage, key=lambda f: f.path)),
                      tuple(warnings), time.monotonic() - started, control,
                      tuple(e for e in entries if not e.committed))


def load_entry(store: Store, path: str, *, read_manifest: bool = True) -> Entry | None:
    """One entry by its path (the listing of just its files), or None when nothing is there."""
    probe = locate(path + "/" + "model.neff") or locate(path + ".neff")
    if probe is None:
        return None
    lay = LAYOUTS[probe.namespace.layout]
    if probe.namespace.layout == "neuronxcc":
        infos = list(store.iter_files(probe.base))
    else:
        names = TorchNeuronLayout.names_for(probe.namespace, probe.key).values()
        infos = [i for n in names if (i := store.stat(f"{probe.base}/{n}" if probe.base else n))]
    groups, _, _ = group_files(infos)
    group = groups.get(probe.path)
    if group is None:
        return None
    plan = lay.plan_entry(group.located.namespace, group.located.key)
    manifest, error = (None, None)
    if read_manifest and plan.manifest_name in group.files:
        manifest, error = _read_manifest(store, group, plan.manifest_name)
    return lay.classify(group.located, group.files, manifest, error)
