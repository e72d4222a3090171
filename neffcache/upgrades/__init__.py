"""A compiler upgrade as a measured, gated decision (docs/upgrades.md).

- :mod:`.successor`: the entry a new compiler's runtime looks up for an old compiler's graph,
  named as ``rewarm`` names it (``rewarm`` compiles into it, ``upgrade-report`` looks for it);
- :mod:`.compare`: each old graph beside its successor in the stores, weighted by its hits in
  the index (``upgrade-report``);
- :mod:`.report`: readiness, regressions (slower, bigger, newly failing), the totals and the gate;
- :mod:`.signature`: a failed compile's signature (the seam for the failure normaliser).

Read-only: nothing here writes to a store or reports to the index.
"""

from neffcache.upgrades.compare import DEFAULT_THRESHOLD, DEFAULT_WINDOW, UpgradeRequest, compare
from neffcache.upgrades.report import Build, GraphComparison, GraphStatus, Regression, UpgradeReport

__all__ = ["DEFAULT_THRESHOLD", "DEFAULT_WINDOW", "Build", "GraphComparison", "GraphStatus", "Regression",
           "UpgradeReport", "UpgradeRequest", "compare"]
