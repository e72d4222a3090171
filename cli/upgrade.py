"""``neffcache upgrade-report``: is the fleet ready to switch compilers? (docs/upgrades.md)"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from neffcache.application.config import load_settings
from neffcache.errors import ConfigError
from neffcache.layouts.flags_form import describe
from neffcache.readiness import UNUSED_WEIGHT
from neffcache.stores import open_store
from neffcache.units import compile_time, human_bytes, parse_duration
from neffcache.upgrades import (
    DEFAULT_THRESHOLD,
    GraphComparison,
    GraphStatus,
    Regression,
    UpgradeReport,
    UpgradeRequest,
    compare,
)

from .errors import UPGRADE_NOT_READY, announce_index
from .options import (
    chosen_layouts,
    endpoint_option,
    flags_form_option,
    layout_option,
    open_settings_index,
    store_option,
    store_options,
)
from .output import render, table


def _window(ctx: click.Context, param: click.Parameter, value: str) -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    if seconds <= 0:
        raise click.BadParameter("must be longer than nothing", ctx=ctx, param=param)
    return seconds


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:.1f}%"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _ratio(graph: GraphComparison, what: Regression) -> str:
    ratio = graph.ratio(what)
    return "-" if ratio is None else f"{ratio:.2f}x"


def _with_details(rows: list[list[object]], headers: list[str], details: list[str]) -> list[str]:
    """A table whose rows are each followed by an indented line of free text (a signature, a
    reason) where there is one: long text in a column would push every number off the screen."""
    lines = table(rows, headers).splitlines()
    out = lines[:2]
    for line, detail in zip(lines[2:], details, strict=True):
        out += [line, *([f"    {detail}"] if detail else [])]
    return out


def _sections(report: UpgradeReport, top: int) -> list[str]:
    out: list[str] = []
    missing = report.missing()[:top]
    if missing:
        out += ["", f"not ready ({len(report.missing())}, most hit first)",
                *_with_details([[g.old.path, g.hits, g.status.value] for g in missing],
                               ["graph (old compiler)", "hits", "status"], [g.reason or "" for g in missing])]
    slower = report.grown(Regression.SLOWER)
    if slower:
        rows = [[g.old.path, _seconds(g.old.compile_seconds), _seconds(g.new.compile_seconds if g.new else None),
                 _ratio(g, Regression.SLOWER), g.hits] for g in slower[:top]]
        out += ["", f"slower to compile (more than {report.threshold:g}x)",
                table(rows, ["graph", "old s", "new s", "ratio", "hits"])]
    bigger = report.grown(Regression.BIGGER)
    if bigger:
        rows = [[g.old.path, human_bytes(g.old.neff_bytes or 0), human_bytes((g.new.neff_bytes if g.new else 0) or 0),
                 _ratio(g, Regression.BIGGER), g.hits] for g in bigger[:top]]
        out += ["", f"bigger NEFF (more than {report.threshold:g}x)",
                table(rows, ["graph", "old NEFF", "new NEFF", "ratio", "hits"])]
    failing = report.new_failures()[:top]
    if failing:
        out += ["", f"newly failing under {report.to_version} (signature below each)",
                *_with_details([[g.old.path, g.hits] for g in failing], ["graph", "hits"],
                               [(g.new.failure if g.new else None) or "" for g in failing])]
    return out


def report_text(report: UpgradeReport, gate: float | None, top: int) -> str:
    since, until = report.window
    days = (until - since) / 86400
    ready = sum(1 for g in report.graphs if g.status is GraphStatus.READY)
    hot, first_day, unknown = report.first_day()
    weighting = (f"weight = hits in the last {days:g} d + {UNUSED_WEIGHT:g}" if report.hits_known
                 else "no index: every graph weighs the same")
    out = [f"upgrade-report: neuronx-cc {report.from_version} -> {report.to_version}",
           f"stores: {', '.join(report.stores)}",
           f"  readiness    {_pct(report.readiness())}  ({ready} of {len(report.graphs)} graphs ready; {weighting})",
           f"  rewarm cost  {compile_time(report.rewarm_seconds())} (what the successors recorded)",
           f"  first day    {compile_time(first_day)} if the fleet switched now "
           f"({len(hot)} hot graph{'' if len(hot) == 1 else 's'} still missing"
           + (f", {unknown} with no known compile time" if unknown else "") + ")"]
    out += [f"  flags form   {describe(d)}" for d in report.flags_forms]
    out += _sections(report, top)
    out += [f"note: {note}" for note in report.notes]
    if gate is not None:
        reasons = report.gate_reasons(gate)
        out += ["", f"gate {gate:.1%}: " + ("ready" if not reasons else "NOT READY: " + "; ".join(reasons))]
    return "\n".join(out)


@click.command("upgrade-report")
@click.option("--from", "from_version", required=True, metavar="VERSION",
              help="The compiler the jobs run now, e.g. 2.27.5334.0+f702b353.")
@click.option("--to", "to_version", required=True, metavar="VERSION", help="The compiler to switch to.")
@store_option()
@endpoint_option
@click.option("--index-url", metavar="URL", help="Index server to count hits with (NEFFCACHE_INDEX_URL).")
@click.option("--token", metavar="TOKEN", help="A read token (NEFFCACHE_TOKEN).")
@click.option("--window", default="30d", show_default=True, callback=_window,
              help="Hits of how long back weigh the graphs: 7d, 30d, 12h...")
@click.option("--gate", type=click.FloatRange(0.0, 1.0), metavar="FRACTION",
              help=f"Exit {UPGRADE_NOT_READY} when readiness is below FRACTION (e.g. 0.95) or any graph "
                   "newly fails.")
@click.option("--threshold", type=click.FloatRange(min=1.0), default=DEFAULT_THRESHOLD, show_default=True,
              help="Report graphs whose compile time or NEFF size grew by more than this factor.")
@click.option("--instance", metavar="TYPE", help="Target of roots the runtime filled without a target directory.")
@click.option("--lnc", type=click.IntRange(1, 2), help="LNC for --instance (default: the instance's).")
@layout_option("Which runtimes' entries to compare.")
@flags_form_option("the successors are looked for in (as `neffcache rewarm --flags-form` names them)")
@click.option("--top", type=click.IntRange(min=1), default=20, show_default=True, help="Rows per list in the text.")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines on stderr.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (every graph in by_graph).")
def upgrade_report_cmd(from_version: str, to_version: str, stores: tuple[str, ...], index_url: str | None,
                       token: str | None, window: float, gate: float | None, threshold: float, instance: str | None,
                       lnc: int | None, layout: str, flags_form: str | None, top: int, quiet: bool,
                       as_json: bool) -> None:
    """Compare an old compiler's graphs with a new one's, after a shadow rewarm.

    Readiness is the share of the old compiler's graphs (SUCCESS entries) whose successor (the
    entry `neffcache rewarm` compiles them into) is SUCCESS, each graph weighted by its hits in
    the window (from the index) plus 0.1, so that unused graphs count a little. Listed: the
    graphs not ready (most hit first), graphs that compile slower or whose NEFF grew by more
    than --threshold, and graphs that newly fail, with the first line of their log. Totals:
    the compile hours the rewarm cost, and what the fleet would compile on its first day if it
    switched now. The successors are named as rewarm names them, in the flags form it decides
    for each new neuronxcc namespace (or --flags-form); the report says which. Read-only.

    \b
    Example:
      neffcache upgrade-report --from 2.27.5334.0+f702b353 --to 2.28.1001.0+0badc0de \\
          --store fsx:///mnt/fsx/neuron-cache --window 30d --gate 0.95
    """
    settings = load_settings(index_url=index_url, token=token)
    request = UpgradeRequest(from_version, to_version, chosen_layouts(layout), window, threshold, instance, lnc,
                             now=time.time(), flags_form=flags_form)
    urls = stores or settings.stores
    if not urls:
        raise ConfigError("name the stores: --store URL (repeat for tiers) or NEFFCACHE_STORES")
    opened = [open_store(url, read_only=True, create=False, **store_options(settings)) for url in urls]
    index = open_settings_index(settings)
    progress = (lambda message: None) if quiet else (lambda message: click.echo(message, err=True))
    try:
        report = compare(opened, index, request, progress)
    finally:
        index.close()
        for store in opened:
            store.close()
    data: dict[str, Any] = report.to_json(gate)
    render(as_json, data, lambda: report_text(report, gate, top))
    announce_index(index)
    if gate is not None and report.gate_reasons(gate):
        sys.exit(UPGRADE_NOT_READY)


COMMANDS: list[click.Command] = [upgrade_report_cmd]
