"""``neffcache warm``: run a workload compile-only over shape buckets, publish what it compiled.

One-phase (any layout): each bucket's workload runs with the compile-only contract
(``TORCH_NEURONX_COMPILE_ONLY=1``, ``NEURON_RT_FAKE_INSTANCE_TYPE``) and the cache variables of
every layout pointed at the toolchain's namespace in the work store; the runtime finds what
the stores hold (prefetched from the remote tiers first) and compiles only what is missing.
Its log lines, read by the layouts (:mod:`.logscan`), say which entries were hits and which it
compiled, and how long each compile took (compile-call line to success/failure line); those
get their manifest (tags, toolchain, compile seconds) and are published to the other tiers. A
runtime whose lines cannot say (TorchNeuron's name op keys and come from an in-process
dictionary) is counted from its cache (:mod:`.growth`): what appeared in its namespace during
the bucket it compiled, the rest of what it looked up the disk served. Warming TorchNeuron is
exactly this: the runtime computes and writes its own keys.

Two-phase (neuronxcc, like ``neuron_parallel_compile``): the workloads only extract their
graphs (``NEURON_EXTRACT_GRAPHS_ONLY=1``), then :class:`~.compiling.CompilePool` compiles
every pending HLO itself: bounded, memory-aware, under a per-compile timeout, and leased so
shards on different hosts never compile the same graph twice.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from neffcache.application.jobenv import job_env
from neffcache.entry import EntryState, Namespace
from neffcache.events import EventKind
from neffcache.layouts import LAYOUTS, get_layout
from neffcache.layouts.flags_form import own_namespace
from neffcache.operations.failed import standing_failure
from neffcache.operations.ingest import read_flags
from neffcache.scan.report import load_entry, scan
from neffcache.toolchain import Toolchain

from .children import Children, wait_all
from .compile_failures import summary
from .compiling import CompileJob, CompileOutcome, CompilePool, record_outcome
from .growth import CountedFromCache
from .logscan import Pattern
from .matrix import Bucket, Shard, shard_buckets
from .memory import MemoryGate
from .node_tiers import NodeTiers, Served, private_base
from .placement import Placement
from .report import FailureKind, GroupReport, GroupStatus, WarmReport, reporting
from .runtime_failures import clear_failures, judge_bucket, mark_timeouts, record_runtime_failures
from .watchdog import CompileWatchdog
from .workload import WorkloadRun, clean_after_dead_workload, namespace_of, run_workload

log = logging.getLogger(__name__)
Progress = Callable[[str], None]
UNATTRIBUTED = "(unattributed)"


@dataclass
class WarmRequest:
    command: Sequence[str]
    instance: str
    toolchain: Toolchain
    compiler: Path
    buckets: Sequence[Bucket]
    patterns: Sequence[Pattern]
    log_dir: Path
    shard: Shard = field(default_factory=Shard)
    parallel: int = 1
    two_phase: bool = False
    timeout: float | None = None  # per workload
    compile_timeout: float | None = None
    compile_memory_mb: float | None = None
    retry_failed: bool = False
    failed_ttl: float | None = None  # a cached compiler error older than this is compiled again
    prefetch: bool = True
    tags: Mapping[str, str] = field(default_factory=dict)
    base_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    compile_workers: int | None = None  # compiles at once inside a runtime that runs its own (--parallel given)
    local_root: str | None = None  # node-local directory for the buckets' private runtime tiers


def workload_env(req: WarmRequest, root: str, notes: list[str], local_root: str | None = None) -> dict[str, str]:
    """The compile-only contract, every layout's cache variables, the compiler first on PATH
    (``local_root``: where runtimes with a node-local tier keep it)."""
    env = dict(req.base_env)
    for layout in LAYOUTS.values():  # e.g. neuronxcc drops --cache_dir, which would win over the URL
        changes, layout_notes = layout.compile_only_env(env, retry_failed=req.retry_failed, toolchain=req.toolchain,
                                                        workers=req.compile_workers)
        notes.extend(layout_notes)
        for name, value in changes.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
    cache_vars, job_notes = job_env(root, req.toolchain, environ=env, local_root=local_root, local_notes=False)
    notes.extend(job_notes)
    env.update(cache_vars)
    env.update({"TORCH_NEURONX_COMPILE_ONLY": "1", "NEURON_RT_FAKE_INSTANCE_TYPE": req.instance})
    if req.two_phase:
        env["NEURON_EXTRACT_GRAPHS_ONLY"] = "1"
    # The runtime runs `neuronx-cc` from PATH: make it the one we resolved the toolchain with.
    env["PATH"] = os.pathsep.join([str(req.compiler.parent), env.get("PATH", os.defpath)])
    return env


def log_name(bucket: Bucket) -> str:
    return f"{bucket.index:03d}-{re.sub(r'[^A-Za-z0-9_.=-]+', '_', bucket.name)[:80]}.log"


class Warmer:
    def __init__(self, req: WarmRequest, placement: Placement, children: Children,
                 progress: Progress | None = None) -> None:
        self.req = req
        self.placement = placement
        self.children = children
        self.progress = progress or (lambda message: None)
        tc = req.toolchain
        self.namespaces = [layout.namespace_for(tc) for layout in LAYOUTS.values()]
        self.live_groups: set[int] = set()
        self.report = WarmReport("warm", {**tc.to_json(), "instance": req.instance},
                                 [ns.path for ns in self.namespaces], [s.url for s in placement.tiers],
                                 "two-phase" if req.two_phase else "one-phase", req.shard.label, req.parallel)
        self.started = time.time()
        self._lock = threading.Lock()
        self.claimed: set[str] = set()  # two-phase: entries already queued by some bucket
        self.pool: CompilePool | None = None
        self.runs: dict[str, WorkloadRun] = {}
        self.from_cache: CountedFromCache = CountedFromCache.nothing()  # runtimes whose lines name no entry
        self.node = NodeTiers(placement, tc, private_base(req.local_root))  # runtimes' node-local tiers

    def run(self) -> WarmReport:
        try:
            with reporting(self.report, stop_children=self.children.stop_all,
                           problem_notes=self.placement.problem_notes):
                self._run()
        finally:
            self.node.close()
        return self.report

    def _run(self) -> None:
        req, placement = self.req, self.placement
        if req.prefetch and placement.remotes:
            self.progress(f"prefetching {', '.join(ns.path for ns in self.namespaces)} from the remote tiers")
            self.report.prefetched, _ = placement.prefetch(self.namespaces, parallel=max(4, req.parallel))
        env = workload_env(req, placement.work_root, self.report.notes, local_root=str(self.node.base))
        self.from_cache = CountedFromCache(placement.work, self.namespaces)
        if not req.two_phase:  # the runtime compiles: its failure logs that do not stand must go
            cleared = clear_failures(placement.work, self.namespaces, ttl=req.failed_ttl)
            if cleared:
                self.report.notes.append(f"cleared {len(cleared)} failure log(s) that do not stand (environment "
                                         "failures, or compiler errors older than the failure TTL): compiled again")
        buckets = shard_buckets(req.buckets, req.shard)
        if not buckets:
            self.report.notes.append(f"shard {req.shard.label} has no buckets ({len(req.buckets)} in all)")
            return
        self.progress(f"{'extracting' if req.two_phase else 'warming'} {len(buckets)} bucket(s), "
                      f"{req.parallel} at a time: {shlex.join(req.command)}")
        for bucket in buckets:
            self.report.group(bucket.name)  # rows in matrix order, whatever finishes first
        # Runtimes that compile inside the workload (one-phase, or the native backend, which has
        # no extraction mode) get their compiles timed out by the watchdog.
        watchdog = CompileWatchdog(req.compile_timeout, lambda: set(self.live_groups)) \
            if req.compile_timeout else None
        runs = self.runs
        # Two-phase: each bucket's graphs go to the compile pool as soon as its extraction ends,
        # so compiles overlap the other buckets' extractions.
        self.pool = self._compile_pool() if req.two_phase else None
        with ThreadPoolExecutor(max(1, req.parallel), thread_name_prefix="neffcache-workload") as workers:
            if watchdog is not None:
                watchdog.__enter__()
            try:
                futures = [workers.submit(self._bucket, b, env, runs) for b in buckets]
                if self.pool is None:
                    wait_all(futures)
                else:
                    closer = workers.submit(self._close_pool_after, futures)
                    outcomes = self.pool.drain()
                    # Under the lock: when a stop ends the drain early, bucket threads are still
                    # adding to report.published and creating rows.
                    with self._lock:
                        for outcome in outcomes:
                            record_outcome(self.report, outcome)
                    wait_all([*futures, closer])
            finally:
                if self.pool is not None:
                    self.pool.close()
                if watchdog is not None:
                    watchdog.__exit__(None, None, None)
        if watchdog is not None:
            mark_timeouts(watchdog, list(self.runs.values()), self.report)
        if not self.children.stopping.is_set():
            self._unannounced()
            # Entries that reached the work store but not a lower tier (it was down last time).
            self.report.published += placement.catch_up(self.namespaces)

    def _bucket(self, bucket: Bucket, env: Mapping[str, str], runs: dict[str, WorkloadRun]) -> None:
        req = self.req
        before, private = self.node.before(), self.node.env_for(bucket)
        run = run_workload(bucket.name, bucket.command(req.command), {**env, **bucket.env(), **private},
                           children=self.children, patterns=req.patterns, root=self.placement.work_root,
                           namespaces=self.namespaces, log_path=req.log_dir / log_name(bucket),
                           timeout=req.timeout, live_groups=self.live_groups)
        runs[bucket.name] = run
        row = self.report.group(bucket.name)
        row.status, row.exit_code, row.seconds, row.log = (run.group.status, run.group.exit_code,
                                                            run.group.seconds, run.group.log)
        row.failures.extend(run.group.failures)
        if row.status in (GroupStatus.TIMEOUT, GroupStatus.CRASHED, GroupStatus.INTERRUPTED):
            clean_after_dead_workload(self.placement.work, run)
        if not self.children.stopping.is_set():
            served = self._account_node_tiers(bucket, run, before)  # a server's, from its tiers
            # Two-phase: extracted graphs are compiled by our pool; only what the runtime itself
            # stored (the native backend cannot extract, its lines name no entry) is ingested here.
            self._ingest(bucket, run, row, native_only=req.two_phase)
            served.add_to(row)
            if self.pool is not None:
                self._queue_extracted(bucket, run)
        self.progress(_row_line(row, "extracted" if req.two_phase else "done"))

    # -- one-phase: what the runtime did -------------------------------------------------
    def _ingest(self, bucket: Bucket, run: WorkloadRun, row: GroupReport, *, native_only: bool) -> None:
        placement, counter = self.placement, run.counter
        failed = [] if native_only else counter.entries("failure")
        named = [] if native_only else [p for p in dict.fromkeys([*counter.entries("compile"),
                                                                  *counter.entries("success")]) if p not in failed]
        counted = self.from_cache.bucket(counter, named)
        found, from_cache, compiled_here, served = counted.found, counted.namespaces, counted.compiled, counted.served
        compiled = [*named, *found]
        hits = [] if native_only else [p for p in counter.entries("hit") if p not in compiled and p not in failed]
        # Lines that name no entry we manage (a user pattern's keys, cache paths outside the work store).
        unnamed_hits = sum(counter.unnamed("hit").values()) if native_only else \
            sum(1 for e in counter.events if e.kind == "hit" and e.entry is None)
        unfinished = [e for e in counter.compiling() if not native_only or e.entry is None] \
            if row.status is GroupStatus.FAILED else []
        row.hits = len(hits) + unnamed_hits + sum(served.values())
        unnamed_failed = 0 if native_only else sum(1 for e in counter.failure_lines() if e.entry is None)
        row.failed = len(failed) + unnamed_failed + len(unfinished)
        tags = {**self.req.tags, **bucket.tags()}
        for path in hits:
            placement.event(EventKind.HIT, path, self._ns(path))
        for ns_path, n in [*counter.unnamed("hit").items(), *served.items()]:
            for _ in range(n):
                placement.event(EventKind.HIT, None, self._ns_at(ns_path))
        placement.stamp(hits)
        # A hit on an entry the runtime wrote without us (an earlier run that was stopped, a
        # job outside neffcache) is still new to the other tiers: it is published too.
        adopted = placement.ingest_many([(p, tags, None) for p in hits], toolchain=self.req.toolchain,
                                        skip_managed=True)
        seconds = {p: self._compile_seconds(run, p) for p in compiled}
        adopted.update(placement.ingest_many([(p, tags, seconds[p]) for p in compiled], toolchain=self.req.toolchain))
        with self._lock:
            self.report.published += sum(len(held) - 1 for _, held in adopted.values())
        for path in compiled:
            if path not in adopted:
                continue  # the runtime did not finish it (stopped mid-compile): nothing to publish
            entry = adopted[path][0]
            placement.event(EventKind.MISS, path, entry.namespace)
            placement.event(EventKind.COMPILE, path, entry.namespace, compile_seconds=seconds[path])
            row.compiled += int(path in named)
            row.compile_seconds += seconds[path] or 0.0
            row.bytes += entry.size
        row.compiled += sum(compiled_here.values())
        # and a user pattern's compile lines that name no entry, where the cache does not count.
        row.compiled += sum(n for ns_path, n in counter.unnamed("compile").items() if ns_path not in from_cache)
        judged = {} if native_only else judge_bucket(placement.work, failed, ttl=self.req.failed_ttl).failures
        record_runtime_failures(placement, run, row, unfinished, judged, self._ns, self._ns_at,
                                native_only=native_only)
        row.graphs = row.hits + row.compiled + row.failed
        if not counter.events and not run.mentioned and not run.served and row.status is GroupStatus.OK:
            self.report.notes.append(f"bucket {bucket.name}: no cache log lines recognised; if the runtime "
                                     "logs differently, add --pattern KIND=REGEX")

    def _account_node_tiers(self, bucket: Bucket, run: WorkloadRun, before: Mapping[str, frozenset[str]]) -> Served:
        """What a runtime with a node-local tier did in the bucket, from its tiers (node_tiers.py)."""
        served = self.node.account(bucket, before, {**self.req.tags, **bucket.tags()})
        run.served = served.hits + served.compiled
        with self._lock:
            self.report.published += served.published
            self.report.notes.extend(served.notes)
        return served


    def _unannounced(self) -> None:
        """Compiles the cache shows that no bucket's lines announced, in a row of their own."""
        extra = self.from_cache.unannounced
        if extra > 0:
            row = self.report.group(UNATTRIBUTED)
            row.compiled += extra
            row.graphs += extra
            self.report.notes.append(f"{extra} compile(s) appeared in the cache that no bucket's log lines "
                                     f"announced (TorchNeuron's kernels log none): counted in {UNATTRIBUTED}")
        elif extra < 0:
            self.report.notes.append(f"{-extra} compile(s) the runtime announced left no new entry in the "
                                     "namespace it was pointed at (a full disk, another cache directory?)")

    def _compile_seconds(self, run: WorkloadRun, path: str) -> float | None:
        """From the lines (compile call to success/failure), else the honest bound from its files."""
        seconds = run.counter.compile_seconds(path)
        return seconds if seconds is not None else self.placement.compile_seconds_of(path, run.started)

    def _ns(self, path: str | None) -> Namespace:
        return namespace_of(path, self.namespaces) or self.namespaces[0]

    def _ns_at(self, ns_path: str | None) -> Namespace:
        return next((ns for ns in self.namespaces if ns.path == ns_path), self.namespaces[0])

    # -- two-phase: compile what the workloads extracted ----------------------------------
    def _compile_pool(self) -> CompilePool:
        return CompilePool(self.placement, self.req.compiler, self.children, parallel=self.req.parallel,
                           timeout=self.req.compile_timeout, memory=MemoryGate(self.req.compile_memory_mb),
                           retry_failed=self.req.retry_failed, started_at=self.started,
                           on_done=lambda o: self.progress(outcome_line(o)), failed_ttl=self.req.failed_ttl)

    def _queue_extracted(self, bucket: Bucket, run: WorkloadRun) -> None:
        assert self.pool is not None
        with self._lock:
            paths = [p for p in run.mentioned if p not in self.claimed]
            self.claimed.update(paths)
        self.pool.add(self._jobs_for(self.report.group(bucket.name), paths, {**self.req.tags, **bucket.tags()}))

    def _close_pool_after(self, futures: Sequence[Future[None]]) -> None:
        """Once every extraction ended: queue what no log line named, then close the pool."""
        assert self.pool is not None
        try:
            wait_all(futures)
            if not self.children.stopping.is_set():
                # Extractions whose log lines named nothing we recognise: every pending HLO
                # that appeared since we started in the namespace of the runtime that extracts
                # (libneuronxla's, the first layout).
                ns = self.namespaces[0]
                fresh = [e.path for e in scan(self.placement.work, prefix=ns.path).entries
                         if e.path not in self.claimed and e.state is EntryState.EMPTY
                         and e.mtime >= self.started - 1]
                if fresh:
                    with self._lock:  # the row may be created while outcomes are recorded
                        row = self.report.group(UNATTRIBUTED)
                    self.pool.add(self._jobs_for(row, fresh, dict(self.req.tags)))
        finally:
            self.pool.close()

    def _jobs_for(self, row: GroupReport, paths: Sequence[str], tags: Mapping[str, str]) -> list[CompileJob]:
        work, jobs = self.placement.work, []
        for path in paths:
            entry = load_entry(work, path, read_manifest=False)
            if entry is None:
                continue
            layout = get_layout(entry.layout)
            if entry.state is EntryState.SUCCESS:
                row.hits += 1
                row.graphs += 1
                self.placement.event(EventKind.HIT, path, entry.namespace)
                self.placement.stamp([path])
                got = self.placement.ingest(path, toolchain=self.req.toolchain, tags=tags, skip_managed=True)
                if got is not None:  # written by a runtime without us: new to the other tiers
                    with self._lock:
                        self.report.published += len(got[1]) - 1
            elif entry.state is EntryState.FAILED and not self.req.retry_failed and (
                    failed := standing_failure(work, entry, ttl=self.req.failed_ttl)) is not None:
                row.graphs += 1
                row.failed += 1
                row.worsen(GroupStatus.FAILED)
                row.fail(path, FailureKind.COMPILE, f"cached compiler error (--retry-failed compiles it again): "
                         f"{summary(failed.text)} (signature {failed.signature})", signature=failed.signature)
            elif (hlo := layout.hlo_of(entry)) is not None:
                # The runtime named the entry in its own flags form: the published flags file
                # (and marker) must be of that form, whatever the version table says.
                jobs.append(CompileJob(row.name, own_namespace(work, entry), entry.key, work, entry.store_path(hlo),
                                       tuple(read_flags(work, entry)), self.req.toolchain, tags))
        return jobs


def _row_line(row: GroupReport, verb: str) -> str:
    counts = f"{row.hits} hits, {row.compiled} compiled, {row.failed} failed" if verb == "done" else ""
    status = "" if row.status is GroupStatus.OK else f" [{row.status.upper()}]"
    return f"  bucket {row.name}: {verb} in {row.seconds:.1f}s{': ' + counts if counts else ''}{status}"


def outcome_line(outcome: CompileOutcome) -> str:
    extra = f" in {outcome.seconds:.1f}s" if outcome.seconds else ""
    why = f": {outcome.reason}" if outcome.reason else ""
    return f"  {outcome.status:<9} {outcome.job.path}{extra}{why}"
