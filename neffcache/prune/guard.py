"""Guard rails: a prune plan that looks like a mistake is refused unless forced.

A typo in ``--keep-compiler`` (``2.27`` for ``2.27.5334.0+f702b353``) once planned the removal
of every entry of the current compiler, and ``--yes`` emptied the cache. Two checks stop that:

- a **keep filter that matches nothing** (a ``--keep-compiler`` version no entry of any store
  has) is a configuration error naming the versions present: :func:`check_keep_filters`;
- a **plan that removes** entries for a size budget it still cannot meet, every entry of a
  store, every entry of the newest toolchain of a store (per target and LNC, newest by
  :func:`neffcache.toolchain.version_key`), or more than ``max_share`` of a store's entry
  bytes carries a :class:`Guard` per rule it trips, and
  its execution is refused (:class:`neffcache.errors.RefusedPlan`) unless forced.

The rules count committed entries that hold compiled work: failed compiles, uncommitted writes
and loose files (garbage, locks, leases) never trip them, so ``--failed``, ``--garbage`` and
``--stale-locks`` plans are never refused.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from neffcache.entry import EntryState
from neffcache.errors import ConfigError, RefusedPlan
from neffcache.prune.candidates import PruneCandidate, toolchain_label
from neffcache.prune.model import Budget, Guard, ItemKind, PruneItem, PrunePlan, PrunePolicy, Reason, Rule
from neffcache.prune.rules import TargetLnc
from neffcache.toolchain import version_key

# Half a percentage point: removing an old toolchain after a re-warm removes about half of the
# bytes, and the same graphs' manifests differ by a few bytes between compilers (times, floats):
# 50.01% is still "half", and the message shows whole percents.
SHARE_SLACK = 0.005


def check_keep_filters(candidates: Iterable[PruneCandidate], policy: PrunePolicy) -> None:
    """Raise ConfigError when a ``--keep-compiler`` version matches no entry of any store.

    ``current`` (the installed compiler) is exempt: right after a compiler bump it has no
    entries yet, and a plan that then empties the store is stopped by the plan rules instead.
    Versions are matched exactly — a prefix is never taken for a version.
    """
    if not policy.keep_compilers:
        return
    present = {c.compiler_version for c in candidates if c.compiler_version}
    missing = [v for v in policy.keep_compilers if v not in present and v != policy.current]
    if missing and present:
        listed = ", ".join(sorted(present, key=version_key))
        raise ConfigError(f"--keep-compiler {', '.join(missing)} matches no entry in the stores (versions "
                          f"present: {listed}); name an exact version or 'current'. Nothing was changed")


def _counted(c: PruneCandidate) -> bool:
    return c.committed and c.state is not EntryState.FAILED


def guard_plan(candidates: Sequence[PruneCandidate], items: Iterable[PruneItem], policy: PrunePolicy) -> list[Guard]:
    """The rules ``items`` trip, per store."""
    removed = {(i.store, i.path) for i in items if i.kind is ItemKind.ENTRY}
    by_store: dict[str, list[PruneCandidate]] = defaultdict(list)
    for c in candidates:
        if _counted(c):
            by_store[c.store].append(c)
    out: list[Guard] = []
    for store, mine in by_store.items():
        gone = [c for c in mine if (store, c.path) in removed]
        if not gone:
            continue
        n, total = len(gone), len(mine)
        size, total_size = sum(c.size for c in gone), sum(c.size for c in mine)
        if n == total:
            out.append(Guard(store, Rule.EMPTIES_STORE, f"removes every entry of {store} ({n} entries)",
                             n, total, size, total_size))
        else:
            out.extend(_newest(store, mine, removed))
        if total_size and size / total_size > policy.max_share + SHARE_SLACK:
            out.append(Guard(store, Rule.MAX_SHARE,
                             f"removes {size / total_size:.0%} of the entry bytes of {store} ({size} of "
                             f"{total_size} B), more than --max-share {policy.max_share:g}",
                             n, total, size, total_size))
    return out


def budget_guards(budgets: Iterable[Budget], items: Sequence[PruneItem]) -> list[Guard]:
    """A budget the plan cannot meet, on a store it removes entries from for that budget: removing the
    entries the budget chose then serves no stated goal (the rest is protected, or the sizes
    are not what the operator believed), so it is refused unless forced."""
    out = []
    for b in budgets:
        if b.met:
            continue
        gone = [i for i in items if i.store == b.store and i.reason is Reason.SIZE]
        if gone:
            out.append(Guard(b.store, Rule.BUDGET_UNMET,
                             f"cannot meet the budget of {b.limit} B of {b.store} ({b.size_after} B stay) "
                             f"although it removes {len(gone)} entries", len(gone), len(gone),
                             sum(i.size for i in gone), b.size_before))
    return out


def _newest(store: str, mine: Sequence[PruneCandidate], removed: set[tuple[str, str]]) -> list[Guard]:
    groups: dict[TargetLnc, list[PruneCandidate]] = defaultdict(list)
    for c in mine:
        if c.compiler_version:
            groups[(c.target, c.lnc)].append(c)
    out = []
    for (target, lnc), members in groups.items():
        newest = max({c.compiler_version for c in members if c.compiler_version}, key=version_key)
        of_newest = [c for c in members if c.compiler_version == newest]
        if all((store, c.path) in removed for c in of_newest):
            label = toolchain_label(newest, target, lnc)
            out.append(Guard(store, Rule.EMPTIES_NEWEST,
                             f"removes every entry of the newest toolchain of {store}, {label} "
                             f"({len(of_newest)} entries)", len(of_newest), len(of_newest),
                             sum(c.size for c in of_newest), sum(c.size for c in of_newest), label))
    return out


def refusal(plan: PrunePlan) -> RefusedPlan:
    """The error that refuses to execute ``plan`` because of its guards."""
    why = "; ".join(g.message for g in plan.guards)
    return RefusedPlan(f"the plan {why}: this looks like a mistake. Nothing was changed; check the plan "
                       "and add --force to --yes to carry it out", plan.guards)
