"""``neffcache plan``: know before you run whether a job's NEFFs are cached, and what the misses cost.

1. *discover* (:mod:`.discovery`): the job runs once per bucket, compile-only, against a private
   scratch cache with the recording compiler first on PATH: nothing is compiled, nothing reaches
   a real store, and every entry path the runtime will look up is known;
2. *look up* (:mod:`neffcache.misses.lookup`): each path in the configured stores, fastest
   first, and in the index, in one batch request;
3. *forecast* (:mod:`neffcache.misses.forecast`): the compile seconds of each miss from the
   index's history, compile-hours in all, and the wall time ``parallel x hosts`` warmers need;
4. with ``--warm``, *compile exactly the misses* with the warm-ups' compile pool
   (:class:`~.compiling.CompilePool`: leased, pooled, published to every writable tier) from the
   recorded HLOs and flags, before the scratch directory goes.

The scratch directory is removed when the plan ends, however it ends (:class:`~.discovery.Scratch`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from neffcache.misses.forecast import Forecast, forecast
from neffcache.misses.lookup import HeldStatus, IndexQuestions, LookupReport, ask_history, lookup
from neffcache.misses.wanted import WantedGraph
from neffcache.stores.base import Store

from .children import Children, wait_all
from .compiling import CompileJob, CompilePool, record_outcome
from .discovery import BucketGraphs, GraphSource, Scratch, discover_bucket, discovery_failed, version_text
from .matrix import shard_buckets
from .memory import MemoryGate
from .placement import Placement
from .report import CompileStatus, WarmReport
from .warm import WarmRequest, outcome_line

Progress = Callable[[str], None]


@dataclass
class PlanRequest:
    warm: WarmRequest  # the warm-up this plan forecasts: command, toolchain, buckets, shard, parallel
    installed_version: str | None = None  # `neuronx-cc --version` of the installed compiler, if any
    extract: bool = True  # neuronxcc: extract graphs only (no compiler call at all)
    hosts: int = 1  # warmers the ETA assumes, each running `parallel` compiles
    compile_misses: bool = False  # --warm


@dataclass
class PlanReport:
    toolchain: dict[str, Any]
    stores: list[str]
    buckets: list[BucketGraphs] = field(default_factory=list)
    found: LookupReport | None = None
    forecast: Forecast | None = None
    notes: list[str] = field(default_factory=list)
    warm: WarmReport | None = None
    scratch_removed: bool = False
    seconds: float = 0.0
    interrupted: bool = False
    outcomes: dict[str, CompileStatus] = field(default_factory=dict)  # --warm: how each miss's compile ended

    def status(self, graph: WantedGraph) -> HeldStatus:
        return self.found.status(graph.path) if self.found is not None else HeldStatus.MISS

    @property
    def graphs(self) -> list[WantedGraph]:
        """Every graph once (the first bucket that looks it up names it)."""
        return list({g.path: g for b in self.buckets for g in b.graphs}.values())

    @property
    def misses(self) -> list[WantedGraph]:
        return [g for g in self.graphs if self.status(g) is not HeldStatus.HIT]

    @property
    def failed_buckets(self) -> list[str]:
        return discovery_failed([b.group for b in self.buckets])

    def still_missing(self) -> list[WantedGraph]:
        """The misses a ``--warm`` did not compile or find in a tier (all of them without --warm)."""
        return [g for g in self.misses if self.outcomes.get(g.path) not in (CompileStatus.COMPILED, CompileStatus.HIT)]

    def graph_json(self, graph: WantedGraph) -> dict[str, Any]:
        assert self.found is not None
        return {**graph.to_json(), **self.found.holding(graph.path).to_json(self.found.stores)}

    def to_json(self) -> dict[str, Any]:
        rows = [{"bucket": b.bucket.name, "status": b.group.status, "exit_code": b.group.exit_code,
                 "seconds": round(b.group.seconds, 3), "log": b.group.log,
                 "failures": [f.to_json() for f in b.group.failures], "graphs": len(b.graphs),
                 "misses": sum(1 for g in b.graphs if self.status(g) is not HeldStatus.HIT),
                 "recorded_compiles": b.recorded, "unmatched_compiles": b.unmatched} for b in self.buckets]
        return {"command": "plan", "toolchain": self.toolchain, "stores": self.stores,
                "index": bool(self.found and self.found.index_asked),
                "graphs": [self.graph_json(g) for g in self.graphs], "buckets": rows,
                "totals": {"graphs": len(self.graphs), "hits": len(self.graphs) - len(self.misses),
                           "misses": len(self.misses)},
                "forecast": self.forecast.to_json() if self.forecast else None,
                "warm": self.warm.to_json() if self.warm else None, "notes": self.notes,
                "discovery_failed": self.failed_buckets, "scratch_removed": self.scratch_removed,
                "seconds": round(self.seconds, 3), "interrupted": self.interrupted}


class Planner:
    def __init__(self, req: PlanRequest, stores: Sequence[Store], index: IndexQuestions | None, children: Children,
                 progress: Progress | None = None, placement: Placement | None = None) -> None:
        self.req = req
        self.stores = list(stores)
        self.index = index
        self.children = children
        self.progress = progress or (lambda message: None)
        self.placement = placement  # --warm: where the pool publishes
        self.report = PlanReport({**req.warm.toolchain.to_json(), "instance": req.warm.instance},
                                 [s.url for s in self.stores])

    def run(self) -> PlanReport:
        started = time.monotonic()
        try:
            with Scratch(self.children) as scratch:
                scratch.install(version_text(self.req.warm.toolchain, self.req.installed_version))
                self._discover(scratch)
                if not self.children.stopping.is_set():
                    self._look_up()
                    if self.req.compile_misses and self.report.misses:
                        self.report.warm = self._compile(self._sources())
            self.report.scratch_removed = scratch.removed
        except KeyboardInterrupt:
            self.report.interrupted = True
            raise
        finally:
            self.report.seconds = time.monotonic() - started
        self.report.notes = list(dict.fromkeys(self.report.notes))
        return self.report

    def _discover(self, scratch: Scratch) -> None:
        req = self.req.warm
        buckets = shard_buckets(req.buckets, req.shard)
        self.progress(f"discovering the graphs of {len(buckets)} bucket(s), {req.parallel} at a time, without "
                      f"compiling (scratch {scratch.dir})")

        def one(bucket: Any) -> BucketGraphs:
            found = discover_bucket(req, scratch, bucket, self.children, extract=self.req.extract)
            self.progress(f"  bucket {bucket.name}: {len(found.graphs)} graphs in {found.group.seconds:.1f}s"
                          + ("" if found.group.status.severity == 0 else f" [{found.group.status.upper()}]"))
            return found

        with ThreadPoolExecutor(max(1, req.parallel), thread_name_prefix="neffcache-plan") as workers:
            futures = [workers.submit(one, b) for b in buckets]
            wait_all(futures)
        self.report.buckets = [f.result() for f in futures]
        for found in self.report.buckets:
            if found.unmatched:
                self.report.notes.append(f"bucket {found.bucket.name}: {found.unmatched} recorded compile(s) left no "
                                         "entry under the scratch root: that runtime caches elsewhere")
        if not buckets:
            self.report.notes.append(f"shard {req.shard.label} has no buckets ({len(req.buckets)} in all)")

    def _look_up(self) -> None:
        graphs = self.report.graphs
        self.progress(f"looking up {len(graphs)} graph(s) in {len(self.stores)} store(s)"
                      + (" and the index" if self.index is not None and self.index.enabled else ""))
        found = lookup([g.path for g in graphs], self.stores, self.index)
        self.report.found = found
        self.report.notes.extend(found.notes)
        misses = self.report.misses
        targets = [g.toolchain.target for g in misses if g.toolchain is not None]
        history = ask_history(self.index, [g.hlo_sha256 for g in misses if g.hlo_sha256], targets)
        self.report.notes.extend(history.notes)
        self.report.forecast = forecast(misses, history, parallel=self.req.warm.parallel, hosts=self.req.hosts)

    def _sources(self) -> Mapping[str, tuple[str, GraphSource, WantedGraph]]:
        """For every miss: the bucket that found it (the first), where its HLO lies, the graph."""
        out: dict[str, tuple[str, GraphSource, WantedGraph]] = {}
        misses = {g.path for g in self.report.misses}
        for found in self.report.buckets:
            for graph in found.graphs:
                source = found.sources.get(graph.path)
                if graph.path in misses and source is not None and graph.path not in out:
                    out[graph.path] = (found.bucket.name, source, graph)
        for path in sorted(misses - out.keys()):
            self.report.notes.append(f"{path}: no HLO was kept for it, so --warm cannot compile it; "
                                     "`neffcache warm` does")
        return out

    def _compile(self, sources: Mapping[str, tuple[str, GraphSource, WantedGraph]]) -> WarmReport:
        req, placement = self.req.warm, self.placement
        assert placement is not None
        report = WarmReport("warm", self.report.toolchain, [], [s.url for s in placement.tiers], "plan --warm",
                            req.shard.label, req.parallel)
        for name in dict.fromkeys(group for group, _, _ in sources.values()):
            report.group(name)
        self.progress(f"compiling the {len(sources)} missing graph(s), {req.parallel} at a time")
        pool = CompilePool(placement, req.compiler, self.children, parallel=req.parallel, timeout=req.compile_timeout,
                           memory=MemoryGate(req.compile_memory_mb), retry_failed=req.retry_failed,
                           on_done=lambda o: self.progress(outcome_line(o)), failed_ttl=req.failed_ttl)
        jobs = [CompileJob(group, src.namespace, graph.key, src.store, src.hlo_path, src.flags,
                           graph.toolchain or req.toolchain, graph.tags)
                for group, src, graph in sources.values()]
        started = time.monotonic()
        for outcome in pool.run(jobs):
            record_outcome(report, outcome)
            self.report.outcomes[outcome.job.path] = outcome.status
        if not self.children.stopping.is_set():
            # A graph the work store held (a hit for the pool) but a lower tier lacked goes down too.
            report.published += placement.catch_up(list(dict.fromkeys(job.namespace for job in jobs)))
        report.seconds = time.monotonic() - started
        report.problems.extend(placement.problem_notes())
        return report

