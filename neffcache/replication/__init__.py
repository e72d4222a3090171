"""Work between stores, or between a store and the index: push and pull (`sync`, with its
report in `sync_report`), tier chains (`tiers`) and reconciling the index with a store
(`reconcile`). Pruning, the other between-store operation, is its own package, `prune/`.

Imports every layer below it (docs/architecture.md).
"""
