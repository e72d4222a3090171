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
import gc
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from neffcache.entry import Entry, EntryState, FileInfo, Namespace
from neffcache.errors import CorruptEntry, EntryNotFound, InvalidKey, ReadOnlyStore, StoreUnavailable, UnsafePath
from neffcache.layouts import LAYOUTS
from neffcache.manifest import Manifest, read_manifest
from neffcache.scan.grouping import Group, Progress, group_dirs, group_files, judge, own_files
from neffcache.stores.base import Store

log = logging.getLogger(__name__)
# How an entry's problem starts when its manifest could not be read at all (not: read and bad).
# verify reports such an entry FAILED (not checked), never CORRUPT: --fix must not move it.
UNREADABLE = "cannot read its manifest: "
# Re-exported: callers group files and split foreign ones with the scan's own rules.
__all__ = [
    "UNREADABLE",
    "NamespaceSummary",
    "Progress",
    "ScanReport",
    "entry_at",
    "group_dirs",
    "group_files",
    "load_entry",
    "own_files",
    "scan",
]


@dataclass(frozen=True)
class NamespaceSummary:
    namespace: Namespace
    entries: int
    size: int
    states: dict[str, int]

    def to_json(self) -> dict[str, object]:
        ns = self.namespace
        return {"layout": ns.layout, "path": ns.path, "compiler_version": ns.compiler_version, "target": ns.target,
                "lnc": ns.lnc, "entries": self.entries, "size": self.size, "states": self.states}


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
    # A runtime's own temp files outside any entry (TorchNeuron's writes in flight, or a dead
    # writer's): never garbage while young (Layout.runtime_debris_after says how old is dead).
    runtime_temp: tuple[FileInfo, ...] = ()
    # What the listing would not follow or could not read outside any entry (a symlinked or
    # unreadable namespace or top-level directory): parts of the store nothing was checked in.
    listing_problems: tuple[str, ...] = ()

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
            "namespaces": [s.to_json() for s in self.namespaces()],
            "garbage": {"files": len(self.garbage), "uncommitted_entries": len(self.uncommitted),
                        "size": self.garbage_size,
                        "paths": [g.path for g in self.garbage[:100]]
                        + [e.path for e in self.uncommitted[:100]]},
            "foreign": {"files": len(self.foreign), "size": self.foreign_size,
                        "paths": [f.path for f in self.foreign[:100]]},
            "runtime_temp": {"files": len(self.runtime_temp), "size": sum(f.size for f in self.runtime_temp),
                             "paths": [f.path for f in self.runtime_temp[:100]]},
            "warnings": list(self.warnings),
            "seconds": round(self.seconds, 3),
        }


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


def _read_manifest(store: Store, group: Group, manifest_name: str) -> tuple[Manifest | None, str | None]:
    """The entry's manifest, or why it is bad (CORRUPT). A manifest that cannot be read at
    all — a name no store path may have (``MODULE_1 (copy)+…``, bytes that are not UTF-8), a
    directory swapped for a symlink under us — is the entry's problem, reported as
    :data:`UNREADABLE` + why: read once more (a swap may be brief), then given up on, so
    nothing one entry's name or directory does ends the scan of the store. A listed manifest
    found missing is looked for once more too (a rename away may be as brief)."""
    path = f"{group.located.base}/{manifest_name}" if group.located.base else manifest_name
    listed = group.files.get(manifest_name)
    for attempt in (1, 2):
        try:
            return read_manifest(store, path, where=path, size=listed.size if listed else None), None
        except CorruptEntry as exc:
            return None, "; ".join(exc.problems)
        except (EntryNotFound, FileNotFoundError):
            if attempt == 2:  # listed, then gone twice: removed meanwhile, not a manifest's fault
                return None, None
        except (StoreUnavailable, ReadOnlyStore):
            raise  # every entry would fail the same way
        except InvalidKey as exc:
            return None, f"{UNREADABLE}{exc}"
        except UnsafePath as exc:  # a FIFO (or a link out of the root) swapped in since the listing
            if attempt == 2:
                return None, f"{UNREADABLE}{manifest_name}: {exc.reason}"
        except OSError as exc:
            if attempt == 2:
                return None, f"{UNREADABLE}{exc}"
    raise AssertionError("unreachable")  # pragma: no cover


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
    foreign: list[FileInfo] = []
    runtime_temp: list[FileInfo] = []
    warnings: list[str] = []
    groups, garbage, control = group_dirs(store.iter_dirs(prefix), progress, warnings, foreign=foreign,
                                          runtime_temp=runtime_temp)

    def build(group: Group) -> tuple[Entry | None, list[FileInfo]]:
        if not read_manifests:
            return judge(group)
        lay = LAYOUTS[group.located.namespace.layout]
        manifest, error = (None, None)
        name = lay.plan_entry(group.located.namespace, group.located.key).manifest_name
        if name in group.files:
            manifest, error = _read_manifest(store, group, name)
        return judge(group, manifest, error)

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
    # The listing's problems by path: the order of a listing is the store's (and a summary's
    # differs), the report's is not.
    warnings.sort()
    listing_problems = tuple(warnings)
    for e in committed:
        if e.state is EntryState.CORRUPT:
            warnings.append(f"{e.path}: {'; '.join(e.problems)}")
    return ScanReport(store.url, tuple(committed), tuple(sorted(garbage, key=lambda f: f.path)),
                      tuple(warnings), time.monotonic() - started, control,
                      tuple(e for e in entries if not e.committed),
                      tuple(sorted(foreign, key=lambda f: f.path)),
                      tuple(sorted(runtime_temp, key=lambda f: f.path)), listing_problems)


def load_entry(store: Store, path: str, *, read_manifest: bool = True) -> Entry | None:
    """One entry by its path (the listing of just its files), or None when nothing is there."""
    return entry_at(path, lambda base: list(store.iter_files(base)), store.stat,
                    store if read_manifest else None)


def entry_at(path: str, list_files: Callable[[str], Iterable[FileInfo]], stat: Callable[[str], FileInfo | None],
             manifests: Store | None = None) -> Entry | None:
    """The entry at ``path`` from its files as ``list_files`` (an entry directory) and ``stat``
    (the named files of a flat layout) see them now; its manifest read from ``manifests`` when
    given. One home for :func:`load_entry` and prune's re-listing through held descriptors."""
    probe = next((got for lay in LAYOUTS.values() if (got := lay.locate_entry(path))), None)
    if probe is None:
        return None
    lay = LAYOUTS[probe.namespace.layout]
    if lay.entry_is_dir:
        infos = list(list_files(probe.base))
    else:
        own = lay.names(probe.namespace, probe.key)
        names = dict.fromkeys(n for n in (own.hlo, own.flags, own.neff, own.manifest, own.marker) if n)
        infos = [i for n in names if (i := stat(f"{probe.base}/{n}" if probe.base else n))]
    groups, _, _ = group_files(infos)
    group = groups.get(probe.path)
    if group is None:
        return None
    manifest, error = (None, None)
    if manifests is not None:
        plan = lay.plan_entry(group.located.namespace, group.located.key)
        if plan.manifest_name in group.files:
            manifest, error = _read_manifest(manifests, group, plan.manifest_name)
    entry, _ = judge(group, manifest, error)
    return entry
