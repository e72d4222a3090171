"""Scanning a store: every entry by namespace and state, as an immutable report.

One listing pass (``iter_files``) feeds every layout; nothing is opened unless manifests are
asked for, so a scan of a large root costs about what ``find`` costs. Entries that
contradict themselves are reported as CORRUPT with their problems, never raised
(huggingface_hub's ``scan_cache_dir`` habit): one bad entry must not hide the rest.

Every listed file ends up in exactly one place: an entry a layout classified (its own files
only), ``garbage`` (what neffcache recognises as debris of its own writes: temp names,
uncommitted entries), a runtime's own root file (layout A's ``lock``), neffcache's control
directory, or ``foreign``: files of other tools (optimum-neuron's registry, nested traced
models, NxD's extra files) and anything unknown, inside a namespace or not. Foreign files are
reported with their size and never removed by anything (docs/runtimes.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
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
from neffcache.layouts.base import Layout
from neffcache.manifest import Manifest, read_manifest
from neffcache.stores.base import CONTROL_DIR, TEMP_MARKER, DirListing, Store

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
    garbage: tuple[FileInfo, ...]  # temp files of interrupted writes (neffcache's own names)
    warnings: tuple[str, ...]
    seconds: float
    control_files: int = 0
    uncommitted: tuple[Entry, ...] = ()  # writes that never reached their commit marker
    # Files no layout classified and neffcache did not write: other tools', unknown. Kept.
    foreign: tuple[FileInfo, ...] = ()

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

    @property
    def foreign_size(self) -> int:
        return sum(f.size for f in self.foreign)

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
            "foreign": {"files": len(self.foreign), "size": self.foreign_size,
                        "paths": [f.path for f in self.foreign[:100]]},
            "warnings": list(self.warnings),
            "seconds": round(self.seconds, 3),
        }


@dataclass
class _Group:
    located: Located
    files: dict[str, FileInfo] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # what the listing would not follow or read


def group_files(files: Iterable[FileInfo], progress: Progress | None = None, *,
                foreign: list[FileInfo] | None = None) -> tuple[dict[str, _Group], list[FileInfo], int]:
    """Assign listed files to entries; return (groups by entry path, garbage, control-file count).
    Files no layout claims are appended to ``foreign`` when given."""
    listings = (DirListing(head, [name], [info])
                for info in files for head, _, name in (info.path.rpartition("/"),))
    return group_dirs(listings, progress, foreign=foreign)


def group_dirs(listings: Iterable[DirListing], progress: Progress | None = None,
               warnings: list[str] | None = None, *, foreign: list[FileInfo] | None = None
               ) -> tuple[dict[str, _Group], list[FileInfo], int]:
    """:func:`group_files` for listings by directory (``Store.iter_dirs``): the fast path.

    A listing's problems (a symlink not followed, an unreadable directory) make the entry they
    lie in CORRUPT with the reason; one outside any entry is added to ``warnings``."""
    groups: dict[str, _Group] = {}
    garbage: list[FileInfo] = []
    unclaimed: list[FileInfo] = foreign if foreign is not None else []
    control = 0
    count = 0
    layouts = list(LAYOUTS.values())
    # Layouts whose entries are directories (layout A): resolve each directory once, not
    # each file (a scan of 100k entries would otherwise run 400k regex matches). A directory
    # may come in several listings.
    dir_layouts = [lay for lay in layouts if lay.entry_is_dir]
    entry_dirs: dict[str, _Group | None] = {}
    namespaces: dict[str, Namespace | None] = {}
    for listing in listings:
        directory, names, files, problems = listing
        if problems:
            _place_problems(directory, problems, groups, namespaces, warnings, dir_layouts)
        if progress is not None:
            before, count = count, count + len(files)
            if count // 5000 != before // 5000:
                progress(count)
        in_control = directory == CONTROL_DIR or directory.startswith(CONTROL_PREFIX)
        # Names hold no "/": a marker found in the joined names lies within one name.
        if TEMP_MARKER in "/".join(names):
            kept_names, kept_files = _without_temp_files(names, files, garbage)
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
            group = entry_dirs[directory] = _entry_dir_group(directory, dir_layouts, namespaces, groups)
        if group is not None:
            group.files.update(zip(names, files, strict=True))
        else:
            _group_each_file(files, layouts, groups, unclaimed)
    return groups, garbage, control


def _without_temp_files(names: list[str], files: list[FileInfo],
                        garbage: list[FileInfo]) -> tuple[list[str], list[FileInfo]]:
    """A listing's names and files without our temp files, which go to ``garbage``."""
    kept_names: list[str] = []
    kept_files: list[FileInfo] = []
    for name, info in zip(names, files, strict=True):
        if TEMP_MARKER in name:
            garbage.append(info)
        else:
            kept_names.append(name)
            kept_files.append(info)
    return kept_names, kept_files


def _entry_dir_group(directory: str, dir_layouts: list[Layout], namespaces: dict[str, Namespace | None],
                     groups: dict[str, _Group]) -> _Group | None:
    """The group of the entry ``directory`` is, for a layout whose entries are directories."""
    found = _locate_dir(directory, dir_layouts, namespaces)
    if found is None:
        return None
    # A listing's problem may have made the entry's group already.
    return groups.setdefault(found.path, _Group(found))


def _locate_dir(directory: str, dir_layouts: list[Layout], namespaces: dict[str, Namespace | None]
                ) -> Located | None:
    """The entry whose directory is ``directory``, in whichever layout claims it."""
    return next((got for lay in dir_layouts if (got := lay.locate_dir(directory, namespaces))), None)


def _group_each_file(files: list[FileInfo], layouts: list[Layout], groups: dict[str, _Group],
                     unclaimed: list[FileInfo]) -> None:
    """Place files one by one (layouts whose entries are files, or a directory no layout knows)."""
    for info in files:
        located = locate(info.path)
        if located is None:
            # Not an entry's, not a temp name of ours: another tool's or unknown. Kept.
            if not any(lay.is_runtime_file(info.path) for lay in layouts):
                unclaimed.append(info)
            continue
        other = groups.get(located.path)
        if other is None:
            other = groups[located.path] = _Group(located)
        other.files[located.name] = info


def _place_problems(directory: str, problems: tuple[tuple[str, str], ...], groups: dict[str, _Group],
                    namespaces: dict[str, Namespace | None], warnings: list[str] | None,
                    dir_layouts: list[Layout]) -> None:
    for name, reason in problems:
        path = f"{directory}/{name}" if directory else name
        # In an entry's directory, or the entry's directory itself, or (layout B) a file's entry.
        found = (_locate_dir(directory, dir_layouts, namespaces) or _locate_dir(path, dir_layouts, namespaces)
                 or locate(path))
        if found is None:
            if warnings is not None:
                warnings.append(f"{path}: {reason}")
            continue
        group = groups.get(found.path)
        if group is None:
            group = groups[found.path] = _Group(found)
        group.problems.append(f"{path}: {reason}")


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


def own_files(lay: Layout, entry: Entry) -> tuple[Entry | None, list[FileInfo]]:
    """The entry without the files in its directory that are not its (another tool's), and
    those files; None when none of its files is the runtime's or neffcache's (a directory that
    only looks like an entry: optimum-neuron's traced model, say). Files nested below an entry
    never reach an entry (no layout locates them): they are foreign too."""
    names = lay.foreign_names(entry)
    if not names:
        return entry, []
    foreign = [entry.files[n] for n in names if n in entry.files]
    files = {n: info for n, info in entry.files.items() if n not in names}
    if not files:
        return None, foreign
    return dataclasses.replace(entry, files=files, extra=()), foreign


def _scan(store: Store, started: float, *, prefix: str, read_manifests: bool, layout: str | None,
          progress: Progress | None, workers: int) -> ScanReport:
    foreign: list[FileInfo] = []
    warnings: list[str] = []
    groups, garbage, control = group_dirs(store.iter_dirs(prefix), progress, warnings, foreign=foreign)

    def build(group: _Group) -> tuple[Entry | None, list[FileInfo]]:
        lay = LAYOUTS[group.located.namespace.layout]
        manifest, error = (None, None)
        if read_manifests:
            name = lay.plan_entry(group.located.namespace, group.located.key).manifest_name
            if name in group.files:
                manifest, error = _read_manifest(store, group, name)
        entry = lay.classify(group.located, group.files, manifest, error)
        if group.problems:
            entry = dataclasses.replace(entry, state=EntryState.CORRUPT, committed=True,
                                        problems=(*entry.problems, *group.problems))
        return own_files(lay, entry)

    selected = [g for g in groups.values() if layout is None or g.located.namespace.layout == layout]
    if read_manifests and len(selected) > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            built = list(pool.map(build, selected))
    else:
        built = [build(g) for g in selected]
    entries = [e for e, _ in built if e is not None]
    for _, theirs in built:
        foreign.extend(theirs)
    entries.sort(key=lambda e: e.path)
    committed = [e for e in entries if e.committed]
    for e in committed:
        if e.state is EntryState.CORRUPT:
            warnings.append(f"{e.path}: {'; '.join(e.problems)}")
    return ScanReport(store.url, tuple(committed), tuple(sorted(garbage, key=lambda f: f.path)),
                      tuple(warnings), time.monotonic() - started, control,
                      tuple(e for e in entries if not e.committed),
                      tuple(sorted(foreign, key=lambda f: f.path)))


def load_entry(store: Store, path: str, *, read_manifest: bool = True) -> Entry | None:
    """One entry by its path (the listing of just its files), or None when nothing is there."""
    probe = next((got for lay in LAYOUTS.values() if (got := lay.locate_entry(path))), None)
    if probe is None:
        return None
    lay = LAYOUTS[probe.namespace.layout]
    if lay.entry_is_dir:
        infos = list(store.iter_files(probe.base))
    else:
        own = lay.names(probe.namespace, probe.key)
        names = dict.fromkeys(n for n in (own.hlo, own.flags, own.neff, own.manifest, own.marker) if n)
        infos = [i for n in names if (i := store.stat(f"{probe.base}/{n}" if probe.base else n))]
    groups, _, _ = group_files(infos)
    group = groups.get(probe.path)
    if group is None:
        return None
    plan = lay.plan_entry(group.located.namespace, group.located.key)
    manifest, error = (None, None)
    if read_manifest and plan.manifest_name in group.files:
        manifest, error = _read_manifest(store, group, plan.manifest_name)
    entry, _ = own_files(lay, lay.classify(group.located, group.files, manifest, error))
    return entry
