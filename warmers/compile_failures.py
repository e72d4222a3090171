"""What the compile pool does with a compile that failed: judge it, retry it, or record it.

The pool knows how its compiler ended (exit status, signal, timeout, whether it started at
all) and what it printed, so its verdict (:func:`neffcache.failures.classify_exit`) is the
best one anyone gets:

- an **environment** failure (killed, out of memory, timed out, compiler missing or unable
  to start, a shared library missing, a full disk) is retried in the same run, at most
  :data:`ENV_RETRIES` more times, after :data:`RETRY_BACKOFF` seconds doubling each time (the
  job waits in the pool's deferred list: it holds no worker and no lease meanwhile). A
  timeout is not retried in the run (it would cost the same timeout again on the same host)
  but, like every environment failure, it leaves **no** failure log, in no store: the next
  run compiles the graph again without ``--retry-failed``. The index still hears of it
  (an ``error`` event whose message carries neffcache's note with the verdict), so
  ``neffcache failures`` shows a host that keeps failing;
- a **compiler error** is recorded the way the runtime records it (neuronxcc's failure log, in
  the runtime's own form with the command the compiler got), followed by neffcache's note
  with the verdict and the error's signature, in the work store and the coordinator; every
  later run skips the graph until ``--retry-failed`` or the failure TTL (``failed_ttl``).

A failure log found before compiling stands (:func:`standing_reason`) only when it is a
compiler error younger than the TTL, or one this very run recorded.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from neffcache.entry import EntryState
from neffcache.events import EventKind
from neffcache.failures import NOTE_PREFIX, FailureCause, Verdict, classify_exit, signed_text
from neffcache.layouts import get_layout
from neffcache.operations.failed import read_failed
from neffcache.scan.report import load_entry
from neffcache.stores.base import FileSource

from .compile_jobs import CompileJob, CompileOutcome
from .placement import Placement
from .report import CompileStatus

ENV_RETRIES = 2  # more compiles of a graph after an environment failure, in the same run
RETRY_BACKOFF = 2.0  # seconds before the first retry; doubled for each next one
_MAX_BACKOFF = 60.0
TAIL = 4000  # characters of compiler output kept for the log, the report and the index


@dataclass(frozen=True)
class CompileRun:
    """How one compiler process ended: ``status`` None when it was stopped past the timeout;
    ``start_error`` when it could not be started at all."""

    status: int | None
    output: str
    start_error: OSError | None = None


@dataclass(frozen=True)
class FailedCompile:
    verdict: Verdict
    signature: str
    text: str  # the compiler's output (its tail) and neffcache's note


def judge(run: CompileRun) -> FailedCompile:
    """The verdict on a compile that produced no NEFF, with its signed text."""
    err = run.start_error
    verdict = classify_exit(run.status, run.output, timed_out=run.status is None and err is None,
                            start_errno=err.errno if err is not None else None,
                            start_error=(err.strerror or str(err)) if err is not None else "")
    if run.status == 0 and not verdict.is_environment:
        verdict = Verdict(verdict.cause, "neuronx-cc exited 0 but wrote no NEFF")
    sig, text = signed_text(verdict, run.output[-TAIL:])
    return FailedCompile(verdict, sig, text)


def retry_delay(attempt: int, backoff: float = RETRY_BACKOFF) -> float:
    """Seconds to wait before compile number ``attempt + 1`` of a graph (``attempt`` >= 1)."""
    return float(min(_MAX_BACKOFF, backoff * 2.0 ** (attempt - 1)))


def retryable(outcome: CompileOutcome) -> bool:
    """An environment failure the same run may try again (not a timeout: see the module)."""
    verdict = outcome.verdict
    return verdict is not None and verdict.is_environment and verdict.cause is not FailureCause.TIMEOUT


def failure_outcome(job: CompileJob, run: CompileRun, failed: FailedCompile, seconds: float,
                    timeout: float | None) -> CompileOutcome:
    """The outcome a report shows for a failed compile."""
    verdict = failed.verdict
    if verdict.cause is FailureCause.TIMEOUT:
        status = CompileStatus.TIMEOUT
        reason = f"compile timed out after {timeout:g}s (killed); not cached: the next run compiles it again"
    elif verdict.is_environment:
        status = CompileStatus.ENVIRONMENT
        reason = f"environment ({verdict.cause}): {verdict.detail}; not cached: the next run compiles it again"
    else:
        status = CompileStatus.FAILED
        code = "" if run.status is None else f"neuronx-cc exited {run.status}: "
        reason = f"{code}{summary(run.output) if run.output.strip() else verdict.detail} (signature {failed.signature})"
    return CompileOutcome(job, status, seconds, reason=reason, verdict=verdict, signature=failed.signature)


def record_compiler_error(placement: Placement, job: CompileJob, files: Mapping[str, FileSource],
                          command: list[str], failed: FailedCompile) -> None:
    """Record a compiler error as the runtime would (neuronxcc's failure log), in the work store
    and the coordinator, and register the FAILED entry with the index: a failed entry the
    index does not know of is one its dashboard and stats call healthy. Never called for an
    environment failure."""
    layout = get_layout(job.namespace.layout)
    log_name = layout.names(job.namespace, job.key).failure_log
    if log_name is None or failed.verdict.is_environment:
        return  # the native runtime does not cache failures: neither do we
    data = layout.failure_log_bytes(command, failed.text)
    stores = list(dict.fromkeys([placement.work, placement.coordinator]))
    for store in stores:
        # HLO and flags first, the log last: the entry reads as FAILED only once whole.
        for name, source in files.items():
            if store.stat(f"{job.path}/{name}") is None:
                store.put_file(f"{job.path}/{name}", source)
        store.put_file(f"{job.path}/{log_name}", data)
    placement.register_failed(job.path, stores)


def report_error(placement: Placement, job: CompileJob, failed: FailedCompile) -> None:
    """Tell the index (an ``error`` event: the text ends with neffcache's note, so the tail
    the event keeps carries the verdict and the signature)."""
    placement.event(EventKind.ERROR, job.path, job.namespace, message=failed.text[-TAIL:], tags=job.tags)


def standing_reason(placement: Placement, job: CompileJob, *, retry_failed: bool, started_at: float,
                    failed_ttl: float | None) -> str | None:
    """Why ``job`` must not be compiled because of a recorded failure, or None.

    A failure stands when it is a compiler error this run recorded (never compiled twice in one
    run, even with ``--retry-failed``), or a compiler error younger than ``failed_ttl`` when
    ``--retry-failed`` is not given. An environment failure (a runtime wrote it: Ctrl-C, an OOM
    kill) never stands."""
    layout = get_layout(job.namespace.layout)
    if layout.names(job.namespace, job.key).failure_log is None:
        return None
    now = time.time()
    for store in dict.fromkeys([placement.work, placement.coordinator]):
        entry = load_entry(store, job.path, read_manifest=False)
        if entry is None or entry.state is not EntryState.FAILED:
            continue
        failed = read_failed(store, entry)
        if failed is None or failed.verdict.is_environment:
            continue
        fresh = failed.failed_at >= started_at
        if fresh or (not retry_failed and failed.stands(now, failed_ttl)):
            hint = "" if fresh else (" (cached compiler error; --retry-failed compiles it again"
                                     + (f", as does the failure TTL of {failed_ttl:g}s" if failed_ttl else "") + ")")
            return f"{summary(failed.text)} (signature {failed.signature}){hint}"
    return None


def summary(text: str) -> str:
    """The compiler's first error line (or its last line), for a report."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(NOTE_PREFIX)]
    errors = [ln for ln in lines if "ERROR" in ln or "error" in ln]
    return (errors[0] if errors else lines[-1] if lines else "no output")[:300]
