"""Lifecycle commands: prune (plan first, --yes to act) and reconcile (index vs stores)."""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import click

from neffcache.application.config import Settings, load_settings
from neffcache.application.warm_logs import WarmLogRun, expired_runs, remove_runs, warm_log_home
from neffcache.coordination.history import Action, read_history
from neffcache.errors import ConfigError
from neffcache.index import Index
from neffcache.prune import (
    CURRENT,
    PrunePlan,
    PrunePolicy,
    PruneResult,
    execute_plan,
    plan_prune,
    refusal,
    resolve_keep_compilers,
)
from neffcache.replication.reconcile import ReconcilePlan, plan_reconcile
from neffcache.stores import open_store
from neffcache.stores.base import Store
from neffcache.units import human_bytes, plural

from .errors import SOME_ENTRIES_FAILED, announce_index
from .failures import failed_options, failed_rule
from .options import duration, endpoint_option, open_settings_index, store_option, store_options
from .output import json_option, progress, render, shown_name, table
from .retention import budgets, evictions_text, regret_option, regret_report, retention_options, retention_rule


def _urls(urls: tuple[str, ...], settings: Settings) -> tuple[str, ...]:
    chosen = urls or settings.stores
    if not chosen:
        raise ConfigError("name the stores: --store URL (repeat for tiers) or NEFFCACHE_STORES")
    return chosen


def _stores(urls: Sequence[str], *, read_only: bool) -> list[Store]:
    options = store_options()
    return [open_store(url, read_only=read_only, create=False, **options) for url in urls]


def _index(settings: Settings, enabled: bool) -> Index | None:
    return open_settings_index(settings) if enabled else None


def _plan_text(plan: PrunePlan, show_items: bool, executing: bool) -> str:
    other = len(plan.items) - plan.entries
    head = (f"prune plan {plan.id}: {plural(plan.entries, 'entry')} and {plural(other, 'other item')}, "
            f"{human_bytes(plan.expected_freed_size)} to free (planned in {plan.seconds:.1f}s)")
    out = [head]
    if plan.items:
        for title, groups in (("reason", plan.by_reason()), ("toolchain", plan.by_toolchain()),
                              ("store", plan.by_store())):
            out.append("")
            out.append(table([[k, g.items, human_bytes(g.bytes)] for k, g in groups.items()], [title, "items", "size"]))
    if plan.budgets:
        out.append("")
        out.append(table([[b.store, human_bytes(b.limit), human_bytes(b.size_before), human_bytes(b.size_after),
                           "yes" if b.met else "NO"] for b in plan.budgets],
                         ["budget", "limit", "now", "after", "met"]))
    out.extend(evictions_text(plan, show_items))
    if show_items and plan.items:
        out.append("")
        out.append(table([[shown_name(i.path), i.reason.value, human_bytes(i.size), i.detail] for i in plan.items],
                         ["item", "reason", "size", "why"]))
    if plan.protected:
        why = Counter(p.why.split(" (")[0] if "published" in p.why else p.why.split(",")[0] for p in plan.protected)
        out.append("")
        out.append(f"kept by the safety rules: {len(plan.protected)} ("
                   + "; ".join(f"{n} {w}" for w, n in why.most_common(5)) + ")")
    for foreign in plan.foreign:
        shown = ", ".join(foreign.paths) + (", ..." if foreign.files > len(foreign.paths) else "")
        out.append("")
        out.append(f"foreign, kept: {foreign.files} files, {human_bytes(foreign.bytes)} in {foreign.store} that no "
                   f"runtime or neffcache wrote (other tools', unknown); no flag removes them: {shown}")
    out.extend(f"note: {n}" for n in plan.notes)
    if plan.guards:
        out.append("")
        out.extend(f"guard ({g.rule}): the plan {g.message}" for g in plan.guards)
        out.append("this looks like a mistake: --yes alone refuses it; check the plan before you force it.")
    if not executing:
        out.append("")
        # The last line is what carries the plan out: with a guard tripped that is --yes --force.
        act = "Add --yes --force to remove these items (the guard refuses --yes alone)." if plan.guards else \
            "Add --yes to remove these items."
        out.append(f"dry run: nothing was changed. {act}" if plan.items else "nothing to prune.")
    return "\n".join(out)


def _warm_logs_text(runs: list[WarmLogRun], days: float, removed: bool) -> str:
    size = sum(r.size for r in runs)
    verb = "removed" if removed else "would remove"
    return (f"warm logs: {verb} {plural(len(runs), 'run')} ({human_bytes(size)}) older than {days:g} days "
            f"under {warm_log_home()}")


def _result_text(result: PruneResult) -> str:
    entries = sum(1 for i in result.removed if i.kind.value == "entry")
    out = [f"removed {plural(len(result.removed), 'item')} ({plural(entries, 'entry')}), "
           f"freed {human_bytes(result.freed_bytes)} "
           f"in {result.seconds:.1f}s"]
    if result.skipped:
        reasons = Counter(s.why for s in result.skipped)
        out.append(f"skipped {len(result.skipped)} (re-checked right before removal): "
                   + "; ".join(f"{n} {w}" for w, n in reasons.most_common(6)))
    for failure in result.failed:
        out.append(f"FAILED {shown_name(failure.path)}: {failure.why}")
    return "\n".join(out)


@click.command("prune")
@store_option("A store to prune (path, fsx://, s3://...); repeat for tiers. Default: NEFFCACHE_STORES.")
@click.option("--keep-compiler", "keep_compilers", multiple=True, metavar="current|VERSION",
              help="Keep this compiler's entries, remove every other toolchain's; repeatable. "
                   "'current' is the installed neuronx-cc (or --compiler-version).")
@click.option("--keep-last", type=click.IntRange(min=1), metavar="N",
              help="Keep the N newest compiler versions of each target; remove older toolchains.")
@click.option("--older-than", callback=duration, metavar="AGE", help="Remove entries not used for AGE (30d, 12h).")
@click.option("--max-size", "max_sizes", multiple=True, metavar="[URL=]SIZE",
              help="Size budget per store (500G, 2T): the lowest value go first (--policy). "
                   "URL=SIZE for one store; repeatable.")
@retention_options
@failed_options
@click.option("--stale-locks", is_flag=True, help="Remove leases and runtime compile locks whose holder is gone.")
@click.option("--garbage", is_flag=True,
              help="Remove neffcache's temp files and staging, uncommitted writes, stamps of removed "
                   "entries, abandoned S3 multipart uploads. Foreign files are always kept.")
@click.option("--grace", metavar="AGE", callback=duration, default="1h", show_default=True,
              help="Garbage younger than this may be a write in flight and stays.")
@click.option("--hit-grace", metavar="AGE", callback=duration, default="1h", show_default=True,
              help="Entries used this recently are never removed by age or size.")
@click.option("--lock-age", metavar="AGE", callback=duration, default="6h", show_default=True,
              help="A runtime compile lock without a lease is stale after this long.")
@click.option("--compiler", metavar="PATH", help="The neuronx-cc whose version 'current' means.")
@click.option("--compiler-version", metavar="VERSION", help="What 'current' means, without running neuronx-cc.")
@click.option("--source", type=click.Choice(["store", "index"]), default="store", show_default=True,
              help="Plan from a listing of each store, or from the index server's records.")
@click.option("--index/--no-index", "use_index", default=True, show_default=True,
              help="Use the index server (NEFFCACHE_INDEX_URL) for last use and evict events.")
@click.option("--entries", "show_items", is_flag=True, help="List every item of the plan.")
@click.option("--workers", type=click.IntRange(1, 64), default=None,
              help="Chunks of entries removed in parallel per store (default: 4; 1 on a tmpfs or ramfs "
                   "cache, where nothing waits and threads only contend).")
@click.option("--yes", is_flag=True, help="Carry out the plan. Without it, prune only prints the plan.")
@click.option("--force", is_flag=True,
              help="With --yes: carry out a plan the guard rails stop (one that removes every entry of a store, "
                   "every entry of its newest toolchain, or more than --max-share of its bytes).")
@click.option("--max-share", type=click.FloatRange(0.0, 1.0), metavar="SHARE",
              help="Share of a store's entry bytes a plan may remove without --force "
                   "(default: setting prune_max_share, 0.5).")
@click.option("--history", is_flag=True,
              help="List the journal of past prunes and quarantines of the stores (who, when, why), newest first.")
@click.option("--since", metavar="AGE", callback=duration, help="With --history or --regret: only the last AGE (7d).")
@regret_option
@endpoint_option
@json_option
def prune_cmd(stores: tuple[str, ...], keep_compilers: tuple[str, ...], keep_last: int | None,
              older_than: float | None, max_sizes: tuple[str, ...], retention: str, pin_report: Path | None,
              pin_max_share: float, failed: str | None, failed_ttl: float | None, stale_locks: bool,
              garbage: bool, grace: float, hit_grace: float, lock_age: float,
              compiler: str | None, compiler_version: str | None, source: str, use_index: bool, show_items: bool,
              workers: int | None, yes: bool, force: bool, max_share: float | None, history: bool, since: float | None,
              regret: bool, as_json: bool) -> None:
    """Remove what no toolchain needs, nobody used, or breaks a budget — as a plan first.

    Prints the plan (entries, reason, size; totals per reason, toolchain and store) and
    changes nothing unless --yes is given. Execution re-checks every entry right before
    removing it (never one with a live lease, one published or used since the plan) and
    removes commit markers before data, so readers see an entry whole or not at all. An item
    that cannot be removed (an undeletable file, a bad name) is reported as FAILED and the rest
    are removed; the exit code is then 1.

    Guard rails: a --keep-compiler version that matches no entry is an error (exit 2) listing
    the versions present: name an exact version or 'current', never a prefix. A plan that
    removes every entry of a store, every entry of its newest toolchain, or more than
    --max-share of its bytes is shown with a guard note, and --yes refuses it (exit 9,
    nothing changed) unless --force is given too. Every execution is journalled in the store
    (who, when, the command, each item and why): --history lists the journal. --garbage also
    removes quarantined entries older than quarantine_days (30) and warm logs older than
    warm_log_days (14).

    \b
    Examples:
      neffcache prune --store fsx:///mnt/fsx/neuron-cache --keep-compiler current
      neffcache prune --store /nvme/cache --store s3://bucket/cache --max-size /nvme/cache=500G --older-than 30d
      neffcache prune --store /var/tmp/neuron-compile-cache --failed --stale-locks --garbage --yes
      neffcache prune --store fsx:///mnt/fsx/neuron-cache --failed environment --yes
      neffcache prune --store fsx:///mnt/fsx/neuron-cache --history --since 7d
      neffcache prune --store /nvme/cache --max-size 500G --pin-from-report tomorrow-plan.json
      neffcache prune --store /nvme/cache --regret
    """
    settings = load_settings(compiler=compiler, compiler_version=compiler_version, failed_ttl=failed_ttl)
    given = _urls(stores, settings)
    rules = (keep_compilers, keep_last, older_than, max_sizes, failed, failed_ttl, stale_locks, garbage, yes,
             pin_report)
    _check_flags(history=history or regret, since=since, force=force, yes=yes, rules=any(rules))
    if regret:
        regret_report(settings, lambda: _stores(given, read_only=True), since, as_json)
        return
    if history:
        _history(given, since, as_json)
        return
    current, keep = _keep_compilers(keep_compilers, settings)
    opened = _stores(given, read_only=not yes)
    policy = PrunePolicy(keep_compilers=keep, keep_last=keep_last, older_than=older_than,
                         max_size=budgets(max_sizes, given, opened), **failed_rule(failed, settings.failed_ttl),
                         stale_locks=stale_locks, garbage=garbage, grace=grace, hit_grace=hit_grace, lock_age=lock_age,
                         max_share=settings.prune_max_share if max_share is None else max_share, current=current,
                         quarantine_days=settings.quarantine_days,
                         **retention_rule(retention, pin_report, pin_max_share, max_sizes))
    _prune(opened, policy, settings, source=source, use_index=use_index, show_items=show_items, workers=workers,
           yes=yes, force=force, as_json=as_json)


def _check_flags(*, history: bool, since: float | None, force: bool, yes: bool, rules: bool) -> None:
    """Refuse combinations of flags that do not go together, before any store is opened."""
    if history:
        if rules:
            raise ConfigError("--history and --regret report the past: they take --store, --since and --json only")
        return
    if since is not None:
        raise ConfigError("--since goes with --history")
    if force and not yes:
        raise ConfigError("--force goes with --yes (without --yes prune only prints the plan)")


def _keep_compilers(given: tuple[str, ...], settings: Settings) -> tuple[str | None, tuple[str, ...]]:
    """The installed compiler's version when 'current' is named, and the versions to keep."""
    current = None
    if CURRENT in given:
        current = resolve_keep_compilers((CURRENT,), compiler=settings.compiler,
                                         compiler_version_override=settings.compiler_version)[0]
    return current, resolve_keep_compilers(given, compiler_version_override=current)


def _prune(opened: list[Store], policy: PrunePolicy, settings: Settings, *, source: str, use_index: bool,
           show_items: bool, workers: int | None, yes: bool, force: bool, as_json: bool) -> None:
    """Plan, print the plan, and with ``yes`` carry it out; closes the stores and the index."""
    old_logs = expired_runs(days=settings.warm_log_days) if policy.garbage else []
    index = _index(settings, use_index)
    try:
        with progress("listing", enabled=not as_json) as bar:
            plan = plan_prune(opened, policy, index=index, source=source,
                              progress=lambda url, n: bar.update(n, detail=f"files of {url}"))
        logs: dict[str, int | float] = {"runs": len(old_logs), "bytes": sum(r.size for r in old_logs),
                                        "days": settings.warm_log_days}
        if not yes:
            render(as_json, {"plan": plan.to_json(), "executed": False, "warm_logs": logs},
                   lambda: _plan_text(plan, show_items, False)
                   + (f"\n{_warm_logs_text(old_logs, settings.warm_log_days, False)}" if old_logs else ""))
            return
        if plan.guards and not force:
            render(as_json, {"plan": plan.to_json(), "executed": False, "refused": True},
                   lambda: _plan_text(plan, show_items, True))
            raise refusal(plan)
        if not as_json:
            click.echo(_plan_text(plan, show_items, True))
        with progress("removing", len(plan.items), enabled=not as_json) as bar:
            result = execute_plan(plan, opened, index=index, workers=workers, progress=bar.update, force=force)
        logs["removed"] = remove_runs(old_logs)
        render(as_json, {"plan": plan.to_json(), "executed": True, "result": result.to_json(), "warm_logs": logs},
               lambda: _result_text(result)
               + (f"\n{_warm_logs_text(old_logs, settings.warm_log_days, True)}" if old_logs else ""))
    finally:
        if index is not None:
            index.close()
        for store in opened:
            store.close()
    announce_index(index, [store.url for store in opened])
    if result.failed:
        sys.exit(SOME_ENTRIES_FAILED)


def _history_text(actions: list[Action], warnings: list[str]) -> str:
    if not actions:
        return "\n".join([*warnings, "no prune or quarantine recorded in these stores."])
    out = []
    for a in actions:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(a.at))
        reasons = ", ".join(f"{k} {v['items']}" for k, v in sorted(a.counts.items()))
        out.append(f"{when}  {a.kind} {a.store} by {a.who} (pid {a.pid}): {a.total} items, "
                   f"{human_bytes(a.bytes)} ({reasons})")
        out.append(f"    why: {a.why or '-'}")
        out.append(f"    command: {a.command or '-'}")
        for item in a.items[:5]:
            out.append(f"    {item.reason}: {shown_name(item.path)}")
        if len(a.items) > 5:
            out.append(f"    ... and {len(a.items) - 5} more (--json lists all)")
    out.extend(f"warning: {w}" for w in warnings)
    return "\n".join(out)


def _history(given: Sequence[str], since: float | None, as_json: bool) -> None:
    opened = _stores(given, read_only=True)
    warnings: list[str] = []
    actions: list[Action] = []
    try:
        cutoff = time.time() - since if since is not None else None
        for store in opened:
            actions.extend(read_history(store, since=cutoff, warnings=warnings))
    finally:
        for store in opened:
            store.close()
    actions.sort(key=lambda a: a.at, reverse=True)
    render(as_json, {"actions": [a.to_json() for a in actions], "warnings": warnings},
           lambda: _history_text(actions, warnings))


def _reconcile_text(plan: ReconcilePlan, executed: bool) -> str:
    out = [f"reconcile {', '.join(plan.stores)} with {plan.index}: {plan.matched} entries agree, "
           f"{len(plan.missing_in_store)} listed by the index but not in the store, "
           f"{len(plan.missing_in_index)} in the store but not in the index, {len(plan.differ)} differ"]
    for title, rows in (("index lists, store lacks (fix: forget)", plan.missing_in_store),
                        ("store holds, index lacks (fix: register)", plan.missing_in_index),
                        ("recorded differently (fix: register again)", plan.differ),
                        ("names no record may have (not registered)", plan.unaddressable)):
        if rows:
            out.append("")
            out.append(table([[r.store, r.path, r.detail] for r in rows[:50]], ["store", title, "detail"]))
            if len(rows) > 50:
                out.append(f"... and {len(rows) - 50} more (--json lists all)")
    out.extend(f"GUARD: {g}" for g in plan.guards)
    if not executed:
        out.append("")
        out.append("dry run: nothing was changed. Add --yes to apply the fixes"
                   + (" (--force too: see GUARD)." if plan.guards and plan.to_forget else ".") if plan.fixes
                   else "the index and the stores agree.")
    return "\n".join(out)


@click.command("reconcile")
@store_option("A store to compare with the index; repeatable. Default: NEFFCACHE_STORES.")
@click.option("--fix", type=click.Choice(["both", "forget", "register"]), default="both", show_default=True,
              help="Which direction to fix: forget index records no store backs, register entries the index "
                   "lacks, or both.")
@click.option("--yes", is_flag=True, help="Apply the fixes to the index. Without it, only report.")
@click.option("--force", is_flag=True,
              help="With --yes: forget records even when the plan looks like a mistake (a store that lists "
                   "nothing, or more than --max-share of a store's records).")
@click.option("--max-share", type=click.FloatRange(0.0, 1.0), metavar="SHARE",
              help="Forgetting more than this share of a store's records needs --force "
                   "(default: setting prune_max_share, 0.5).")
@endpoint_option
@json_option
def reconcile_cmd(stores: tuple[str, ...], fix: str, yes: bool, force: bool, max_share: float | None,
                  as_json: bool) -> None:
    """Compare the index server's records with what the stores hold.

    Reports entries the index lists but no store holds (lost files, a prune whose evict
    events never arrived) and entries a store holds that the index does not know (written
    by a runtime, or while the index was down), and with --yes fixes the index. A store that
    is not there looks empty: forgetting every record of a store that lists nothing, or more
    than --max-share of its records, is refused (exit 9, nothing changed) unless --force.
    What was forgotten is journalled in the store (`neffcache prune --history`).

    \b
    Example:
      neffcache reconcile --store fsx:///mnt/fsx/neuron-cache --store s3://bucket/cache --yes
    """
    settings = load_settings()
    if not settings.index_url:
        raise ConfigError("reconcile needs the index server: set NEFFCACHE_INDEX_URL (and NEFFCACHE_TOKEN)")
    opened = _stores(_urls(stores, settings), read_only=not yes)  # --yes journals in the store
    index = open_settings_index(settings)
    try:
        with progress("comparing", enabled=not as_json) as bar:
            plan = plan_reconcile(opened, index, fix=fix, progress=lambda n: bar.update(n, detail="entries"),
                                  max_share=settings.prune_max_share if max_share is None else max_share)
        applied = plan.execute(index, force=force, journal=opened) if yes else None
        data = {"plan": plan.to_json(), "executed": yes, "applied": applied.to_json() if applied else None}
        render(as_json, data, lambda: _reconcile_text(plan, yes) + (f"\n{applied.summary()}" if applied else ""))
    finally:
        index.close()
        for store in opened:
            store.close()
    announce_index(index, [store.url for store in opened])
    if plan.unaddressable:  # some entries could not be reconciled
        sys.exit(SOME_ENTRIES_FAILED)


COMMANDS: list[click.Command] = [prune_cmd, reconcile_cmd]
