"""Commands that ask a running index server over HTTP, like every other client: ``stats``, ``flush``."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import click

from neffcache.application.config import load_settings
from neffcache.errors import ConfigError
from neffcache.index import FlushReport, WaitingSpool, spool_dir_for, waiting_spools
from neffcache.redaction import redact_text
from neffcache.units import compile_time, human_bytes, plural

from .errors import INDEX_FAILED
from .options import index_options, index_window, open_settings_index
from .output import emit_json, json_option, render, table


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:.1f}%"


def _money_lines(data: dict[str, Any]) -> list[str]:
    """Compile time in money, when the server has the operator's prices (`serve --price`)."""
    currency, t = data.get("currency"), data["totals"]
    if not currency or t.get("compile_cost") is None:
        return []
    lines = [f"  saved           {t['saved_cost']:,.2f} {currency}  (hits, at your prices)",
             f"  spent on misses {t['compile_cost']:,.2f} {currency}  (compiles, at your prices)"]
    ahead = (data.get("warm_ups") or {}).get("compile_cost")
    if ahead:
        lines.append(f"  spent ahead     {ahead:,.2f} {currency}  (warm-up compiles, at the prices of the "
                     "instances they compile for)")
    unpriced = [f"{t[field]:,.1f} h {what}" for field, what in (("unpriced_saved_hours", "saved"),
                                                                 ("unpriced_compile_hours", "spent")) if t.get(field)]
    if unpriced:
        lines.append(f"  unpriced        {', '.join(unpriced)}  (instance types with no --price)")
    return lines


def _groups_table(data: dict[str, Any]) -> str:
    """One row per group; with prices, what each group saved and spent in money too."""
    currency = data.get("currency")
    headers = [data["group_by"], "hit rate", "hits", "misses", "compiles", "saved h", "errors", "evicted"]
    if currency:
        headers += [f"saved {currency}", f"spent {currency}"]
    rows = []
    for g in data["groups"]:
        row = [g["name"], _pct(g["hit_rate"]), g["hits"], g["misses"], g["compiles"], f"{g['saved_hours']:,.1f}",
               g["errors"], g["evictions"]]
        if currency:
            row += [f"{g['saved_cost'] or 0:,.2f}", f"{g['compile_cost'] or 0:,.2f}"]
        rows.append(row)
    return table(rows, headers)


def _warm_up_line(data: dict[str, Any]) -> str:
    """What warm-ups compiled ahead of demand: apart from the jobs' hit rate."""
    ahead = data.get("warm_ups")
    if ahead is None:  # an index server from before sources: its hit rate counts warm-ups too
        return "  warm-ups        not told apart by this index server (an older release): its hit rate counts them"
    by_source = data.get("by_source") or {}
    parts = [f"{name} {by_source[name]['compiles']:,}" for name in ("warm", "rewarm") if name in by_source]
    return (f"  warm-ups        {plural(ahead['compiles'], 'graph')} compiled ahead of demand "
            f"({compile_time(ahead['compile_hours'] * 3600)}; {', '.join(parts)}), "
            f"{plural(ahead['hits'], 'hit')}, {plural(ahead['errors'], 'error')}")


def _regret_line(data: dict[str, Any]) -> list[str]:
    """Per policy, the window's budget evictions a later miss regretted (an older server: none)."""
    regret = {policy: r for policy, r in (data.get("eviction_regret") or {}).items() if r["evictions"] or
              r["regretted"]}
    if not regret:
        return []
    parts = [f"{policy} {r['regretted']:,} of {r['evictions']:,} ({compile_time(r['seconds'])} to recompile)"
             for policy, r in sorted(regret.items())]
    return [f"  regretted       {'; '.join(parts)}  (budget evictions a later miss wanted back)"]


def _stats_text(data: dict[str, Any]) -> str:
    t = data["totals"]
    window = data["window"]
    span = (window["end"] - window["start"]) / 3600
    filters = ", ".join(f"{k}={v}" for k, v in data["filters"].items()) or "all"
    sizes = data["size_by_toolchain"]
    jobs = "job traffic" if "warm_ups" in data else "warm-ups included"
    out = [
        f"index stats, last {span:.0f} h ({filters})",
        f"  hit rate        {_pct(t['hit_rate'])}  ({plural(t['hits'], 'hit')}, {plural(t['misses'], 'miss')}: "
        f"{jobs})",
        f"  job compiles    {t['compiles']:,}  ({compile_time(t['compile_hours'] * 3600)}, "
        f"{plural(t['errors'], 'error')})",
        f"  saved by hits   {compile_time(t['saved_hours'] * 3600)}",
        _warm_up_line(data),
        *_money_lines(data),
        f"  cache size      {human_bytes(sum(s['bytes'] for s in sizes))} in "
        f"{plural(sum(data['entries_by_state'].values()), 'entry')}",
        "  entries         " + ", ".join(f"{k} {v:,}" for k, v in data["entries_by_state"].items() if v),
        f"  leases held     {data['leases_active']}",
        *_regret_line(data),
    ]
    if data["groups"]:
        # Errors and evictions too: a group with only those (prune's evicts carry no model)
        # would otherwise be a row of zeros.
        out += ["", _groups_table(data)]
    if sizes:
        out += ["", table([[s["toolchain"], s["entries"], human_bytes(s["bytes"])] for s in sizes],
                          ["toolchain", "entries", "size"])]
    if data["top_misses"]:
        out += ["", table([[m["graph"], m["toolchain"], m["misses"]] for m in data["top_misses"]],
                          ["most missed by jobs: warm these first", "toolchain", "misses"])]
    return "\n".join(out)


@click.command("stats")
@click.option("--index-url", metavar="URL", help="The index server (NEFFCACHE_INDEX_URL).")
@click.option("--token", metavar="TOKEN", help="A read token (NEFFCACHE_TOKEN).")
@click.option("--window", default="7d", show_default=True, callback=index_window,
              help="How far back: 24h, 7d, 2w, 90m, or seconds.")
@click.option("--group-by", type=click.Choice(["team", "model", "instance_type", "toolchain", "producer"]),
              default="team", show_default=True, help="producer: the token that reported the events.")
@click.option("--team", help="Only this team.")
@click.option("--model", help="Only this model.")
@json_option
def stats_cmd(index_url: str | None, token: str | None, window: str, group_by: str, team: str | None,
              model: str | None, as_json: bool) -> None:
    """Show the index's view of the cache: hit rate, compile hours saved, sizes, top misses.

    The hit rate is the jobs': hits / (hits + misses) of job traffic (`neffcache run`, the
    library). What warm-ups (`warm`, `plan --warm`) and `rewarm` compiled ahead of demand is shown
    apart, never as misses; top misses are the graphs jobs missed. --json has the jobs' rate
    as `hit_rate`, job traffic as `totals`, warm-ups as `warm_ups`, each source in `by_source`,
    and per retention policy the size-budget evictions a later miss regretted in `eviction_regret`.

    \b
    Example:
      neffcache stats --window 24h --group-by model
      neffcache stats --team search --json | jq .hit_rate
    """
    settings = load_settings(index_url=index_url, token=token)
    if not settings.index_url:
        raise ConfigError("no index server configured: pass --index-url or set NEFFCACHE_INDEX_URL")
    index = open_settings_index(settings)
    try:
        data = index.stats(window=window, group_by=group_by, team=team, model=model)
    finally:
        index.close()
    if as_json:
        emit_json(data)
    else:
        click.echo(_stats_text(data))


def _flush_text(url: str, before: int, report: FlushReport, problem: str | None) -> str:
    out = [f"index {redact_text(url)}: {before} spooled batches; delivered {report.delivered_entries} entries and "
           f"{report.delivered_events} events ({report.duplicate_events} already there)"]
    if report.rejected:
        out.append(f"{report.rejected} batches refused by the index, kept aside in the spool's rejected/ directory")
    if report.pending_batches:
        out.append(f"{report.pending_batches} batches still waiting: {problem or report.error or 'index unreachable'}")
    return "\n".join(out)


def _others_text(others: list[WaitingSpool]) -> str:
    """Spools this flush does not deliver: reports of commands run with another --index-url."""
    out = []
    for spool in others:
        what = (f"{spool.reports} report{'' if spool.reports == 1 else 's'} in {spool.batches} "
                f"batch{'' if spool.batches == 1 else 'es'}")
        if spool.url:
            out.append(f"also waiting: {what} for {redact_text(spool.url)} (deliver: neffcache flush --index-url "
                       f"{redact_text(spool.url)})")
        else:
            out.append(f"also waiting: {what} in {spool.directory} for an index this neffcache cannot name "
                       "(spooled by an older release): neffcache flush --index-url URL delivers them")
    return "\n".join(out)


def _others_json(others: list[WaitingSpool]) -> list[dict[str, object]]:
    return [{"url": redact_text(o.url) if o.url else o.url, "spool": str(o.directory), "batches": o.batches,
             "reports": o.reports} for o in others]


@click.command("flush")
@index_options
@json_option
def flush_cmd(index_url: str | None, token: str | None, as_json: bool) -> None:
    """Deliver the reports spooled while the index server was unreachable.

    Every command that talks to the index delivers its spool in the background, so this is
    rarely needed: use it to see what is waiting, or to empty the spool before a host goes
    away. Resending is safe (the index counts each event once). Spools waiting for another
    index URL (a command run with another --index-url) are listed with the command that
    delivers them. Exits 7 when batches are still waiting because the index cannot be reached
    or refuses the token.

    \b
    Example:
      neffcache flush --index-url http://neffcache-index:8787 --json
    """
    settings = load_settings(index_url=index_url, token=token)
    root = Path(settings.spool_dir) if settings.spool_dir else None
    mine = spool_dir_for(settings.index_url, root) if settings.index_url else None
    others = [s for s in waiting_spools(root) if s.directory != mine]
    if not settings.index_url:
        if others:
            render(as_json, {"index": None, "others": _others_json(others)}, lambda: _others_text(others))
        raise ConfigError("no index server configured: pass --index-url or set NEFFCACHE_INDEX_URL"
                          + (" (spools waiting are listed above)" if others and not as_json else ""))
    index = open_settings_index(settings)
    index.on_problem = None  # this command's own lines say it
    problem: str | None = None
    try:
        before = index.pending_batches()
        try:
            report = index.deliver()
        finally:
            problem = index.counts().problem
    finally:
        index.close()
    data = {"index": redact_text(settings.index_url or ""), "spool": str(index.spool_directory),
            "pending_before": before,
            **dataclasses.asdict(report), "problem": problem, "others": _others_json(others)}

    def text() -> str:
        out = _flush_text(settings.index_url or "", before, report, problem)
        return out + ("\n" + _others_text(others) if others else "")

    render(as_json, data, text)
    if report.pending_batches and report.error:
        sys.exit(INDEX_FAILED)


COMMANDS: list[click.Command] = [stats_cmd, flush_cmd]
