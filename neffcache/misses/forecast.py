"""What the misses will cost: compile seconds per graph, compile-hours in all, the wall-clock ETA.

Pure: the index's history comes in (:class:`~neffcache.misses.lookup.History`, gathered by
:func:`~neffcache.misses.lookup.ask_history`), numbers go out. Per missed graph, the first
that applies:

1. **the same graph** (its HLO digest) compiled before, under any compiler version: the median
   of those compile times, of the same target when there are such records, else of any target.
   The HLO is the compiler's input, so this is the best predictor there is; a new compiler
   version may still be faster or slower;
2. **a fit on HLO size**: least squares ``seconds = a + b * hlo_size`` over the index's recent
   compiles for the graph's target (``compile_samples``), clamped at zero. With one distinct
   size the mean is used. Compile time grows with the graph, but not only with its size: take
   it as an order of magnitude;
3. **unknown**: no history for the target. Such graphs are counted and named, never guessed.

The ETA is the makespan of a longest-processing-time-first schedule of the known estimates on
``parallel x hosts`` compile slots (each graph, longest first, to the slot that frees first):
with one hour-long graph and many short ones, the hour bounds the wall time, which a plain
sum divided by the slots would hide. It covers compiling only: not the workload's own tracing,
nor publishing, nor graphs of unknown cost.
"""

from __future__ import annotations

import enum
import heapq
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from neffcache.index.records import CompileSample
from neffcache.misses.lookup import History
from neffcache.misses.wanted import WantedGraph


class ForecastBasis(enum.StrEnum):
    """What a compile-time estimate rests on."""

    SAME_GRAPH = "same-graph"  # the same HLO compiled before
    SIZE_FIT = "size-fit"  # compile seconds fitted on HLO size for the target
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Line:
    """``seconds = intercept + slope * hlo_size``."""

    intercept: float
    slope: float

    def at(self, size: float) -> float:
        return max(0.0, self.intercept + self.slope * size)


def _usable(samples: Iterable[CompileSample]) -> list[CompileSample]:
    # The index is outside input: NaN, infinities and negatives never reach the arithmetic.
    return [s for s in samples if math.isfinite(s.compile_seconds) and s.compile_seconds >= 0
            and math.isfinite(s.hlo_size) and s.hlo_size > 0]


def fit(samples: Iterable[CompileSample]) -> Line | None:
    """The least-squares line through (hlo_size, compile_seconds); a flat line at the mean when
    every sample has the same size; None without samples."""
    points = _usable(samples)
    if not points:
        return None
    xs = [float(s.hlo_size) for s in points]
    ys = [s.compile_seconds for s in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        return Line(mean_y, 0.0)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    return Line(mean_y - slope * mean_x, slope)


@dataclass(frozen=True)
class Estimate:
    path: str
    seconds: float | None
    basis: ForecastBasis

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "seconds": None if self.seconds is None else round(self.seconds, 3),
                "basis": self.basis}


def estimate(graph: WantedGraph, history: History, lines: Mapping[str, Line | None] | None = None) -> Estimate:
    """The expected compile seconds of one missed graph (see the module docstring)."""
    target = graph.toolchain.target if graph.toolchain is not None else None
    seen = history.by_hlo.get(graph.hlo_sha256 or "", ())
    if seen:
        same_target = [s for t, s in seen if t == target]
        return Estimate(graph.path, statistics.median(same_target or [s for _, s in seen]), ForecastBasis.SAME_GRAPH)
    if target is not None and graph.hlo_size is not None:
        line = lines.get(target) if lines is not None else fit(history.samples.get(target, ()))
        if line is not None:
            return Estimate(graph.path, line.at(graph.hlo_size), ForecastBasis.SIZE_FIT)
    return Estimate(graph.path, None, ForecastBasis.UNKNOWN)


def makespan(durations: Iterable[float], slots: int) -> float:
    """Wall time of a longest-processing-time-first schedule of ``durations`` on ``slots``."""
    loads = [0.0] * max(1, slots)
    for seconds in sorted(durations, reverse=True):
        heapq.heapreplace(loads, loads[0] + seconds)  # the least loaded slot takes the next longest
    return max(loads)


@dataclass(frozen=True)
class Forecast:
    estimates: tuple[Estimate, ...]
    parallel: int = 1
    hosts: int = 1

    @property
    def slots(self) -> int:
        return max(1, self.parallel) * max(1, self.hosts)

    @property
    def known(self) -> list[float]:
        return [e.seconds for e in self.estimates if e.seconds is not None]

    @property
    def unknown(self) -> list[str]:
        return [e.path for e in self.estimates if e.seconds is None]

    @property
    def compile_seconds(self) -> float:
        return sum(self.known)

    @property
    def eta_seconds(self) -> float:
        return makespan(self.known, self.slots)

    def to_json(self) -> dict[str, Any]:
        return {"graphs": len(self.estimates), "estimated": len(self.known), "unknown": len(self.unknown),
                "compile_seconds": round(self.compile_seconds, 3),
                "compile_hours": round(self.compile_seconds / 3600, 6),
                "parallel": self.parallel, "hosts": self.hosts, "slots": self.slots,
                "eta_seconds": round(self.eta_seconds, 3),
                "by_basis": {b.value: sum(1 for e in self.estimates if e.basis is b) for b in ForecastBasis},
                "estimates": [e.to_json() for e in self.estimates]}


def forecast(misses: Sequence[WantedGraph], history: History, *, parallel: int = 1, hosts: int = 1) -> Forecast:
    """Estimates for every missed graph (each path once) and the schedule they need."""
    targets = {g.toolchain.target for g in misses if g.toolchain is not None}
    lines = {t: fit(history.samples.get(t, ())) for t in targets}  # one fit per target, not per graph
    unique = list({g.path: g for g in misses}.values())
    return Forecast(tuple(estimate(g, history, lines) for g in unique), parallel, hosts)
