"""Pruning caches, always as a plan first: build a :class:`PrunePlan` with :func:`plan_prune`,
show it, act on it with :func:`execute_plan`.

The package has one import direction, each module importing only those before it:

``value`` (what a size budget evicts first: the value policy or LRU, pure) ← ``model``
(policy, reasons, items, the plan and its result, as data) ← ``candidates`` (what the
rules see) ← ``costs`` (compile seconds and hits, from manifests and the index) ← ``rules``
(toolchain, age, size, failed) ← ``sweep`` (stale locks and leases, garbage, retention) ←
``guard`` (plans that look like mistakes) ← ``remove`` (delete order and the journal of a
chunk) ← ``plan`` (:func:`plan_prune`) ← ``reserve`` (the space a prune keeps on a store
that can fill) ← ``run`` (one store's re-checked removal) ← ``execute`` (:func:`execute_plan`).
"""

from neffcache.prune.execute import PRUNE_LEASE, describe, execute_plan
from neffcache.prune.guard import refusal
from neffcache.prune.model import (
    ALL_STORES,
    Budget,
    FailedSelect,
    Foreign,
    Guard,
    ItemKind,
    Kept,
    LastUseBasis,
    PruneItem,
    PrunePlan,
    PrunePolicy,
    PruneResult,
    Reason,
    Rule,
)
from neffcache.prune.plan import CURRENT, plan_prune, resolve_keep_compilers
from neffcache.prune.remove import JOURNAL_DIR, delete_order
from neffcache.prune.run import PHASE_PAUSE_ENV
from neffcache.prune.value import Retention, ValuePolicy
from neffcache.toolchain import version_key

__all__ = [
    "ALL_STORES", "CURRENT", "JOURNAL_DIR", "PHASE_PAUSE_ENV", "PRUNE_LEASE", "Budget", "FailedSelect",
    "Foreign", "Guard", "ItemKind", "Kept", "LastUseBasis", "PruneItem", "PrunePlan", "PrunePolicy", "PruneResult",
    "Reason", "Retention", "Rule", "ValuePolicy", "delete_order", "describe", "execute_plan", "plan_prune", "refusal",
    "resolve_keep_compilers", "version_key",
]
