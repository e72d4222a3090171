"""Running one workload (one bucket of a warm-up) as a real subprocess, and reading what it did.

The workload runs in its own process group with its output (stdout and stderr together)
going to a per-bucket log file; every line also goes through the log patterns, so the
runtime's hit/miss/compile/failure lines become entry paths. When it ends, how it ended
decides the bucket's status:

- exit 0: ok, unless the runtime reported failed graphs;
- non-zero with failure lines: ``failed`` (the runtime raises when a graph fails to compile);
- non-zero without them, or killed by a signal: ``crashed``, with the last lines of output;
- past ``--timeout``: stopped (SIGTERM, then SIGKILL) and ``timeout``;
- a server that prints its ready line (a layout's, e.g. uvicorn's for vLLM-Neuron: its
  start-up compiles are over) is stopped there (SIGINT, SIGTERM, SIGKILL) and ``ok``, however
  it took the signal: serving was never the point of a warm-up.

A workload that dies mid-compile may leave the runtime's lock in the entry (neuronxcc's
``model.hlo_module.pb.lock``), on which every later job would wait forever, or a NEFF without
its commit marker. The runtime only logs its compile call once it holds that lock, and the
call names the entry (by its MODULE name, even when it compiles in a work directory outside
the cache), so what is left on an entry our (now dead) workload was compiling is ours to clean.

A runtime without a failure line (TorchNeuron's native backend raises) that exits non-zero
with a graph it never finished (a miss with no stored NEFF) has failed on that graph.
"""

from __future__ import annotations

import logging
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from neffcache.entry import EntryState, Namespace
from neffcache.layouts import LAYOUTS, Layout, get_layout, locate
from neffcache.scan.report import load_entry
from neffcache.stores.base import Store

from .children import Children, exit_status, stop_ready_server
from .logscan import LogCounter, Pattern
from .report import FailureKind, GroupReport, GroupStatus

log = logging.getLogger(__name__)
# Any absolute path a line mentions: those under the root that a layout locates name entries
# (graph extraction has no standard log line).
_ABS_PATH = re.compile(r"(?P<path>/[^\s'\",\[\]]+)")
_TAIL_LINES = 12


@dataclass
class WorkloadRun:
    """One finished workload: its report row, its events, every entry its output named."""

    group: GroupReport
    counter: LogCounter
    mentioned: list[str] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)
    started: float = 0.0  # wall clock, to tell our files from older ones
    ready: bool = False  # a server said it was up (its compiles done) and was stopped there
    served: int = 0  # graphs counted from a node-local tier (warmers/node_tiers.py), not from lines


def run_workload(name: str, argv: Sequence[str], env: Mapping[str, str], *, children: Children,
                 patterns: Sequence[Pattern], root: str, namespaces: Sequence[Namespace], log_path: Path,
                 timeout: float | None, live_groups: set[int] | None = None) -> WorkloadRun:
    group = GroupReport(name, log=str(log_path))
    counter = LogCounter(patterns, root, namespaces)
    run = WorkloadRun(group, counter, started=time.time())
    mentioned: dict[str, None] = {}
    prefix = root.rstrip("/") + "/"
    tail: list[str] = []
    started = time.monotonic()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as out:
        try:
            proc = children.spawn(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as exc:
            group.worsen(GroupStatus.CRASHED)
            group.fail("workload", FailureKind.CRASH, f"cannot start {argv[0]!r}: {exc.strerror or exc}")
            return run
        if live_groups is not None:
            live_groups.add(proc.pid)

        watch = _ready_watch(proc, children, run)

        def read() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                out.write(raw)
                line = raw.decode(errors="replace")
                counter.feed(line)
                watch(line)
                if prefix in line:
                    for found in _entries_under(prefix, line):
                        mentioned.setdefault(found)
                tail.append(line.rstrip("\n"))
                del tail[:-_TAIL_LINES]

        reader = threading.Thread(target=read, name=f"workload-output:{name}", daemon=True)
        reader.start()
        try:
            status = children.wait(proc, timeout)
        finally:
            if live_groups is not None:
                live_groups.discard(proc.pid)
        # The pipe closes when the last process of the group exits; children.wait killed them.
        reader.join(timeout=children.grace + 5)
    group.seconds = time.monotonic() - started
    run.mentioned = [*counter.entries("hit"), *counter.entries("compile"), *counter.entries("miss"),
                     *counter.entries("success"), *counter.entries("failure"), *mentioned]
    run.mentioned = list(dict.fromkeys(run.mentioned))
    run.tail = tail
    _classify(run, status, timeout, children)
    return run


def _classify(run: WorkloadRun, status: int | None, timeout: float | None, children: Children) -> None:
    group, counter = run.group, run.counter
    if children.stopping.is_set():
        group.worsen(GroupStatus.INTERRUPTED)
        group.exit_code = None if status is None else exit_status(status)
        return
    if run.ready:  # a server stopped once it was up: done, however it took the signal
        group.exit_code = None if status is None else exit_status(status)
        return
    if status is None:
        group.worsen(GroupStatus.TIMEOUT)
        group.fail("workload", FailureKind.TIMEOUT, f"the workload ran past --timeout {timeout:g}s and was stopped "
                                          f"(SIGTERM, then SIGKILL); see {group.log}")
        return
    group.exit_code = exit_status(status)
    if status == 0:
        return
    if counter.count("failure") or (status > 0 and unfinished(counter)):
        group.worsen(GroupStatus.FAILED)  # the graphs' own failures are listed by the caller
        return
    group.worsen(GroupStatus.CRASHED)
    how = f"was killed by {signal.Signals(-status).name}" if status < 0 else f"exited {status}"
    last = " | ".join(_clip(line) for line in run.tail[-2:] if line.strip()) or "no output"
    group.fail("workload", FailureKind.CRASH, f"the workload {how}: {last} (log: {group.log})")


def _ready_watch(proc: subprocess.Popen[bytes], children: Children, run: WorkloadRun) -> Callable[[str], None]:
    """What reads each output line for a server's ready line (a layout's
    :meth:`~neffcache.layouts.base.Layout.is_ready_line`: its start-up, compiles included, is
    over): on the first, the run is marked ready and the server stopped as its operator would
    (:func:`.children.stop_ready_server`, in a thread: the output must keep draining)."""
    layouts = [lay for lay in LAYOUTS.values() if type(lay).is_ready_line is not Layout.is_ready_line]

    def watch(line: str) -> None:
        if run.ready or not any(lay.is_ready_line(line) for lay in layouts):
            return
        run.ready = True
        threading.Thread(target=stop_ready_server, args=(proc, children.grace), name="workload-ready-stop",
                         daemon=True).start()

    return watch


def unfinished(counter: LogCounter) -> list[str]:
    """Graphs a run left mid-compile: entry paths, or the runtime's keys where no entry is named."""
    return [e.entry or e.key or e.line for e in counter.compiling()]


def namespace_of(path: str | None, namespaces: Sequence[Namespace]) -> Namespace | None:
    """The run's namespace ``path`` (an entry's store path) lies in."""
    if path is None:
        return None
    return next((ns for ns in namespaces if ns.path and path.startswith(ns.path + "/")), None)


def _entries_under(prefix: str, line: str) -> list[str]:
    out = []
    for match in _ABS_PATH.finditer(line):
        path = match.group("path").rstrip(".")
        if path.startswith(prefix):
            found = locate(path[len(prefix):])
            if found is not None:
                out.append(found.path)
    return out


def clean_after_dead_workload(store: Store, run: WorkloadRun) -> list[str]:
    """Undo what a stopped or crashed runtime left half done on the entries it was compiling.

    The runtime holds its lock in the entry while it compiles (neuronxcc) and writes the NEFF
    before its commit marker; killed in between it leaves a lock on which every later job
    waits forever, or a NEFF no runtime will serve. Both are removed (NEFF first, then the
    lock), so the entry reads as pending (EMPTY) and is compiled again by the next run. Only
    locks at least as new as the run are touched: older ones are another job's.
    """
    cleaned = []
    counter = run.counter
    paths = dict.fromkeys([*counter.entries("compile"), *(e.entry for e in counter.compiling() if e.entry)])
    for path in paths:
        entry = load_entry(store, path, read_manifest=False)
        if entry is None or entry.state is EntryState.SUCCESS:
            continue
        layout = get_layout(entry.layout)
        stale = [n for n in layout.locks_of(entry) if entry.files[n].mtime >= run.started - 1]
        neff = layout.neff_of(entry)
        orphan = [neff] if (neff is not None and neff != entry.marker_name and entry.marker_name not in entry.files
                            and entry.manifest_name not in entry.files) else []
        if stale or orphan:
            store.delete([entry.store_path(n) for n in [*orphan, *stale]])
            cleaned.append(path)
            log.warning("cleaned up after a stopped workload on %s: removed %s", path, ", ".join([*orphan, *stale]))
    return cleaned


def _clip(line: str, limit: int = 240) -> str:
    line = line.strip()
    return line if len(line) <= limit else line[: limit - 3] + "..."
