"""neffcache's own compile pool: pending HLOs in, published entries out.

Used by the two-phase warm-up (graphs extracted by the workload, compiled here) and by
``rewarm`` (HLOs of an old compiler's entries, compiled with the new one). Per graph:

1. if any tier already holds the entry, it is a hit (copied into the work store if needed);
2. take the lease ``compile:<entry path>`` in the coordinator store. Held by someone else
   (another shard, another host) means: come back later, when it will most likely be a hit,
   or the holder died and its lease can be taken over;
3. compile with ``neuronx-cc`` in its own process group, under a timeout, in a staging
   directory of the work store, while the memory gate says another compile fits;
4. publish the entry, manifest first and marker last, to every writable tier; register it in
   the index and send the events. A failure is recorded the way the runtime records it
   (layout A: ``model.log`` beside the HLO, so runtimes and ``--retry-failed`` agree on it).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from neffcache.entry import EntryState, Namespace
from neffcache.ingest import build_manifest
from neffcache.layouts import get_layout
from neffcache.layouts.neuronxcc import FLAGS_JSON, HLO, LOG, NEFF
from neffcache.layouts.torchneuron import TorchNeuronLayout
from neffcache.lease import Lease, try_acquire
from neffcache.scan import load_entry
from neffcache.stores.base import Source, Store
from neffcache.toolchain import Toolchain

from .children import Children
from .memory import MemoryGate
from .placement import Placement
from .report import WarmReport

log = logging.getLogger(__name__)
LEASE_TTL = 120.0
_TAIL = 4000


@dataclass(frozen=True)
class CompileJob:
    group: str  # the report row: a bucket, or the namespace a rewarm reads from
    namespace: Namespace  # where the new entry goes
    key: str
    source: Store  # holds the HLO
    hlo_path: str
    flags: tuple[str, ...]
    toolchain: Toolchain
    tags: Mapping[str, str] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return get_layout(self.namespace.layout).plan_entry(self.namespace, self.key).path


@dataclass(frozen=True)
class CompileOutcome:
    job: CompileJob
    status: str  # compiled | hit | failed | timeout | interrupted
    seconds: float = 0.0
    bytes: int = 0
    reason: str = ""
    tiers: int = 0  # how many tiers hold the new entry


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
    on_done: Callable[[CompileOutcome], None] | None = None

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
        attempts: dict[str, int] = {}
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
                        outcomes.extend(CompileOutcome(j, "interrupted")
                                        for j in [*self._queue, *(d[1] for d in deferred)])
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
            return CompileOutcome(job, "interrupted")
        if self.placement.bring_to_work(job.path):
            return self._hit(job)
        got = try_acquire(self.placement.coordinator, f"compile:{job.path}", ttl=self.lease_ttl)
        if not isinstance(got, Lease):
            return None
        lease = got
        lease.keep_alive()
        try:
            if self.placement.bring_to_work(job.path):
                return self._hit(job)
            reason = self._failed_before(job)
            if reason is not None:
                return CompileOutcome(job, "failed", reason=reason)
            return self._compile(job)
        finally:
            lease.release()

    def _hit(self, job: CompileJob) -> CompileOutcome:
        self.placement.event("hit", job.path, job.namespace, tags=job.tags)
        self.placement.stamp([job.path])
        return CompileOutcome(job, "hit")

    def _failed_before(self, job: CompileJob) -> str | None:
        """The recorded failure that stands for this run, if any (layout A keeps failures)."""
        if job.namespace.layout != "neuronxcc":
            return None
        for store in dict.fromkeys([self.placement.work, self.placement.coordinator]):
            entry = load_entry(store, job.path, read_manifest=False)
            if entry is None or entry.state is not EntryState.FAILED:
                continue
            info = entry.files.get(LOG)
            fresh = info is not None and info.mtime >= self.started_at
            if not self.retry_failed or fresh:
                text = store.read_bytes(entry.store_path(LOG)).decode(errors="replace")
                hint = "" if fresh else " (cached failure; --retry-failed compiles it again)"
                return f"{_summary(text)}{hint}"
        return None

    def _compile(self, job: CompileJob) -> CompileOutcome:
        work = self.placement.work
        with work.staging_dir() as tmp:
            hlo = job.source.local_path(job.hlo_path)
            if hlo is None:
                hlo = tmp / HLO
                job.source.get_file(job.hlo_path, hlo)
            neff = tmp / NEFF
            tc = job.toolchain
            # The runtime's own argument shape: fixed options first, so the user's flags win.
            cmd = [str(self.compiler), "compile", "--framework=XLA", f"--target={tc.target}",
                   f"--lnc={tc.lnc}", str(hlo), "--output", str(neff), *job.flags]
            started = time.monotonic()
            with open(tmp / "compile.log", "wb") as out:
                proc = self.children.spawn(cmd, stdout=out, stderr=out, cwd=str(tmp))
                status = self.children.wait(proc, self.timeout)
            seconds = time.monotonic() - started
            output = (tmp / "compile.log").read_bytes()[-_TAIL:].decode(errors="replace")
            if self.children.stopping.is_set():
                return CompileOutcome(job, "interrupted", seconds)
            if status is None:
                reason = f"compile timed out after {self.timeout:g}s (killed)"
                self._record_failure(job, hlo, f"neffcache: {reason}\n{output}")
                return CompileOutcome(job, "timeout", seconds, reason=reason)
            if status != 0 or not neff.exists() or neff.stat().st_size == 0:
                reason = f"neuronx-cc exited {status}: {_summary(output)}"
                self._record_failure(job, hlo, output or reason)
                return CompileOutcome(job, "failed", seconds, reason=reason)
            size, tiers = self._publish(job, hlo, neff, seconds)
        return CompileOutcome(job, "compiled", seconds, size, tiers=tiers)

    def _files(self, job: CompileJob, hlo: Path, neff: Path | None) -> dict[str, Source]:
        flags = json.dumps(list(job.flags)).encode()
        if job.namespace.layout == "torchneuron":
            names = TorchNeuronLayout.names_for(job.namespace, job.key)
            files: dict[str, Source] = {names["hlo"]: hlo, names["flags"]: flags}
            if neff is not None:
                files[names["neff"]] = neff
            return files
        files = {HLO: hlo, FLAGS_JSON: flags}
        if neff is not None:
            files[NEFF] = neff
        return files

    def _publish(self, job: CompileJob, hlo: Path, neff: Path, seconds: float) -> tuple[int, int]:
        files = self._files(job, hlo, neff)
        manifest = build_manifest(job.namespace.layout, job.key, files, toolchain=job.toolchain,
                                  flags=job.flags, tags=job.tags, compile_seconds=round(seconds, 3))
        held = self.placement.publish(job.namespace, job.key, files, manifest)
        if job.namespace.layout == "neuronxcc":
            for store in held:
                if store.stat(f"{job.path}/{LOG}") is not None:
                    # A retried failure: its old log must not outlive the NEFF that replaced it.
                    store.delete([f"{job.path}/{LOG}"])
        entry = load_entry(self.placement.work, job.path)
        if entry is not None:
            self.placement.register(entry, held)
        self.placement.event("miss", job.path, job.namespace, tags=job.tags)
        self.placement.event("compile", job.path, job.namespace, compile_seconds=seconds, tags=job.tags)
        return manifest.size, len(held)

    def _record_failure(self, job: CompileJob, hlo: Path, text: str) -> None:
        self.placement.event("error", job.path, job.namespace, message=text[-_TAIL:], tags=job.tags)
        if job.namespace.layout != "neuronxcc":
            return  # the native runtime does not cache failures: neither do we
        for store in dict.fromkeys([self.placement.work, self.placement.coordinator]):
            # HLO and flags first, the log last: the entry reads as FAILED only once whole.
            for name, source in self._files(job, hlo, None).items():
                if store.stat(f"{job.path}/{name}") is None:
                    store.put_file(f"{job.path}/{name}", source)
            store.put_file(f"{job.path}/{LOG}", text.encode())


def _summary(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "ERROR" in ln or "error" in ln]
    return (errors[0] if errors else lines[-1] if lines else "no output")[:300]


def record_outcome(report: WarmReport, outcome: CompileOutcome) -> None:
    """Count one compile outcome into its group's row."""
    row = report.group(outcome.job.group)
    if outcome.status == "interrupted":
        row.worsen("interrupted")
        return
    row.graphs += 1
    if outcome.status == "hit":
        row.hits += 1
    elif outcome.status == "compiled":
        row.compiled += 1
        row.compile_seconds += outcome.seconds
        row.bytes += outcome.bytes
        report.published += max(0, outcome.tiers - 1)
    else:
        row.failed += 1
        row.worsen("failed")
        row.fail(outcome.job.path, "timeout" if outcome.status == "timeout" else "compile", outcome.reason)
