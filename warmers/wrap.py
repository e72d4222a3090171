"""``neffcache run -- CMD``: a real training or inference job, wrapped.

The job gets the cache environment of its toolchain (every layout, pointed at its namespace
in the work store), optionally after a prefetch from the remote tiers. Its stdout and stderr
pass through byte for byte (read in chunks, written at once, so progress bars and partial
lines behave), while a copy of every line goes to the layouts' log parsers (and the user's
patterns). Lines that name an entry are tied to it, with its compile seconds measured from
its compile-call line to its success or failure line. A runtime whose lines cannot say what it
compiled (TorchNeuron: they name op keys, and come from an in-process dictionary in front of
the disk) is counted from its cache: the entries the job added are its compiles, the graphs
it looked up and did not compile its hits (:mod:`.growth`). Signals are
forwarded, so an orchestrator's SIGTERM reaches the job and not only us. Afterwards the
entries the job compiled get their manifest and are published to every writable tier, hits
are stamped (for age-based pruning) and everything is reported to the index. The exit code is
the job's own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import IO, Any

from neffcache.application.jobenv import job_env
from neffcache.entry import Namespace
from neffcache.errors import NeffcacheError
from neffcache.events import EventKind
from neffcache.layouts import LAYOUTS
from neffcache.misses.inputs import ReportedStatus
from neffcache.misses.reported import reported_graph
from neffcache.toolchain import Toolchain

from .children import exit_status
from .growth import CacheGrowth, disk_hits
from .local_run import LocalGrowth, LocalRun, LocalSession
from .logscan import KINDS, LogCounter, Pattern
from .placement import Placement
from .runtime_failures import judge_bucket
from .workload import namespace_of

log = logging.getLogger(__name__)
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_CHUNK = 65536


@dataclass
class RunRequest:
    command: Sequence[str]
    toolchain: Toolchain
    patterns: Sequence[Pattern]
    prefetch: bool = False
    prefetch_tags: Mapping[str, str] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    publish: bool = True
    failed_ttl: float | None = None  # a compiler error the job met, older than this, is cleared too
    base_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    local: LocalRun | None = None  # run against a node-local tier: prefetch, write-back (:mod:`.local_run`)


@dataclass
class RunResult:
    exit_code: int
    counts: dict[str, int]
    env: dict[str, str]
    prefetched: int = 0
    published: int = 0  # new entries adopted (manifest written) in the work store
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # tiers that were down or refused
    cleared: list[str] = field(default_factory=list)  # failure logs removed: the host, not the graph, failed
    namespaces: dict[str, dict[str, int]] = field(default_factory=dict)  # counts per namespace
    compile_seconds: dict[str, float] = field(default_factory=dict)  # per entry published
    # Each graph the job missed: neffcache.misses.reported's record, read by `why-miss --from-report`.
    graphs: list[dict[str, Any]] = field(default_factory=list)
    local: dict[str, Any] | None = None  # run --local: the prefetch's and the write-backs' reports

    def to_json(self) -> dict[str, Any]:
        return {"exit_code": self.exit_code, **{k: self.counts.get(k, 0) for k in KINDS},
                "prefetched": self.prefetched, "published": self.published, "seconds": round(self.seconds, 3),
                "failures": self.failures, "problems": self.problems, "env": self.env,
                "namespaces": self.namespaces, "cleared_failures": self.cleared,
                "compile_seconds": self.compile_seconds, "graphs": self.graphs, **(self.local or {})}


def _pump(src: IO[bytes], dst: IO[bytes], counter: LogCounter) -> None:
    """Copy ``src`` to ``dst`` unchanged as it arrives; feed whole lines to ``counter``."""
    fd = src.fileno()
    pending = b""
    while True:
        chunk = os.read(fd, _CHUNK)
        if not chunk:
            break
        with contextlib.suppress(BrokenPipeError, ValueError):
            dst.write(chunk)
            dst.flush()
        # Progress bars redraw with \r: a line for counting ends at either.
        pending += chunk.replace(b"\r", b"\n")
        *lines, pending = pending.split(b"\n")
        pending = pending[-_CHUNK:]  # a newline-less flood must not grow without bound
        for line in lines:
            counter.feed(line.decode(errors="replace"))
    if pending:
        counter.feed(pending.decode(errors="replace"))


@contextlib.contextmanager
def _forward_signals(proc: subprocess.Popen[bytes], own_group: bool) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if own_group:
                os.killpg(proc.pid, signum)
            elif signum != signal.SIGINT:  # the terminal sent SIGINT to the job itself already
                os.kill(proc.pid, signum)

    previous = {sig: signal.signal(sig, handler) for sig in FORWARDED}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run_job(req: RunRequest, placement: Placement, *, stdout: IO[bytes] | None = None,
            stderr: IO[bytes] | None = None) -> RunResult:
    started = time.monotonic()
    wall_start = time.time()
    namespaces = [layout.namespace_for(req.toolchain) for layout in LAYOUTS.values()]
    local = LocalSession(req.local, placement, req.toolchain, req.tags, wall_start, req.publish) \
        if req.local is not None else None
    prefetched = 0
    if local is not None:
        prefetched = local.run_prefetch()
        cache_env, _ = local.env()
    else:
        if req.prefetch and placement.remotes:
            prefetched, _ = placement.prefetch(namespaces, tags=req.prefetch_tags or None)
        cache_env, _ = job_env(placement.work_root, req.toolchain)
    counter = LogCounter(req.patterns, placement.work_root, namespaces)
    growth = local.growth(namespaces) if local is not None else CacheGrowth(placement.work, namespaces)
    if local is not None:
        local.start_write_back(counter, namespaces)
    try:
        code = _run_process(req, {**req.base_env, **cache_env}, counter, stdout, stderr)
    finally:
        if local is not None:
            local.stop_write_back()
    if isinstance(code, OSError):
        return RunResult(127 if isinstance(code, FileNotFoundError) else 126, counter.counts(), cache_env,
                         prefetched, failures=[str(code)], local=local.report() if local is not None else None)
    result = RunResult(code, counter.counts(), cache_env, prefetched)
    result.namespaces = counter.by_namespace()
    _after(req, placement, counter, growth, namespaces, result, wall_start)
    if local is not None:
        assert isinstance(growth, LocalGrowth)
        local.count_fetched(growth, {ns.path: ns for ns in namespaces}, result.counts, result.namespaces)
        result.local = local.report()
    result.problems = placement.problem_notes()
    result.seconds = time.monotonic() - started
    return result


def _run_process(req: RunRequest, env: dict[str, str], counter: LogCounter, stdout: IO[bytes] | None,
                 stderr: IO[bytes] | None) -> int | OSError:
    """Run the job with ``env``, its output passed through and counted; its exit status, or the
    error that kept it from starting (said on stderr as a shell would)."""
    # On a terminal the job stays in our process group (Ctrl-C reaches it directly and it may
    # read the terminal); otherwise it gets its own group and every signal is forwarded to it.
    interactive = sys.stdin.isatty()
    try:
        proc = subprocess.Popen(list(req.command), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                process_group=None if interactive else 0)
    except OSError as exc:
        (stderr or sys.stderr.buffer).write(f"neffcache run: {req.command[0]}: {exc.strerror}\n".encode())
        return exc
    assert proc.stdout is not None and proc.stderr is not None
    pumps = [threading.Thread(target=_pump, args=(proc.stdout, stdout or sys.stdout.buffer, counter), daemon=True),
             threading.Thread(target=_pump, args=(proc.stderr, stderr or sys.stderr.buffer, counter), daemon=True)]
    for t in pumps:
        t.start()
    with _forward_signals(proc, own_group=not interactive):
        while True:
            try:
                status = proc.wait()
                break
            except KeyboardInterrupt:  # SIGINT with no handler installed: keep waiting for the job
                continue
    for t in pumps:
        t.join()
    return exit_status(status)


def _after(req: RunRequest, placement: Placement, counter: LogCounter, growth: CacheGrowth,
           namespaces: list[Namespace], result: RunResult, since: float) -> None:
    """Stamp hits, publish what the job compiled, report it all to the index."""
    hits = counter.entries("hit")
    failed = counter.entries("failure")
    named = [p for p in dict.fromkeys([*counter.entries("compile"), *counter.entries("success")]) if p not in failed]
    added = growth.added()
    found = [p for p in added if p not in named]
    compiled = [*named, *found]
    by_path = {ns.path: ns for ns in namespaces}

    def ns_of(path: str | None) -> Namespace:
        return namespace_of(path, namespaces) or namespaces[0]

    placement.stamp(hits)
    for path in hits:
        placement.event(EventKind.HIT, path, ns_of(path))
        if req.publish:
            placement.ingest(path, toolchain=req.toolchain, tags=req.tags, skip_managed=True)
    for kind in (EventKind.HIT, EventKind.MISS):
        for ns_path, n in counter.unnamed(kind).items():  # a user pattern's keys that name no entry
            for _ in range(n):
                placement.event(kind, None, by_path.get(ns_path) or ns_of(None))
    _count_from_cache(placement, counter, added, found, by_path, result)
    misses = counter.entries("miss")
    for path in [*misses, *(p for p in compiled if p not in misses)]:
        placement.event(EventKind.MISS, path, ns_of(path))
    for path in compiled:
        seconds = _publish_compiled(req, placement, counter, path, result, since)
        placement.event(EventKind.COMPILE, path, ns_of(path), compile_seconds=seconds)
    for event in counter.failure_lines():
        placement.event(EventKind.ERROR, event.entry, ns_of(event.entry), message=event.line[-4000:])
        result.failures.append(event.entry or event.key or event.line[:300])
    if result.exit_code != 0:
        for event in counter.compiling():
            # A runtime without failure lines (TorchNeuron raises) stopped on this graph.
            what = event.entry or event.key or event.line[:300]
            ns = by_path.get(event.namespace or "") or ns_of(event.entry)
            placement.event(EventKind.ERROR, event.entry, ns,
                            message=f"the job exited {result.exit_code} while compiling {what}")
            result.failures.append(what)
    # The runtime caches an OOM-killed or Ctrl-C'd compile like a compiler error; left there,
    # every later job on this root would skip the graph (warmers/runtime_failures.py).
    judged = judge_bucket(placement.work, failed, ttl=req.failed_ttl)
    result.cleared = judged.cleared
    for path in judged.failures:  # those still FAILED (a standing compiler error): the index's health counts them
        placement.register_failed(path, [placement.work])
    result.graphs = _missed_graphs(req, placement, misses, compiled, failed)


def _publish_compiled(req: RunRequest, placement: Placement, counter: LogCounter, path: str, result: RunResult,
                      since: float) -> float | None:
    """Adopt and publish one entry the job compiled; its compile seconds: those its manifest
    records when one was written during the run (``run --local``'s write-back adopts first, and
    the first manifest stands: the report says what the stores hold), else the runtime's lines',
    else the files' times."""
    seconds = counter.compile_seconds(path)
    if seconds is None:
        seconds = placement.compile_seconds_of(path, since)
    got = placement.ingest(path, toolchain=req.toolchain, tags=req.tags, compile_seconds=seconds) \
        if req.publish else None
    if got is None:
        return seconds
    manifest = got[0].manifest
    if manifest is not None and manifest.compile_seconds is not None:
        seconds = manifest.compile_seconds
    result.published += 1
    if seconds is not None:
        result.compile_seconds[path] = seconds
    return seconds


def _count_from_cache(placement: Placement, counter: LogCounter, added: dict[str, str], found: Sequence[str],
                      by_path: dict[str, Namespace], result: RunResult) -> None:
    """The hits, misses and compiles of runtimes counted from their cache (:mod:`.growth`): an
    entry the job added is a miss and a compile (its events follow with the published ones);
    a graph it looked up and did not add was served by the disk: a hit, named by no entry."""
    new_in: dict[str, int] = {}
    for ns_path in added.values():
        new_in[ns_path] = new_in.get(ns_path, 0) + 1
    for ns_path, looked_up in counter.lookups().items():
        served = disk_hits(looked_up, new_in.get(ns_path, 0))
        ns = by_path.get(ns_path)
        if ns is None:
            continue
        for _ in range(served):
            placement.event(EventKind.HIT, None, ns)
        result.counts["hit"] = result.counts.get("hit", 0) + served
        result.namespaces.setdefault(ns_path, dict.fromkeys(KINDS, 0))["hit"] += served
    for path in found:
        where = added.get(path)
        for kind in ("miss", "compile"):
            result.counts[kind] = result.counts.get(kind, 0) + 1
            if where is not None:
                result.namespaces.setdefault(where, dict.fromkeys(KINDS, 0))[kind] += 1


def _missed_graphs(req: RunRequest, placement: Placement, misses: Sequence[str], compiled: Sequence[str],
                   failed: Sequence[str]) -> list[dict[str, Any]]:
    """What the report says of each graph the job missed: compiled, failed, or neither (the job
    stopped first), with what the work store knows of its key's parts (for ``why-miss``)."""
    statuses = dict.fromkeys(misses, ReportedStatus.MISS)
    statuses.update(dict.fromkeys(compiled, ReportedStatus.COMPILED))
    statuses.update(dict.fromkeys(failed, ReportedStatus.FAILED))
    out = []
    for path, status in statuses.items():
        try:
            graph = reported_graph(placement.work, path, status, toolchain=req.toolchain, tags=req.tags)
        except (NeffcacheError, OSError) as exc:  # the work store changed under us: report the rest
            log.warning("%s: not described in the report: %s", path, exc)
            continue
        if graph is not None:
            out.append(graph)
    return out
