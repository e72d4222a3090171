"""The scan engine: what a store holds, entry by entry or as totals, at ``find``'s speed.

A scan's parts and what passes between them (docs/architecture.md, "The scan engine"):
``plan`` (what the scan tells a store's walk, from the layouts' one question per directory),
the store's ``walk`` (neffcache/stores/walk.py: one stream of listings, counted totals and
in-step batches), ``grouping`` (listed files to entries, and the judging both consumers share),
and the consumers: ``summary`` (totals, in ``tally``, and single entries to ``sinks``) and
``report`` (the full report, every entry kept).

Imports values, stores and layouts only.
"""
