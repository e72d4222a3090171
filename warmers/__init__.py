"""Compile-only warm-ups, re-warms after compiler bumps, and wrapped jobs (``neffcache.warmers``).

Built on the library only (the library never imports this package):

- :mod:`.warm` runs a workload over shape buckets (:mod:`.matrix`), one-phase or two-phase;
- :mod:`.rewarm` recompiles an old compiler's stored HLOs with the installed one;
- :mod:`.wrap` wraps a real job (``neffcache run``);
- :mod:`.plan` tells before a job runs what it will miss and what that costs (``neffcache plan``):
  :mod:`.discovery` runs it against a scratch cache with :mod:`.recorder`, a ``neuronx-cc`` that
  records compiles and writes placeholders;
- :mod:`.compiling` is the leased, memory-aware compile pool both warm-ups share;
- :mod:`.placement` says where work happens, what is published where, what the index hears.
"""
