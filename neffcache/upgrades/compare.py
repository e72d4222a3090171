"""Compare an old compiler's graphs with their successors under a new one (``upgrade-report``).

Meant to run after a shadow ``neffcache rewarm`` into the new compiler's namespaces, while the
jobs still run the old one. Read-only: nothing is written to a store or reported to the index.

1. the old graphs: every SUCCESS entry of the old version's namespaces, each once, from the
   fastest store holding it (as ``rewarm`` reads them);
2. each one's successor, named as ``rewarm`` names it (:mod:`.successor`), looked up among the
   new version's entries in every store (SUCCESS in any store wins: a job reads through tiers).
   The flags form of each new namespace is decided as ``rewarm`` decides it, from the same
   stores in the same order, by the same code (``--flags-form`` forces one),
   and the report says per namespace which form and which rule;
3. its hits in the window, from the index (one paginated question per toolchain label), or
   none when no index is configured (every graph then weighs the same);
4. compile seconds from the manifests, NEFF bytes from the listings, and the failure log of a
   FAILED successor, reduced to its signature (:mod:`.signature`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from neffcache.entry import Entry, EntryState
from neffcache.errors import ConfigError, StoreError
from neffcache.index import Index
from neffcache.layouts import LAYOUTS, get_layout
from neffcache.layouts.flags_form import NamespaceForms
from neffcache.scan.report import scan
from neffcache.stores.base import Store
from neffcache.upgrades.report import Build, GraphComparison, UpgradeReport
from neffcache.upgrades.signature import MAX_LOG_BYTES, failure_signature
from neffcache.upgrades.successor import successor_of, version_prefixes
from neffcache.upgrades.versions import holds_any, missing_version_error

log = logging.getLogger(__name__)
Progress = Callable[[str], None]
DEFAULT_WINDOW = 30 * 86400.0
DEFAULT_THRESHOLD = 1.5
READ_WORKERS = 16
TARGET_UNKNOWN = "target unknown (a root the runtime filled): pass --instance"


@dataclass(frozen=True)
class UpgradeRequest:
    from_version: str
    to_version: str
    layouts: tuple[str, ...] = tuple(LAYOUTS)
    window_seconds: float = DEFAULT_WINDOW
    threshold: float = DEFAULT_THRESHOLD
    instance: str | None = None  # for roots the runtime filled without a target directory
    lnc: int | None = None
    now: float = field(default_factory=time.time)
    flags_form: str | None = None  # a flags form forced for the new namespaces (neuronxcc)

    def __post_init__(self) -> None:
        if self.from_version == self.to_version:
            raise ConfigError(f"--from and --to are both {self.to_version}: name the compiler the jobs run "
                              "now and the one to switch to")
        if not 0 < self.window_seconds < float("inf"):
            raise ConfigError(f"the window must be a positive duration, not {self.window_seconds!r}")
        if not 1.0 <= self.threshold < float("inf"):
            raise ConfigError(f"the threshold is a growth factor of at least 1 (1.5 = 50% more), "
                              f"not {self.threshold!r}")


Found = dict[str, tuple[Store, Entry]]


def compare(stores: Sequence[Store], index: Index, req: UpgradeRequest,
            progress: Progress | None = None) -> UpgradeReport:
    """The report of ``req.from_version``'s graphs against their successors in ``stores``.
    Raises ConfigError when the stores hold nothing of either version, or no SUCCESS entry of
    the old one (a typo in ``--from`` or ``--to`` must not read as "0% ready" or "nothing to do")."""
    say = progress or (lambda message: None)
    since, until = req.now - req.window_seconds, req.now
    report = UpgradeReport(req.from_version, req.to_version, [s.url for s in stores], (since, until),
                           req.threshold, hits_known=index.enabled)
    # Both versions first (a listing of their directories' first files): a typo fails before any
    # entry is read, naming the versions the stores hold.
    for version, option in ((req.from_version, "--from"), (req.to_version, "--to")):
        if not holds_any(stores, version_prefixes(req.layouts, version, instance=req.instance, lnc=req.lnc)):
            raise missing_version_error(version, option, stores, req.layouts)
    say(f"reading the entries of neuronx-cc {req.from_version} and {req.to_version} in "
        f"{', '.join(report.stores)}")
    old = _entries(stores, version_prefixes(req.layouts, req.from_version, instance=req.instance, lnc=req.lnc),
                   {EntryState.SUCCESS})
    if not old:
        raise ConfigError(f"no SUCCESS entries of neuronx-cc {req.from_version} in {', '.join(report.stores)}: "
                          "check --from and --store")
    new = _entries(stores, version_prefixes(req.layouts, req.to_version, instance=req.instance, lnc=req.lnc),
                   set(EntryState))
    # The same decision as rewarm's, by the same code on the same stores (its bounded listing).
    forms = NamespaceForms(stores, override=req.flags_form)
    hits = _hits(index, (entry for _, entry in old.values()), since, until, say)
    if not index.enabled:
        report.notes.append("no index configured: hits unknown, every graph weighs the same and every "
                            "missing graph counts as hot")
    say(f"naming the successors of {len(old)} graph(s)")
    # One small read per graph (its flags file; a failure log): I/O bound, so in parallel, as
    # scan reads manifests. The report keeps the paths' order whatever finishes first.
    def one(item: tuple[str, tuple[Store, Entry]]) -> GraphComparison:
        path, (store, entry) = item
        return _compare_one(store, entry, new, hits.get(path, 0), req, forms)

    with ThreadPoolExecutor(max_workers=READ_WORKERS, thread_name_prefix="neffcache-upgrade") as pool:
        report.graphs.extend(pool.map(one, sorted(old.items())))
    report.flags_forms = forms.decisions()
    report.notes += [note for decision in report.flags_forms for note in decision.notes]
    unknown = sum(1 for g in report.graphs if g.reason == TARGET_UNKNOWN)
    if unknown:
        report.notes.append(f"{unknown} graph(s) in a root without a target directory: rerun with --instance")
    return report


def _entries(stores: Sequence[Store], prefixes: Iterable[str], states: set[EntryState]) -> Found:
    """Entries in ``states`` under ``prefixes``, each path once: the fastest store's, except that a
    SUCCESS in a slower store wins over another state (a job reads through the tiers)."""
    found: Found = {}
    prefixes = list(prefixes)
    for store in stores:
        for prefix in prefixes:
            for entry in scan(store, prefix=prefix, read_manifests=True).entries:
                if entry.state not in states:
                    continue
                held = found.get(entry.path)
                if held is None or (held[1].state is not EntryState.SUCCESS and entry.state is EntryState.SUCCESS):
                    found[entry.path] = (store, entry)
    return found


def _hits(index: Index, entries: Iterable[Entry], since: float, until: float, say: Progress) -> dict[str, int]:
    """Hits per entry path in the window, asked once per toolchain label the entries carry (the
    label the runtime's events were reported with)."""
    if not index.enabled:
        return {}
    labels = sorted({tc.namespace_dir for entry in entries if (tc := entry.toolchain) is not None})
    found: dict[str, int] = {}
    for label in labels:
        say(f"asking the index for hits of {label}")
        for path, count in index.usage_hits(label, since=since, until=until).items():
            found[path] = found.get(path, 0) + count
    return found


def _compare_one(store: Store, entry: Entry, new: Found, hits: int, req: UpgradeRequest,
                 forms: NamespaceForms) -> GraphComparison:
    old = _build(store, entry)
    try:
        successor = successor_of(store, entry, req.to_version, forms, instance=req.instance, lnc=req.lnc,
                                 trust_manifest=True)
    except (ValueError, StoreError) as exc:  # per graph: the report goes on with the rest
        return GraphComparison(old, hits, reason=f"its name under {req.to_version} cannot be computed: {exc}")
    if successor is None:
        return GraphComparison(old, hits, reason=TARGET_UNKNOWN)
    held = new.get(successor.path)
    return GraphComparison(old, hits, successor.path, _build(*held) if held is not None else None)


def _build(store: Store, entry: Entry) -> Build:
    layout = get_layout(entry.layout)
    neff = layout.neff_of(entry)
    info = entry.files.get(neff) if neff is not None and entry.state is EntryState.SUCCESS else None
    seconds = entry.manifest.compile_seconds if entry.manifest is not None else None
    failure = _failure(store, entry) if entry.state is EntryState.FAILED else None
    return Build(entry.path, store.url, entry.state, seconds, info.size if info is not None else None, failure)


def _failure(store: Store, entry: Entry) -> str:
    layout = get_layout(entry.layout)
    name = layout.failure_log_of(entry)
    if name is None:
        return "(no failure log)"
    try:
        with store.open_read(entry.store_path(name)) as stream:
            # The compiler's text, without the runtime's "Failed compilation with [<command>]:".
            return failure_signature(layout.read_failure_log(stream.read(MAX_LOG_BYTES)).output.encode())
    except (StoreError, OSError) as exc:
        log.warning("could not read %s in %s: %s", name, store.url, exc)
        return f"(failure log unreadable: {exc})"
