"""What a job will miss, what the misses will cost, and why a graph missed.

- :mod:`.lookup`: where each of many entry paths is held: the stores, fastest first, and the
  index in one batch request (``plan``, prefetch and ``run`` ask this);
- :mod:`.forecast`: the compile time a miss will cost (the same graph's history under other
  compilers, else a fit of compile seconds on HLO size per target) and the wall-clock time N
  warmers need for all of them;
- ``why-miss``: :mod:`.explain` (a missed graph against one entry, field by field, and the
  ranking), :mod:`.flagdiff` (flags option by option), :mod:`.causes` (the likely cause and the
  fix in one line), :mod:`.nearest` (the nearest entries in the stores and the index),
  :mod:`.inputs` (a key, an entry path, an HLO file or a report as the missed graph) and
  :mod:`.reported` (what ``run --report`` records of the graphs a job missed).

Read-only: nothing here writes to a store or reports to the index.
"""
