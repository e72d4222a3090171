"""What the compiling commands share (``warm``, ``rewarm``, ``run``, ``plan``): their settings
and options, the placement they publish through, progress lines, the warm report's text, and
running a compiling job so that a signal stops its children and the report still renders."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from neffcache.application.config import Settings, load_settings
from neffcache.application.trusted import trust_policy
from neffcache.units import human_bytes
from neffcache.warmers.children import Children, Interrupted, stop_on_signals
from neffcache.warmers.placement import Placement, open_placement
from neffcache.warmers.report import GroupStatus, WarmReport

from .errors import SOME_ENTRIES_FAILED, announce_index, killed_by
from .options import duration, endpoint_url, watch_index
from .output import render, table

F = TypeVar("F", bound=Callable[..., Any])


def compile_options(f: F) -> F:
    f = click.option("--retry-failed", is_flag=True,
                     help="Compile graphs again whose earlier compile failed with a compiler error (the "
                          "failure is cached; environment failures never are).")(f)
    f = click.option("--failed-ttl", metavar="AGE", callback=duration,
                     help="Compile again a graph whose cached compiler error is older than AGE (7d): a fixed "
                          "compiler gets another chance (setting failed_ttl, NEFFCACHE_FAILED_TTL).")(f)
    f = click.option("--compile-memory", type=click.FloatRange(min=1), metavar="MB",
                     help="Peak memory of one compile; start another only while this much is free "
                          "(default: learned from the largest compile so far).")(f)
    f = click.option("--compile-timeout", type=click.FloatRange(min=0.1), metavar="SECONDS",
                     help="Kill a compile that runs longer; the graph is reported failed.")(f)
    f = click.option("--shard", metavar="I/N", help="Do the I-th of N disjoint parts (0-based; e.g. "
                                                    "$JOB_COMPLETION_INDEX/4).")(f)
    return click.option("--parallel", type=click.IntRange(min=1), metavar="N",
                        help="Workloads / compiles at once (default: NEFFCACHE_PARALLEL, else one per core).")(f)


def job_settings(stores: tuple[str, ...], **overrides: Any) -> Settings:
    return load_settings(stores=stores, **overrides)


def parallelism(settings: Settings, flag: int | None) -> int:
    return flag or settings.parallel or os.cpu_count() or 1


def open_job_placement(settings: Settings, tags: dict[str, str], job: str) -> Placement:
    fields: dict[str, str] = {"job": job, **{k: tags[k] for k in ("model", "team") if k in tags}}
    if settings.instance:
        fields["instance_type"] = settings.instance
    placement = open_placement(settings.stores, index_url=settings.index_url, token=settings.token,
                               event_fields=fields, spool_root=Path(settings.spool_dir) if settings.spool_dir else None,
                               endpoint_url=endpoint_url(settings), policy=trust_policy(settings))
    watch_index(placement.index)
    return placement


def progress_lines(quiet: bool) -> Callable[[str], None]:
    return (lambda message: None) if quiet else (lambda message: click.echo(message, err=True))


def report_text(report: WarmReport) -> str:
    tc = report.toolchain
    head = (f"{report.command}: neuronx-cc {tc.get('compiler_version')}"
            + (f" (from {tc['from_compiler']})" if "from_compiler" in tc else "")
            + (f", {tc['target']} lnc={tc['lnc']} ({tc['instance']})" if "target" in tc else "")
            + f", {report.mode}, shard {report.shard}, parallel {report.parallel}")
    out = [head, f"stores: {', '.join(report.stores)}"]
    rows = [[g.name, g.status, g.graphs, g.hits, g.compiled, g.failed, f"{g.compile_seconds:.1f}",
             human_bytes(g.bytes), f"{g.seconds:.1f}s" if g.seconds else "-"] for g in report.groups]
    t = report.totals()
    rows.append(["total", "ok" if report.ok else "FAILED", t["graphs"], t["hits"], t["compiled"], t["failed"],
                 f"{t['compile_seconds']:.1f}", human_bytes(t["bytes"]), f"{report.seconds:.1f}s"])
    label = "bucket" if report.command == "warm" else "namespace"
    out.append(table(rows, [label, "status", "graphs", "hits", "compiled", "failed", "compile s", "size", "time"]))
    if report.failures:
        out.append("failures:")
        out.extend(f"  [{f.group}] {f.what}: {f.kind}: {f.reason}" for f in report.failures)
    logs = [g.log for g in report.groups if g.log and g.status is not GroupStatus.OK]
    if logs:
        out.append("workload logs: " + ", ".join(logs))
    extra = [f"prefetched {report.prefetched}"] if report.prefetched else []
    extra.append(f"published {report.published} entr{'y' if report.published == 1 else 'ies'} to remote tiers")
    out.append("; ".join(extra))
    out.extend(f"flags form of {d['namespace']}: {d['form'] or '?'} (decided by {d['rule']}): {d['explanation']}"
               for d in report.flags_forms)
    out.extend(f"note: {n}" for n in report.notes)
    out.extend(f"PROBLEM: {p}" for p in report.problems)
    return "\n".join(out)


def finish(report: WarmReport, placement: Placement, as_json: bool, allow_failures: bool) -> None:
    render(as_json, report.to_json(), lambda: report_text(report))
    announce_index(placement.index, [store.url for store in placement.writable])
    if not report.ok and not allow_failures:
        sys.exit(SOME_ENTRIES_FAILED)


def drive(command: str, placement: Placement, start: Callable[[Children], WarmReport], as_json: bool,
           allow_failures: bool) -> None:
    """Run a compiling job (warm, rewarm) with its children stopped on a signal, close its
    placement on every path, then render its report and exit by it."""
    children = Children()
    try:
        with stop_on_signals(children):
            report = start(children)
    except Interrupted as exc:
        interrupted(command, exc)
    finally:
        placement.close()
    finish(report, placement, as_json, allow_failures)


def interrupted(command: str, exc: Interrupted) -> None:
    click.echo(f"neffcache {command}: {exc.args[0]}: stopped every child process group; "
               "the cache is consistent (only whole entries were published): rerun to finish", err=True)
    sys.exit(killed_by(exc.signum))


