"""Failures a runtime recorded itself, in a one-phase warm-up: judged, and cleared when they
do not stand.

In a one-phase warm-up the runtime compiles and, when a compile fails, writes its failure log
(neuronxcc's ``model.log``) whatever the cause: Ctrl-C, an OOM kill and a missing library leave
one just like a compiler error (docs/runtimes.md), and every later run of every job sharing
the root then skips the graph. neffcache reads each such log through the layout and judges it
(:mod:`neffcache.failures`). A log that does not stand (an environment failure, or a compiler
error older than the failure TTL) is **removed**, so the graph is an EMPTY entry again and the
runtime compiles it on its next lookup. Before each warm-up every such log in the work
namespaces is cleared; after each bucket, those the bucket's own run left; after a job under
``neffcache run``, those the job left (a production job's OOM-killed compile must not make every
later job skip the graph).

Why remove the log rather than pass the runtime its retry flag
(``--retry_failed_compilation``): the flag is global to the process, so it would recompile
every cached failure of the namespace, real compiler errors included (an hour each, to fail
again), while the log's existence is the runtime's only per-graph record. Why it is safe:
the runtime writes (and reads) the log while it holds the entry's compile lock, the
existence-based ``model.hlo_module.pb.lock``; neffcache takes that same lock
(:class:`~.runtime_lock.RuntimeLock`, created exclusively) and, holding it, checks that the log
is still the one it judged (same mtime and size) before removing it. A runtime that holds
the lock is compiling the graph and will record the outcome itself: that entry is left
alone. Only the log is removed: HLO and flags stay, and nothing of neffcache's is written.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from neffcache.entry import EntryState, Namespace
from neffcache.events import EventKind
from neffcache.failures import FailureCause, note
from neffcache.layouts import get_layout
from neffcache.operations.failed import FailedGraph, failed_graphs, read_failed
from neffcache.scan.report import load_entry, scan
from neffcache.stores.base import Store

from .logscan import LogEvent
from .placement import Placement
from .report import FailureKind, GroupReport, GroupStatus, WarmReport
from .runtime_lock import RuntimeLock
from .watchdog import CompileWatchdog
from .workload import WorkloadRun

log = logging.getLogger(__name__)


def clear_failure(store: Store, failed: FailedGraph) -> bool:
    """Remove ``failed``'s failure log under the runtime's compile lock (see the module
    docstring); False when the entry is left as it is (a runtime holds the lock, the log
    changed, or the store is not a directory a runtime shares)."""
    entry = failed.entry
    lock_name = get_layout(entry.layout).names(entry.namespace, entry.key).runtime_lock
    lock_path = store.local_path(entry.store_path(lock_name)) if lock_name else None
    if lock_path is None:
        return False
    held = RuntimeLock.acquire(lock_path)
    if held is None:
        return False
    with held:
        log_path = entry.store_path(failed.log_name)
        now = store.stat(log_path)
        judged = entry.files[failed.log_name]
        if now is None or (now.mtime, now.size) != (judged.mtime, judged.size):
            return False
        store.delete([log_path])
    log.info("%s: cleared its failure log (%s: %s): the runtime compiles it again", failed.path,
             failed.verdict.cause, failed.verdict.detail)
    return True


def clear_failures(store: Store, namespaces: Sequence[Namespace], *, ttl: float | None,
                       now: float | None = None) -> list[FailedGraph]:
    """Before a warm-up: clear every failure log in ``namespaces`` of the work store that does
    not stand (environment, or older than ``ttl``). Returns the failures cleared."""
    now = time.time() if now is None else now
    cleared = []
    for ns in namespaces:
        if get_layout(ns.layout).names(ns, "probe").failure_log is None:
            continue  # this runtime caches no failures
        entries = [e for e in scan(store, prefix=ns.path).entries if e.state is EntryState.FAILED]
        for failed in failed_graphs(store, entries):
            if not failed.stands(now, ttl) and clear_failure(store, failed):
                cleared.append(failed)
    return cleared


class Judgement(NamedTuple):
    failures: dict[str, FailedGraph]  # by entry path: every failure found, judged
    cleared: list[str]  # the paths whose failure log was removed


def judge_bucket(store: Store, paths: Sequence[str], *, ttl: float | None) -> Judgement:
    """After a bucket (or a job under ``neffcache run``): the failures its runtime recorded for
    ``paths`` (or found cached), each judged; those that do not stand are cleared at once (a job
    sharing the root must not skip a graph the host, not the compiler, failed)."""
    now = time.time()
    judged: dict[str, FailedGraph] = {}
    cleared: list[str] = []
    for path in paths:
        entry = load_entry(store, path, read_manifest=False)
        failed = read_failed(store, entry) if entry is not None else None
        if failed is None:
            continue
        judged[path] = failed
        if not failed.stands(now, ttl) and clear_failure(store, failed):
            cleared.append(path)
    return Judgement(judged, cleared)


def _excerpt(line: str) -> str:
    text = re.sub(r"^\S+ \S+:\s+\d+\s+", "", line.strip())  # the wrapper's timestamp and pid
    # The wrapper repeats the whole compiler command line; the entry path already says which.
    text = re.sub(r"\[(?:'[^']*'(?:, )?){4,}\]", "[...]", text)
    return text[:400]


def _kind_and_reason(event: LogEvent, failed: FailedGraph | None) -> tuple[FailureKind, str, str]:
    """(kind, reason, signature) a report lists for one failure line of the runtime."""
    if failed is None:
        return FailureKind.COMPILE, _excerpt(event.line), ""
    verdict = failed.verdict
    if not verdict.is_environment:
        return FailureKind.COMPILE, f"{_excerpt(event.line)} (signature {failed.signature})", failed.signature
    kind = FailureKind.TIMEOUT if verdict.cause is FailureCause.TIMEOUT else FailureKind.ENVIRONMENT
    return kind, (f"environment ({verdict.cause}): {verdict.detail}; the runtime's failure log was cleared: "
                  "the next run compiles it again"), failed.signature


def record_runtime_failures(placement: Placement, run: WorkloadRun, row: GroupReport, unfinished: list[LogEvent],
                            judged: dict[str, FailedGraph], ns_of: Callable[[str | None], Namespace],
                            ns_at: Callable[[str | None], Namespace], *, native_only: bool) -> None:
    """Name each failed graph of a bucket in its row (with its verdict and signature) and
    report it to the index, once per graph."""
    reported: set[str] = set()
    for event in [] if native_only else run.counter.failure_lines():
        what = event.entry or "graph"
        failed = judged.get(event.entry) if event.entry else None
        if not any(f.what == what for f in row.failures):
            kind, reason, sig = _kind_and_reason(event, failed)
            row.fail(what, kind, reason, signature=sig)
        if event.entry is not None and event.entry in reported:
            continue
        reported.add(what)
        message = (f"{failed.text.rstrip()}\n{note(failed.verdict, failed.signature)}" if failed is not None
                   else event.line)
        placement.event(EventKind.ERROR, event.entry, ns_of(event.entry), message=message[-4000:])
    for event in unfinished:
        # No failure line (TorchNeuron raises): the run exited non-zero while compiling it.
        what = event.entry or event.key or "graph"
        said = next((line for line in reversed(run.tail) if what in line and line is not event.line),
                    next((line for line in reversed(run.tail) if line.strip()), "no output")).strip()
        row.fail(what, FailureKind.COMPILE, f"the runtime exited {row.exit_code} while compiling it: {said[:400]}")
        placement.event(EventKind.ERROR, event.entry, ns_at(event.namespace), message=said[-4000:])
    for path in judged:  # those still FAILED (a standing compiler error): the index's health counts them
        placement.register_failed(path, [placement.work])
    if row.failed:
        row.worsen(GroupStatus.FAILED)


def mark_timeouts(watchdog: CompileWatchdog, runs: Sequence[WorkloadRun], report: WarmReport) -> None:
    """Say "timeout" for the graphs whose compiler the watchdog killed (not "compile error").

    The killed compiler's input path is in the runtime's compile-call line, which names the
    entry (neuronxcc, even from a work directory). A runtime that logs no compile call
    (TorchNeuron) leaves its timeouts reported as compile failures."""
    for killed in watchdog.killed:
        if not killed.input:
            continue
        event = next((e for run in runs if (e := run.counter.line_naming(killed.input))), None)
        if event is None or event.entry is None:
            continue
        for failure in report.failures:
            if failure.what == event.entry:
                failure.kind = FailureKind.TIMEOUT
                failure.reason = (f"compile killed after {killed.seconds:.0f}s "
                                  f"(--compile-timeout {watchdog.timeout:g}s); runtime said: {failure.reason}")
