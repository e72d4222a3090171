"""neffcache's own compile pool: pending HLOs in, published entries out.

Used by the two-phase warm-up (graphs extracted by the workload, compiled here) and by
``rewarm`` (HLOs of an old compiler's entries, compiled with the new one). Per graph:

1. if any tier already holds the entry, it is a hit (copied into the work store if needed);
2. the source entry's flags file must back its key (neuronxcc: it hashes to the ``+<suffix>``
   of its MODULE name); if not, the graph is refused and reported, never compiled: the NEFF
   would be published under a key that says other flags;
3. take the lease ``compile:<entry path>`` in the coordinator store. Held by someone else
   (another shard, another host) means: come back later, when it will most likely be a hit,
   or the holder died and its lease can be taken over;
4. take the runtime's own compile lock in the work store (neuronxcc's
   ``model.hlo_module.pb.lock``, see :mod:`.runtime_lock`), so a runtime sharing the root
   waits for our NEFF instead of compiling it too; if a runtime holds it, come back later;
5. compile with ``neuronx-cc`` in its own process group, under a timeout, in a staging
   directory of the work store, while the memory gate says another compile fits;
6. publish the entry, manifest first and marker last, to every writable tier (the work store
   still under the runtime lock); register it in the index and send the events. A failed
   compile is judged (:mod:`.compile_failures`): a compiler error is recorded the way the
   runtime records it (neuronxcc: ``model.log`` beside the HLO, so runtimes and
   ``--retry-failed`` agree on it) with its signature; an environment failure (killed, out of
   memory, timed out, compiler missing) is retried with backoff and never recorded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path

from neffcache.coordination.lease import StoreLease, try_acquire
from neffcache.errors import EntryNotFound
from neffcache.events import EventKind
from neffcache.layouts import get_layout, locate
from neffcache.operations.ingest import build_manifest
from neffcache.operations.publish import publish
from neffcache.scan.report import load_entry
from neffcache.stores.base import FileSource

from .children import Children
from .compile_failures import (
    ENV_RETRIES,
    RETRY_BACKOFF,
    TAIL,
    CompileRun,
    failure_outcome,
    judge,
    record_compiler_error,
    report_error,
    retry_delay,
    retryable,
    standing_reason,
)
from .compile_jobs import CompileJob, CompileOutcome, record_outcome
from .memory import MemoryGate
from .placement import Placement
from .report import CompileStatus
from .runtime_lock import RuntimeLock, lock_age

# CompileJob, CompileOutcome and record_outcome live in .compile_jobs; callers import them here.
__all__ = ["LEASE_TTL", "RUNTIME_LOCK_PATIENCE", "CompileJob", "CompileOutcome", "CompilePool", "record_outcome"]

log = logging.getLogger(__name__)
LEASE_TTL = 120.0
# How long a runtime's compile lock is waited on before the graph is reported instead: the
# runtime itself waits forever, which is the stale-lock trap (prune removes stale locks).
RUNTIME_LOCK_PATIENCE = 3600.0
_STAGED_NEFF = "compiled.neff"  # our staging name; the entry's own name comes from the layout


@dataclass
class CompilePool:
    placement: Placement
    compiler: Path
    children: Children
    parallel: int = 1
    timeout: float | None = None
    memory: MemoryGate = field(default_factory=MemoryGate)
    retry_failed: bool = False
    started_at: float = field(default_factory=time.time)
    lease_ttl: float = LEASE_TTL
    runtime_lock_patience: float = RUNTIME_LOCK_PATIENCE
    on_done: Callable[[CompileOutcome], None] | None = None
    # A compiler error older than this (seconds) no longer stands: a fixed compiler gets another chance.
    failed_ttl: float | None = None
    env_retries: int = ENV_RETRIES  # more compiles of a graph after an environment failure
    retry_backoff: float = RETRY_BACKOFF  # seconds before the first of them, doubled after

    def __post_init__(self) -> None:
        self._queue: deque[CompileJob] = deque()
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def add(self, jobs: Sequence[CompileJob]) -> None:
        """Queue more jobs (from any thread) while :meth:`drain` runs; duplicates are dropped."""
        with self._lock:
            for job in jobs:
                if job.path not in self._seen:
                    self._seen.add(job.path)
                    self._queue.append(job)

    def close(self) -> None:
        """No more jobs will come: :meth:`drain` returns once the queued ones are done."""
        self._closed.set()

    def run(self, jobs: Sequence[CompileJob]) -> list[CompileOutcome]:
        self.add(jobs)
        self.close()
        return self.drain()

    def _next(self) -> CompileJob | None:
        with self._lock:
            return self._queue.popleft() if self._queue else None

    def drain(self) -> list[CompileOutcome]:
        """Run jobs until closed and done. Jobs whose lease another host holds come back later."""
        deferred: list[tuple[float, CompileJob]] = []  # (retry at, job)
        attempts: dict[str, int] = {}  # lease found held, per job
        compiles: dict[str, int] = {}  # compiles that failed for the environment, per job
        outcomes: list[CompileOutcome] = []
        running: dict[Future[CompileOutcome | None], CompileJob] = {}
        pool = ThreadPoolExecutor(max(1, self.parallel), thread_name_prefix="neffcache-compile")
        try:
            while True:
                now = time.monotonic()
                for item in [d for d in deferred if d[0] <= now]:
                    deferred.remove(item)
                    self.add_back(item[1])
                while (len(running) < self.parallel and not self.children.stopping.is_set()
                       and self.memory.room_for_another(len(running))):
                    job = self._next()
                    if job is None:
                        break
                    running[pool.submit(self._one, job)] = job
                if not running:
                    with self._lock:
                        idle = not self._queue
                    if self.children.stopping.is_set() or (idle and not deferred and self._closed.is_set()):
                        # Under the lock: add() may still append from another thread, and a
                        # deque copied while it grows raises instead of copying.
                        with self._lock:
                            left = [*self._queue, *(d[1] for d in deferred)]
                        outcomes.extend(CompileOutcome(j, CompileStatus.INTERRUPTED) for j in left)
                        break
                    time.sleep(0.05)  # nothing to run yet: more jobs, a deferred one, or the close
                    continue
                done, _ = wait(running, timeout=0.2, return_when=FIRST_COMPLETED)
                for future in done:
                    job = running.pop(future)
                    outcome = future.result()
                    if outcome is None:  # someone else holds its lease: look again soon
                        n = attempts[job.path] = attempts.get(job.path, 0) + 1
                        deferred.append((time.monotonic() + min(0.2 * 2 ** n, 5.0), job))
                        continue
                    if retryable(outcome):
                        tried = compiles[job.path] = compiles.get(job.path, 0) + 1
                        if tried <= self.env_retries and not self.children.stopping.is_set():
                            log.warning("%s: %s; compiling it again in %.0fs", job.path, outcome.reason,
                                        retry_delay(tried, self.retry_backoff))
                            deferred.append((time.monotonic() + retry_delay(tried, self.retry_backoff), job))
                            continue
                        outcome = replace(outcome, attempts=tried)
                    outcomes.append(outcome)
                    if self.on_done is not None:
                        self.on_done(outcome)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return outcomes

    def add_back(self, job: CompileJob) -> None:
        with self._lock:
            self._queue.append(job)

    # -- one graph ------------------------------------------------------------------------
    def _one(self, job: CompileJob) -> CompileOutcome | None:
        if self.children.stopping.is_set():
            return CompileOutcome(job, CompileStatus.INTERRUPTED)
        if self.placement.bring_to_work(job.path):
            return self._hit(job)
        refused = self._flags_refusal(job)
        if refused is not None:
            return CompileOutcome(job, CompileStatus.REFUSED, reason=refused)
        got = try_acquire(self.placement.coordinator, f"compile:{job.path}", ttl=self.lease_ttl)
        if not isinstance(got, StoreLease):
            return None
        lease = got
        lease.keep_alive()
        try:
            if self.placement.bring_to_work(job.path):
                return self._hit(job)
            reason = standing_reason(self.placement, job, retry_failed=self.retry_failed,
                                     started_at=self.started_at, failed_ttl=self.failed_ttl)
            if reason is not None:
                return CompileOutcome(job, CompileStatus.FAILED, reason=reason)
            lock_path = self._runtime_lock_path(job)
            if lock_path is None:
                return self._compile(job, holding_runtime_lock=False)
            held = RuntimeLock.acquire(lock_path)
            if held is None:
                return self._runtime_compiling(job, lock_path)
            with held:
                if self.placement.bring_to_work(job.path):  # a runtime finished it meanwhile
                    return self._hit(job)
                return self._compile(job, holding_runtime_lock=True)
        finally:
            lease.release()

    def _runtime_lock_path(self, job: CompileJob) -> Path | None:
        """Where the runtime's compile lock of ``job`` lies in the work store, when the layout
        has one and the work store is a filesystem a runtime can share."""
        name = get_layout(job.namespace.layout).names(job.namespace, job.key).runtime_lock
        if name is None:
            return None
        return self.placement.work.local_path(f"{job.path}/{name}")

    def _runtime_compiling(self, job: CompileJob, lock_path: Path) -> CompileOutcome | None:
        """A runtime holds the graph's lock: wait for its NEFF (None: look again soon), as the
        runtime would, unless the lock is older than our patience (then report, not compile)."""
        age = lock_age(lock_path)
        if age is None or age < self.runtime_lock_patience:
            return None
        return CompileOutcome(job, CompileStatus.FAILED, reason=(
            f"a runtime's compile lock {lock_path.name} has been there {age / 60:.0f} min: a runtime compiles "
            "this graph or died doing so; not compiled twice (neffcache prune removes stale locks)"))

    def _flags_refusal(self, job: CompileJob) -> str | None:
        """Why ``job``'s source entry must not be compiled (its flags file does not back its
        key), or None. Checked before any compile, for two-phase warms and rewarms alike."""
        located = locate(job.hlo_path)
        if located is None:
            return None
        layout = get_layout(located.namespace.layout)
        entry = load_entry(job.source, located.path, read_manifest=False)
        if entry is None:
            return None
        name = layout.flags_of(entry)
        try:
            data = job.source.read_bytes(entry.store_path(name)) if name is not None else None
        except EntryNotFound:
            data = None
        problem = layout.flags_problem(entry.key, data)
        return f"{located.path}: {problem}" if problem is not None else None

    def _hit(self, job: CompileJob) -> CompileOutcome:
        self.placement.event(EventKind.HIT, job.path, job.namespace, tags=job.tags)
        self.placement.stamp([job.path])
        return CompileOutcome(job, CompileStatus.HIT)

    def _compile(self, job: CompileJob, *, holding_runtime_lock: bool) -> CompileOutcome:
        work = self.placement.work
        with work.staging_dir() as tmp:
            hlo = job.source.local_path(job.hlo_path)
            if hlo is None:
                hlo = tmp / "source.hlo"
                job.source.get_file(job.hlo_path, hlo)
            neff = tmp / _STAGED_NEFF
            tc = job.toolchain
            # The runtime's own argument shape: fixed options first, so the user's flags win.
            cmd = [str(self.compiler), "compile", "--framework=XLA", f"--target={tc.target}",
                   f"--lnc={tc.lnc}", str(hlo), "--output", str(neff), *job.flags]
            started = time.monotonic()
            run = self._run_compiler(cmd, tmp)
            seconds = time.monotonic() - started
            if self.children.stopping.is_set():
                return CompileOutcome(job, CompileStatus.INTERRUPTED, seconds)
            if run.status != 0 or not neff.exists() or neff.stat().st_size == 0:
                failed = judge(run)
                report_error(self.placement, job, failed)
                record_compiler_error(self.placement, job, self._files(job, hlo, None), cmd, failed)
                return failure_outcome(job, run, failed, seconds, self.timeout)
            size, tiers = self._publish(job, hlo, neff, seconds, holding_runtime_lock)
        return CompileOutcome(job, CompileStatus.COMPILED, seconds, size, tiers=tiers)

    def _run_compiler(self, cmd: list[str], tmp: Path) -> CompileRun:
        """Run one compile in its own process group, under the timeout; output to compile.log."""
        with open(tmp / "compile.log", "wb") as out:
            try:
                proc = self.children.spawn(cmd, stdout=out, stderr=out, cwd=str(tmp))
            except OSError as exc:  # not installed, not executable: the host's failure, not the graph's
                return CompileRun(None, "", exc)
            status = self.children.wait(proc, self.timeout)
        output = (tmp / "compile.log").read_bytes()[-TAIL:].decode(errors="replace")
        return CompileRun(status, output)

    def _files(self, job: CompileJob, hlo: Path, neff: Path | None) -> dict[str, FileSource]:
        layout = get_layout(job.namespace.layout)
        names = layout.names(job.namespace, job.key)
        # The flags file in the form of the target runtime's era: the name we publish under is
        # the one that runtime computes from it (neuronxcc's +<suffix>).
        flags_name, flags_bytes = layout.flags_file(job.namespace, job.key, job.flags)
        files: dict[str, FileSource] = {}
        if names.hlo is not None:
            files[names.hlo] = hlo
        if flags_name is not None:
            files[flags_name] = flags_bytes
        if neff is not None and names.neff is not None:
            files[names.neff] = neff
        return files

    def _publish(self, job: CompileJob, hlo: Path, neff: Path, seconds: float, holding_runtime_lock: bool
                 ) -> tuple[int, int]:
        files = self._files(job, hlo, neff)
        manifest = build_manifest(job.namespace.layout, job.key, files, toolchain=job.toolchain,
                                  flags=job.flags, tags=job.tags, compile_seconds=round(seconds, 3))
        if holding_runtime_lock:
            # Into the work store while our runtime lock still stands (publish would otherwise
            # take it for a runtime compiling): a runtime waiting on it then finds the NEFF.
            publish(self.placement.work, job.namespace, job.key, files, manifest, known_absent=True)
        held = self.placement.publish(job.namespace, job.key, files, manifest)
        log_name = get_layout(job.namespace.layout).names(job.namespace, job.key).failure_log
        if log_name is not None:
            for store in held:
                if store.stat(f"{job.path}/{log_name}") is not None:
                    # A retried failure: its old log must not outlive the NEFF that replaced it.
                    store.delete([f"{job.path}/{log_name}"])
        entry = load_entry(self.placement.work, job.path)
        if entry is not None:
            self.placement.register(entry, held)
        self.placement.event(EventKind.MISS, job.path, job.namespace, tags=job.tags)
        self.placement.event(EventKind.COMPILE, job.path, job.namespace, compile_seconds=seconds, tags=job.tags)
        return manifest.size, len(held)
