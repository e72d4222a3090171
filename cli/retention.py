"""``prune --max-size``: the budgets, the retention options (``--policy``, ``--pin-from-report``,
``--pin-max-share``) and the plan's table of what the budget evicts and why."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from neffcache.application.config import Settings
from neffcache.coordination.evictions import RegretReport, read_tombstones, regret
from neffcache.errors import ConfigError
from neffcache.prune import ALL_STORES, PrunePlan, Reason
from neffcache.prune.value import DEFAULT_COMPILE_SECONDS, Retention
from neffcache.stores.base import Store
from neffcache.units import human_bytes, parse_size

from .options import open_settings_index, report_paths
from .output import render, shown_name, table

F = TypeVar("F", bound=Callable[..., Any])
SHOWN = 20  # evictions the plan's text lists without --entries


def budgets(values: tuple[str, ...], given: Sequence[str], stores: Sequence[Store]) -> dict[str, int]:
    """``--max-size 500G`` (every store) or ``--max-size URL=500G`` (the store given as URL)."""
    out: dict[str, int] = {}
    for value in values:
        where, sep, size = value.rpartition("=")
        try:
            limit = parse_size(size if sep else value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--max-size") from None
        if not sep:
            out[ALL_STORES] = limit
            continue
        match = [s.url for g, s in zip(given, stores, strict=True) if where in (g, s.url)]
        if not match:
            raise click.BadParameter(f"{where} is not one of the --store URLs", param_hint="--max-size")
        out[match[0]] = limit
    return out


def retention_options(f: F) -> F:
    """The options :func:`retention_rule` turns into :class:`~neffcache.prune.PrunePolicy` fields."""
    f = click.option("--pin-max-share", type=click.FloatRange(0.0, 1.0), default=0.5, show_default=True,
                     metavar="SHARE", help="Pinned graphs take at most this share of a --max-size budget; the "
                                           "most valuable are pinned first, the rest ranked as usual.")(f)
    f = click.option("--pin-from-report", "pin_report", type=click.Path(dir_okay=False, path_type=Path),
                     metavar="FILE", help="Keep the graphs a `plan --json` or `run --report` file names "
                                          "(a scheduled job's) whatever their score, under --max-size.")(f)
    return click.option("--policy", "retention", type=click.Choice([r.value for r in Retention]),
                        default=Retention.VALUE.value, show_default=True,
                        help="What --max-size evicts first: value (lowest compile seconds x hits per byte, "
                             "decaying with disuse; older toolchains first) or lru (least recently used). "
                             f"Entries with no recorded compile time count {DEFAULT_COMPILE_SECONDS:g} s.")(f)


def retention_rule(retention: str, pin_report: Path | None, pin_max_share: float,
                   max_sizes: tuple[str, ...]) -> dict[str, Any]:
    """The :class:`~neffcache.prune.PrunePolicy` fields of the retention options."""
    if pin_report is not None and not max_sizes:
        raise ConfigError("--pin-from-report keeps graphs under a size budget: it goes with --max-size")
    pins = report_paths(pin_report) if pin_report is not None else frozenset()
    return {"retention": Retention(retention), "pins": pins, "pin_max_share": pin_max_share}


def evictions_text(plan: PrunePlan, show_all: bool) -> list[str]:
    """The budget's evictions with what it weighed (size, compile seconds, last use, score),
    and the pins it kept; empty without a budget."""
    evicted = [i for i in plan.items if i.reason is Reason.SIZE and i.cost is not None]
    pinned = [p for p in plan.protected if p.reason is Reason.SIZE and p.why.startswith("pinned")]
    if not evicted and not pinned:
        return []
    out = [""]
    if evicted:
        policy = evicted[0].cost.policy.value if evicted[0].cost else "-"
        rows = []
        for item in evicted if show_all else evicted[:SHOWN]:
            cost = item.cost
            assert cost is not None
            seconds = f"{cost.costed_seconds:.0f}" + ("" if cost.compile_seconds is not None else " (default)")
            used = time.strftime("%Y-%m-%d %H:%M", time.gmtime(cost.used)) + \
                (" (committed)" if item.last_used is None else "")
            rows.append([shown_name(item.path), human_bytes(item.size), seconds, cost.hits, used, f"{cost.score:.3g}"
                         + (" old" if cost.superseded else "")])
        out.append(f"evicted for the budget, policy {policy}, first to go first "
                   "(score: compile seconds x (1 + hits) per MiB, halving each week unused; old: superseded "
                   "toolchain):")
        out.append(table(rows, ["entry", "size", "compile s", "hits", "last use (UTC)", "score"]))
        if len(evicted) > len(rows):
            out.append(f"... and {len(evicted) - len(rows)} more (--entries or --json lists all)")
    if pinned:
        out.append(f"pinned, kept under the budget: {len(pinned)} graphs a scheduled job needs "
                   f"({', '.join(shown_name(p.path) for p in pinned[:5])}{', ...' if len(pinned) > 5 else ''})")
    return out


def regret_option(f: F) -> F:
    return click.option("--regret", is_flag=True,
                        help="Report regretted evictions: entries a --max-size budget evicted (their tombstones "
                             "in the stores) that the index saw missed since, with the compile seconds each "
                             "cost, per policy. Needs the index (NEFFCACHE_INDEX_URL).")(f)


def regret_report(settings: Settings, open_stores: Callable[[], list[Store]], since: float | None,
                  as_json: bool) -> None:
    """``prune --regret``: the stores' tombstones (of the last ``since`` seconds, when given)
    matched with the index's misses."""
    if not settings.index_url:
        raise ConfigError("--regret matches evictions with the index's misses: set NEFFCACHE_INDEX_URL "
                          "(and NEFFCACHE_TOKEN)")
    warnings: list[str] = []
    index = open_settings_index(settings)
    stores: list[Store] = []
    try:
        stores = open_stores()
        now = time.time()
        tombstones = [t for store in stores for t in read_tombstones(store, now=now, warnings=warnings)
                      if since is None or now - t.at <= since]
        start = min((t.at for t in tombstones), default=now)
        misses = index.usage_misses(since=start, until=now + 1) if tombstones else {}
        report = regret(tombstones, misses)
    finally:
        index.close()
        for store in stores:
            store.close()
    render(as_json, {**report.to_json(), "warnings": warnings}, lambda: _regret_text(report, warnings))


def _regret_text(report: RegretReport, warnings: list[str]) -> str:
    out = [f"{report.tombstones} evictions on record, {len(report.regretted)} regretted (missed since): "
           f"{report.seconds / 3600:.2f} compile hours paid again"]
    for policy, slot in sorted(report.by_policy().items()):
        out.append(f"  policy {policy}: {slot['regretted']:.0f} regretted, {slot['seconds']:.0f} s")
    if report.regretted:
        out.append("")
        rows = [[shown_name(r.tombstone.path), human_bytes(r.tombstone.bytes), f"{r.tombstone.compile_seconds:.0f}",
                 r.tombstone.policy, time.strftime("%Y-%m-%d %H:%M", time.gmtime(r.tombstone.at)), r.misses]
                for r in report.regretted[:SHOWN]]
        out.append(table(rows, ["entry", "size", "compile s", "policy", "evicted (UTC)", "misses"]))
        if len(report.regretted) > SHOWN:
            out.append(f"... and {len(report.regretted) - SHOWN} more (--json lists all)")
    out.extend(f"warning: {w}" for w in warnings)
    return "\n".join(out)
