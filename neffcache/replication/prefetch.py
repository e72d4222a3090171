"""``neffcache prefetch``: the entries a job will need, from the shared tiers to a node-local one.

A pod that reads its NEFFs off the shared mount pays seconds per start and, on FSx for Lustre,
meets ``Errno 61`` when many readers copy the same file; one that compiles because the cache
sits where its runtime cannot use it pays minutes (aws-neuron-sdk#1368). A prefetch before the
job starts (an init container, a job's first step) copies what it needs to local disk, where
the runtime then finds it. What it promises:

- *verified before visible*: every entry goes through
  :func:`~neffcache.operations.ingest.transfer` (the bytes published are the bytes hashed,
  checked against the source's manifest before the commit marker), and first through the
  reader's trust policy (:class:`~neffcache.trust.TrustPolicy`: a refused entry is reported,
  never copied); a half copy is never visible, so a rerun is incremental and idempotent;
- *the job's entries, most useful first*: the toolchain's namespaces in every layout (narrowed
  by the paths a report or a plan names, or by manifest tags), in order of last use (the
  index's record, else the stores' stamps, else newest first), within ``max_bytes`` and
  ``deadline`` (no copy starts after it; those under way finish: a job starting sooner beats
  one more entry, and nothing is left half-done);
- *in the runtime's local form*: a runtime with a node-local tier of its own shape (vLLM's
  ``neuron/compile_cache/<hash>``) gets its entries there (``transfer(local=True)``);
- *transient read failures retried*: FSx's ``ENODATA``, a stale NFS handle, a store that is
  briefly unavailable (S3's own throttling and 5xx retries are the S3 store's) get
  ``retries`` more attempts with backoff; an entry that still fails is reported and skipped.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from neffcache.entry import Entry, EntryState, Namespace
from neffcache.errors import (
    CorruptEntry,
    EntryNotFound,
    PlaceholderNeff,
    SourceChanged,
    StoreUnavailable,
    UntrustedEntry,
)
from neffcache.layouts import entry_forms, get_layout
from neffcache.layouts.records import Located
from neffcache.manifest import Manifest, read_manifest
from neffcache.operations import claims
from neffcache.operations.ingest import transfer
from neffcache.outcomes import PublishStatus
from neffcache.scan.report import scan
from neffcache.stores.base import Store
from neffcache.trust import TrustPolicy, Verdict

log = logging.getLogger(__name__)
Progress = Callable[[int, int, int], None]  # (entries done, entries planned, bytes copied)
# Read errors worth another attempt: FSx for Lustre's ENODATA under many readers (the SDK's
# release notes), a stale NFS handle, an interrupted or timed-out read.
TRANSIENT_ERRNOS = frozenset({errno.ENODATA, errno.ESTALE, errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT})


@dataclass(frozen=True)
class PrefetchRequest:
    namespaces: tuple[Namespace, ...]  # the job's toolchain in every layout
    paths: frozenset[str] | None = None  # only these entries (any of their forms)
    tags: Mapping[str, str] = field(default_factory=dict)  # only entries whose manifest has these
    max_bytes: int | None = None
    deadline: float | None = None  # seconds from the start: no copy starts after it
    parallel: int = 8
    retries: int = 3
    backoff: float = 0.5  # seconds before the first retry, doubled each time
    policy: TrustPolicy = field(default_factory=TrustPolicy)


@dataclass(frozen=True)
class Fetched:
    path: str
    store: str
    bytes: int = 0
    detail: str = ""


@dataclass
class PrefetchReport:
    dst: str
    sources: tuple[str, ...]
    planned: int = 0
    copied: list[Fetched] = field(default_factory=list)
    present: int = 0  # already in the local tier (a rerun's)
    refused: list[Fetched] = field(default_factory=list)  # by the trust policy
    failed: list[Fetched] = field(default_factory=list)
    over_budget: list[Fetched] = field(default_factory=list)  # left out by max_bytes
    after_deadline: list[Fetched] = field(default_factory=list)  # left out by the deadline
    unsigned: int = 0  # admitted without a trusted signature (reported, not refused)
    seconds: float = 0.0

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.copied)

    @property
    def ok(self) -> bool:
        return not self.failed and not self.refused

    def to_json(self) -> dict[str, Any]:
        def rows(items: list[Fetched]) -> list[dict[str, Any]]:
            return [{"path": f.path, "store": f.store, "bytes": f.bytes, "detail": f.detail} for f in items[:1000]]

        return {"dst": self.dst, "sources": list(self.sources), "planned": self.planned,
                "copied": len(self.copied), "present": self.present, "bytes": self.bytes,
                "refused": rows(self.refused), "failed": rows(self.failed),
                "over_budget": len(self.over_budget), "after_deadline": len(self.after_deadline),
                "unsigned": self.unsigned, "seconds": round(self.seconds, 3), "ok": self.ok,
                "copied_paths": [f.path for f in self.copied[:1000]]}


@dataclass(frozen=True)
class _Candidate:
    store: Store
    entry: Entry
    last_used: float


def prefetch(sources: Sequence[Store], dst: Store, req: PrefetchRequest, *,
             usage: Mapping[str, float] | None = None, progress: Progress | None = None) -> PrefetchReport:
    """Copy the job's entries from ``sources`` (fastest first) into the node-local ``dst``.
    ``usage``: entry path -> last use (the index's); without it, each source's stamps."""
    started = time.monotonic()
    report = PrefetchReport(dst.url, tuple(s.url for s in sources))
    todo = _plan(sources, dst, req, usage, report)
    _copy_all(todo, dst, req, report, started, progress)
    report.seconds = time.monotonic() - started
    return report


def _plan(sources: Sequence[Store], dst: Store, req: PrefetchRequest, usage: Mapping[str, float] | None,
          report: PrefetchReport) -> list[_Candidate]:
    """What to copy, most recently used first, within the byte budget."""
    have = {form for entry in _listed(dst, req.namespaces) for form in entry_forms(entry.path)}
    wanted = None if req.paths is None else {form for p in req.paths for form in entry_forms(p)}
    seen: set[str] = set()
    found: list[_Candidate] = []
    for store in sources:
        used = dict(usage) if usage is not None else _stamps(store)
        for entry in _listed(store, req.namespaces):
            forms = entry_forms(entry.path)
            if entry.state is not EntryState.SUCCESS or seen.intersection(forms):
                continue
            if wanted is not None and not wanted.intersection(forms):
                continue
            seen.update(forms)
            if have.intersection(forms):
                report.present += 1
                continue
            found.append(_Candidate(store, entry, max((used.get(f, 0.0) for f in forms), default=0.0)))
    found.sort(key=lambda c: (-c.last_used, -c.entry.mtime, c.entry.path))
    return _within_budget(found, req.max_bytes, report)


def _within_budget(found: list[_Candidate], max_bytes: int | None, report: PrefetchReport) -> list[_Candidate]:
    """The most useful entries that fit ``max_bytes``: a big one that does not fit is left out
    and a smaller, less recently used one after it may still go."""
    if max_bytes is None:
        report.planned = len(found)
        return found
    todo, left = [], max_bytes
    for cand in found:
        if cand.entry.size <= left:
            todo.append(cand)
            left -= cand.entry.size
        else:
            report.over_budget.append(Fetched(cand.entry.path, cand.store.url, cand.entry.size, "over --max-bytes"))
    report.planned = len(todo)
    return todo


def _listed(store: Store, namespaces: Collection[Namespace]) -> list[Entry]:
    out: list[Entry] = []
    for ns in namespaces:
        out.extend(e for e in scan(store, prefix=ns.path).entries if e.namespace.path == ns.path)
    return out


def _stamps(store: Store) -> dict[str, float]:
    from neffcache.coordination.stamps import last_used
    try:
        return last_used(store)
    except (OSError, StoreUnavailable) as exc:  # no stamps: newest first instead
        log.info("no last-use stamps from %s: %s", store.url, exc)
        return {}


def _copy_all(todo: list[_Candidate], dst: Store, req: PrefetchRequest, report: PrefetchReport, started: float,
              progress: Progress | None) -> None:
    lock = threading.Lock()
    done = [0]

    def one(cand: _Candidate) -> None:
        if req.deadline is not None and time.monotonic() - started >= req.deadline:
            with lock:
                report.after_deadline.append(Fetched(cand.entry.path, cand.store.url, cand.entry.size, "deadline"))
            return
        kind, fetched = _fetch(cand, dst, req)
        with lock:
            getattr(report, kind).append(fetched)
            if kind == "copied" and fetched.detail == "unsigned":
                report.unsigned += 1
            done[0] += 1
            if progress is not None:
                progress(done[0], len(todo), report.bytes)

    with ThreadPoolExecutor(max(1, req.parallel), thread_name_prefix="neffcache-prefetch") as pool:
        for future in [pool.submit(one, c) for c in todo]:
            future.result()


def _fetch(cand: _Candidate, dst: Store, req: PrefetchRequest) -> tuple[str, Fetched]:
    """('copied' | 'refused' | 'failed', what happened) for one entry, with retries."""
    entry, src = cand.entry, cand.store
    delay = req.backoff
    for attempt in range(req.retries + 1):
        try:
            manifest = _manifest(src, entry)
            judged = entry if manifest is None else _with(entry, manifest)
            admission = claims.admission(req.policy, src.url, judged)
            if admission.refused:
                return "refused", Fetched(entry.path, src.url, entry.size, admission.detail)
            if manifest is not None and req.tags and not all(manifest.tags.get(k) == v for k, v in req.tags.items()):
                return "refused", Fetched(entry.path, src.url, 0, "its tags do not match")
            # A trn1 NEFF in a trn2 namespace is refused on the verified copies, before it lands.
            result = transfer(src, judged, dst, known_absent=True, local=True, vet=claims.contradiction)
            detail = "" if admission.verdict is Verdict.SIGNED else str(admission.verdict)
            if result.status is PublishStatus.BUSY:
                return "failed", Fetched(entry.path, src.url, 0, "busy: another writer holds it; rerun")
            return "copied", Fetched(entry.path, src.url, result.bytes or entry.size, detail)
        except UntrustedEntry as exc:
            return "refused", Fetched(entry.path, src.url, entry.size, "; ".join(exc.problems))
        except (PlaceholderNeff, CorruptEntry) as exc:
            return "failed", Fetched(entry.path, src.url, 0, f"not copied: {'; '.join(exc.problems)}")
        except (SourceChanged, EntryNotFound) as exc:
            return "failed", Fetched(entry.path, src.url, 0, f"changed or vanished at the source: {exc}")
        except (StoreUnavailable, OSError) as exc:
            if not _transient(exc) or attempt == req.retries:
                return "failed", Fetched(entry.path, src.url, 0, f"{type(exc).__name__}: {exc}")
            log.info("prefetch of %s from %s: %s; retrying in %.1fs", entry.path, src.url, exc, delay)
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")  # pragma: no cover


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, StoreUnavailable):
        return True
    return isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS


def _manifest(store: Store, entry: Entry) -> Manifest | None:
    """The entry's manifest, checked against its listing (every recorded file there at its
    recorded size, the payload covered); CorruptEntry otherwise. None: it has none."""
    if not entry.has_manifest:
        return None
    listed = entry.files.get(entry.manifest_name)
    where = f"{store.url}/{entry.path}"
    manifest = read_manifest(store, entry.store_path(entry.manifest_name), where=where,
                             size=listed.size if listed is not None else None)
    located = Located(entry.namespace, entry.key, entry.path, entry.base, "")
    problems = get_layout(entry.layout).manifest_problems(entry.files, manifest, located)
    if problems:
        raise CorruptEntry(where, problems)
    return manifest


def _with(entry: Entry, manifest: Manifest) -> Entry:
    return dataclasses.replace(entry, manifest=manifest)
