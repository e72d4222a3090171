"""What ``neffcache upgrade-report`` found: each old graph beside its successor, and the verdicts.

Pure data and arithmetic (no I/O): :mod:`.compare` fills it from the stores and the index.

- **readiness**: the hit-weighted share of the old compiler's graphs whose successor is SUCCESS
  (the rule and its floor: :mod:`neffcache.readiness`);
- **regressions**: per graph with both builds known, compile seconds and NEFF bytes new / old
  above ``threshold``; graphs that compiled under the old compiler and fail under the new one,
  with the failure's signature;
- **totals**: the compile hours the shadow rewarm cost (the successors' recorded compile
  seconds), and the compile hours the fleet would pay on its first day after switching now:
  every hot graph still missing (hit in the window; every missing graph when hits are unknown),
  compiled once, at its new compile time where known, else its old one;
- **gate**: below the gate's readiness, or with any new failure, the upgrade is not ready.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from neffcache.entry import EntryState
from neffcache.layouts.flags_form import FormDecision
from neffcache.readiness import UNUSED_WEIGHT, graph_weight, readiness


class GraphStatus(enum.StrEnum):
    """Where an old graph stands under the new compiler."""

    READY = "ready"  # its successor is SUCCESS: jobs will hit it
    MISSING = "missing"  # no successor in any store (not rewarmed yet, or lost)
    FAILING = "failing"  # its successor FAILED: it compiled before and fails now
    UNUSABLE = "unusable"  # its successor is LOCKED, EMPTY or CORRUPT: nothing to serve
    UNNAMED = "unnamed"  # its successor's name cannot be computed (see the reason)


class Regression(enum.StrEnum):
    SLOWER = "slower"  # compile seconds grew past the threshold
    BIGGER = "bigger"  # NEFF bytes grew past the threshold


@dataclass(frozen=True)
class Build:
    """One compiler's entry of a graph, as a store holds it."""

    path: str
    store: str
    state: EntryState
    compile_seconds: float | None = None
    neff_bytes: int | None = None
    failure: str | None = None  # FAILED: the failure's signature (.signature)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "store": self.store, "state": self.state.value,
                "compile_seconds": self.compile_seconds, "neff_bytes": self.neff_bytes, "failure": self.failure}


@dataclass(frozen=True)
class GraphComparison:
    """An old graph (a SUCCESS entry of the old compiler), its successor, its hits in the window."""

    old: Build
    hits: int
    new_path: str | None = None  # None: see reason
    new: Build | None = None
    reason: str | None = None  # why new_path is None

    @property
    def status(self) -> GraphStatus:
        if self.new_path is None:
            return GraphStatus.UNNAMED
        if self.new is None:
            return GraphStatus.MISSING
        if self.new.state is EntryState.SUCCESS:
            return GraphStatus.READY
        return GraphStatus.FAILING if self.new.state is EntryState.FAILED else GraphStatus.UNUSABLE

    @property
    def weight(self) -> float:
        return graph_weight(self.hits)

    def ratio(self, what: Regression) -> float | None:
        """New / old compile seconds (SLOWER) or NEFF bytes (BIGGER); None unless both are known
        and the successor is SUCCESS."""
        if self.new is None or self.new.state is not EntryState.SUCCESS:
            return None
        if what is Regression.SLOWER:
            old, new = self.old.compile_seconds, self.new.compile_seconds
        else:
            old, new = self.old.neff_bytes, self.new.neff_bytes
        if old is None or new is None or old <= 0:
            return None
        return new / old

    def first_day_seconds(self) -> float | None:
        """What compiling it once costs under the new compiler: its new time where known, else its old."""
        if self.new is not None and self.new.compile_seconds is not None:
            return self.new.compile_seconds
        return self.old.compile_seconds

    def to_json(self) -> dict[str, Any]:
        return {"path": self.old.path, "new_path": self.new_path, "status": self.status.value, "hits": self.hits,
                "weight": self.weight, "reason": self.reason, "old": self.old.to_json(),
                "new": self.new.to_json() if self.new is not None else None,
                "compile_ratio": self.ratio(Regression.SLOWER), "neff_ratio": self.ratio(Regression.BIGGER)}


@dataclass
class UpgradeReport:
    from_version: str
    to_version: str
    stores: list[str]
    window: tuple[float, float]  # (since, until), epoch seconds
    threshold: float
    hits_known: bool  # False without an index: every graph weighs the floor
    graphs: list[GraphComparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # How the flags form of each new neuronxcc namespace was decided: the successors' names follow it.
    flags_forms: list[FormDecision] = field(default_factory=list)

    # -- readiness --------------------------------------------------------------------------
    def readiness(self) -> float | None:
        ready = [g for g in self.graphs if g.status is GraphStatus.READY]
        return readiness(len(self.graphs), sum(g.hits for g in self.graphs), len(ready), sum(g.hits for g in ready))

    def missing(self) -> list[GraphComparison]:
        """Every graph not ready, the most hit first."""
        return sorted((g for g in self.graphs if g.status is not GraphStatus.READY),
                      key=lambda g: (-g.hits, g.old.path))

    # -- regressions ----------------------------------------------------------------------
    def grown(self, what: Regression) -> list[GraphComparison]:
        """Graphs whose compile seconds (SLOWER) or NEFF bytes (BIGGER) grew past the threshold."""
        found = [g for g in self.graphs if (r := g.ratio(what)) is not None and r > self.threshold]
        return sorted(found, key=lambda g: (-(g.ratio(what) or 0.0), g.old.path))

    def new_failures(self) -> list[GraphComparison]:
        return sorted((g for g in self.graphs if g.status is GraphStatus.FAILING), key=lambda g: (-g.hits, g.old.path))

    # -- totals ---------------------------------------------------------------------------
    def rewarm_seconds(self) -> float:
        """Compile seconds the successors that are SUCCESS recorded (failed compiles record none)."""
        return sum(g.new.compile_seconds for g in self.graphs
                   if g.status is GraphStatus.READY and g.new is not None and g.new.compile_seconds is not None)

    def first_day(self) -> tuple[list[GraphComparison], float, int]:
        """(hot graphs still missing, their compile seconds, how many of them have no known time)."""
        hot = [g for g in self.missing() if g.hits > 0 or not self.hits_known]
        times = [g.first_day_seconds() for g in hot]
        return hot, sum(t for t in times if t is not None), sum(1 for t in times if t is None)

    # -- the gate -------------------------------------------------------------------------
    def gate_reasons(self, fraction: float) -> list[str]:
        """Why the upgrade fails a gate of ``fraction`` readiness (empty: it passes)."""
        reasons = []
        ready = self.readiness()
        if ready is None or ready < fraction:
            shown = "unknown" if ready is None else f"{ready:.1%}"
            reasons.append(f"readiness {shown} is below the gate {fraction:.1%}")
        failing = self.new_failures()
        if failing:
            reasons.append(f"{len(failing)} graph{'' if len(failing) == 1 else 's'} compiled by "
                           f"{self.from_version} fail{'s' if len(failing) == 1 else ''} under {self.to_version}")
        return reasons

    def to_json(self, gate: float | None = None) -> dict[str, Any]:
        hot, first_day, unknown = self.first_day()
        reasons = self.gate_reasons(gate) if gate is not None else []
        ready = [g for g in self.graphs if g.status is GraphStatus.READY]

        def rows(graphs: list[GraphComparison]) -> list[dict[str, Any]]:
            return [g.to_json() for g in graphs]

        return {
            "from_compiler": self.from_version, "to_compiler": self.to_version, "stores": self.stores,
            "window": {"since": self.window[0], "until": self.window[1]},
            "weights": {"by": "hits" if self.hits_known else "none", "unused_weight": UNUSED_WEIGHT,
                        "rule": f"weight = hits in the window + {UNUSED_WEIGHT:g}"},
            "threshold": self.threshold,
            "readiness": self.readiness(), "graphs": len(self.graphs), "ready": len(ready),
            "missing": rows(self.missing()),
            "regressions": {"slower": rows(self.grown(Regression.SLOWER)),
                            "bigger": rows(self.grown(Regression.BIGGER)),
                            "new_failures": rows(self.new_failures())},
            "totals": {"rewarm_compile_hours": self.rewarm_seconds() / 3600,
                       "first_day_compile_hours": first_day / 3600, "first_day_graphs": len(hot),
                       "first_day_unknown": unknown},
            "gate": {"fraction": gate, "passed": None if gate is None else not reasons, "reasons": reasons},
            "notes": self.notes,
            "flags_forms": [d.to_json() for d in self.flags_forms],
            "by_graph": rows(sorted(self.graphs, key=lambda g: g.old.path)),
        }
