"""What a job will miss, what the misses will cost, and why a graph missed.

- :mod:`.lookup`: where each of many entry paths is held: the stores, fastest first, and the
  index in one batch request (``plan``, prefetch and ``run`` ask this);
- :mod:`.forecast`: the compile time a miss will cost (the same graph's history under other
  compilers, else a fit of compile seconds on HLO size per target) and the wall-clock time N
  warmers need for all of them;
- :mod:`.explain`: ``why-miss``: the nearest entries to a missed graph in the stores and the
  index, the difference field by field and flag by flag, and the likely cause in one line.

Read-only: nothing here writes to a store or reports to the index.
"""
