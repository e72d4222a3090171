"""``neffcache plan``: which of a job's graphs are cached, what the misses cost, and a CI gate on it."""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import click

from neffcache.application.config import Settings, job_toolchain
from neffcache.application.warm_logs import warm_log_home
from neffcache.errors import CompilerNotFound, StoreError
from neffcache.index import Index
from neffcache.misses.lookup import HeldStatus
from neffcache.stores import open_store
from neffcache.stores.base import Store
from neffcache.toolchain import find_compiler
from neffcache.units import compile_time, human_duration, plural
from neffcache.warmers.children import Children, Interrupted, stop_on_signals
from neffcache.warmers.discovery import installed_output
from neffcache.warmers.logscan import compile_patterns
from neffcache.warmers.matrix import Shard, build_buckets
from neffcache.warmers.placement import Placement
from neffcache.warmers.plan import Planner, PlanReport, PlanRequest
from neffcache.warmers.warm import WarmRequest

from .errors import NOT_WARM, SOME_ENTRIES_FAILED, announce_index
from .jobs import (
    compile_options,
    interrupted,
    job_settings,
    open_job_placement,
    parallelism,
    progress_lines,
    report_text,
)
from .options import (
    PASS_THROUGH,
    bucket_options,
    endpoint_option,
    index_options,
    open_settings_index,
    store_option,
    tag_option,
    toolchain_options,
    workload_argument,
)
from .options import endpoint_url as configured_endpoint
from .output import json_option, render, table

WHY_MISS = "neffcache why-miss --from-report FILE"


def _stores(settings: Settings) -> tuple[list[Store], list[str]]:
    """The configured stores, read-only (a plan writes nothing); one that cannot be opened is a note."""
    stores, notes = [], []
    endpoint = configured_endpoint(settings)
    for url in settings.stores:
        try:
            stores.append(open_store(url, read_only=True, create=False, endpoint_url=endpoint))
        except StoreError as exc:
            notes.append(f"store {url} could not be opened ({exc}): its entries count as missing")
    return stores, notes


def _rows(report: PlanReport) -> list[list[object]]:
    estimates = {e.path: e.seconds for e in (report.forecast.estimates if report.forecast else ())}
    groups: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for found in report.buckets:
        for graph in found.graphs:
            groups[(graph.namespace, found.bucket.name)].append(graph)
        if not found.graphs:
            groups[("-", found.bucket.name)] = []
    rows: list[list[object]] = []
    for (namespace, bucket), graphs in groups.items():
        misses = [g for g in graphs if report.status(g) is not HeldStatus.HIT]
        known = [s for g in misses if (s := estimates.get(g.path)) is not None]
        unknown = len(misses) - len(known)
        parts = ([human_duration(sum(known))] if known else []) + ([f"{unknown} unknown"] if unknown else [])
        cost = " + ".join(parts)
        rows.append([namespace, bucket, len(graphs), len(graphs) - len(misses), len(misses), cost if misses else "-"])
    return rows


def plan_text(report: PlanReport) -> str:
    tc = report.toolchain
    out = [f"plan: neuronx-cc {tc['compiler_version']}, {tc['target']} lnc={tc['lnc']} ({tc['instance']}); "
           f"stores: {', '.join(report.stores) or 'none'}; index: "
           + ("asked" if report.found and report.found.index_asked else "not asked")]
    rows = _rows(report)
    graphs, misses = report.graphs, report.misses
    fc = report.forecast
    rows.append(["total", "", len(graphs), len(graphs) - len(misses), len(misses),
                 human_duration(fc.compile_seconds) if fc and fc.known else "-"])
    out.append(table(rows, ["namespace", "bucket", "graphs", "hits", "misses", "est. compile"]))
    for b in report.buckets:
        if b.group.status.severity:
            out.append(f"DISCOVERY {b.group.status.upper()} in bucket {b.bucket.name}: its graphs may be incomplete "
                       + "; ".join(f.reason for f in b.group.failures))
    if fc is not None and misses:
        basis = fc.to_json()["by_basis"]
        out.append(f"forecast: {plural(len(misses), 'graph')} would compile, {compile_time(fc.compile_seconds)} "
                   f"estimated ({basis['same-graph']} from the same graph's history, {basis['size-fit']} from HLO "
                   f"size, {basis['unknown']} unknown)")
        slots = f"{fc.slots} compile slot(s) ({fc.parallel} per host x {fc.hosts} host(s))"
        out.append(f"ETA: {human_duration(fc.eta_seconds)} with {slots}, longest first"
                   + (f", not counting the {len(fc.unknown)} unknown" if fc.unknown else "") if fc.known else
                   f"ETA: unknown: the index has no compile history for these graphs or their target ({slots})")
        elsewhere = sum(1 for g in misses if report.status(g) is HeldStatus.ELSEWHERE)
        if elsewhere:
            out.append(f"{elsewhere} of them are in another store the index knows: `neffcache pull` would bring them")
        out.append(f"why: `{WHY_MISS}` explains each miss (FILE: this command's --json output)")
    elif not misses:
        out.append("forecast: nothing to compile: every graph is cached")
    out.extend(f"note: {n}" for n in report.notes)
    return "\n".join(out)


def _exit_code(report: PlanReport, require_warm: bool) -> int:
    if report.failed_buckets or (report.warm is not None and not report.warm.ok):
        return SOME_ENTRIES_FAILED
    if require_warm and report.still_missing():
        return NOT_WARM
    return 0


@click.command("plan", context_settings=PASS_THROUGH)
@toolchain_options
@store_option()
@endpoint_option
@bucket_options
@index_options
@compile_options
@tag_option
@json_option
@click.option("--hosts", type=click.IntRange(min=1), default=1, show_default=True,
              help="Warm-up hosts the ETA assumes, each running --parallel compiles.")
@click.option("--timeout", type=click.FloatRange(min=0.1), metavar="SECONDS",
              help="Stop a bucket's discovery run (SIGTERM, then SIGKILL) that runs longer.")
@click.option("--no-extract", is_flag=True,
              help="libneuronxla (neuronxcc layout): let the runtime call the recording compiler instead of only "
                   "extracting graphs.")
@click.option("--require-warm", is_flag=True,
              help=f"Exit {NOT_WARM} when any graph would compile (a CI gate before a training job).")
@click.option("--warm", "compile_misses", is_flag=True,
              help="Then compile exactly the missing graphs and publish them to every writable store.")
@click.option("--log-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where each bucket's discovery output goes (default under ~/.cache/neffcache/warm-logs).")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines on stderr.")
@workload_argument
def plan_cmd(command: tuple[str, ...], instance: str | None, lnc: int | None, compiler_version: str | None,
             compiler: str | None, stores: tuple[str, ...], index_url: str | None, token: str | None,
             bucket_flags: tuple[str, ...], matrix_file: Path | None, shard: str | None, parallel: int | None,
             hosts: int, timeout: float | None, no_extract: bool, require_warm: bool, compile_misses: bool,
             compile_timeout: float | None, compile_memory: float | None, retry_failed: bool,
             failed_ttl: float | None, log_dir: Path | None,
             tags: dict[str, str], as_json: bool, quiet: bool) -> None:
    """Tell, before a job runs, which of its graphs are cached and what the misses will cost.

    Runs COMMAND once per shape bucket, compile-only, against a private scratch cache (removed
    afterwards) with a recording neuronx-cc first on PATH: nothing is compiled and nothing
    reaches a store, yet every cache entry the runtime will look up is known. Each is looked up
    in the stores (fastest first) and the index; the misses get a compile-time forecast from
    the index's history and an ETA for --parallel x --hosts warmers. With --require-warm it
    exits 13 when anything would compile; with --warm it compiles exactly the misses. Exit 1
    when a bucket's discovery run failed (the plan may be incomplete). See docs/plan.md.

    \b
    Example:
      neffcache plan --instance trn2.48xlarge --store /nvme/cache --store s3://ml-cache/neuron \\
          --bucket SEQ=512,1024,2048 --require-warm -- python train.py --seq-len {SEQ} --max-steps 2
    """
    buckets = build_buckets(bucket_flags, matrix_file)
    settings = job_settings(stores, instance=instance, compiler=compiler, compiler_version=compiler_version,
                            index_url=index_url, token=token, failed_ttl=failed_ttl)
    toolchain = job_toolchain(settings, lnc)
    try:
        exe: Path | None = find_compiler(settings.compiler)
    except CompilerNotFound:
        if compile_misses:
            raise
        exe = None  # a version named with --compiler-version: the recorder answers with it
    all_tags = {**settings.tags, **tags}
    logs = log_dir or warm_log_home() / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-plan"
    warm = WarmRequest(command=command, instance=settings.instance or "", toolchain=toolchain,
                       compiler=exe or Path("neuronx-cc"), buckets=buckets, patterns=compile_patterns(),
                       log_dir=logs.absolute(), shard=Shard.parse(shard), parallel=parallelism(settings, parallel),
                       timeout=timeout, compile_timeout=compile_timeout, compile_memory_mb=compile_memory,
                       retry_failed=retry_failed, failed_ttl=settings.failed_ttl, tags=all_tags)
    request = PlanRequest(warm, installed_output(exe), extract=not no_extract, hosts=hosts,
                          compile_misses=compile_misses)
    report, index = _run(request, settings, all_tags, quiet)
    render(as_json, report.to_json(), lambda: plan_text(report)
           + (f"\n\n{report_text(report.warm)}" if report.warm is not None else ""))
    announce_index(index, list(settings.stores) if compile_misses else [])
    code = _exit_code(report, require_warm)
    if code:
        sys.exit(code)


def _run(request: PlanRequest, settings: Settings, tags: dict[str, str], quiet: bool) -> tuple[PlanReport, Index]:
    """Open what the plan reads (and, with --warm, writes), run it with its children stopped on a
    signal, close everything on every path."""
    placement: Placement | None = None
    notes: list[str] = []
    if request.compile_misses:
        placement = open_job_placement(settings, tags, "plan")
        # The job reads the configured stores, not the local cache a remote-only chain gets in front.
        inserted = len(placement.chain.tiers) > len(settings.stores)
        stores = [t.store for t in placement.chain.tiers[int(inserted):] if t.store is not None]
        index = placement.index
    else:
        (stores, notes), index = _stores(settings), open_settings_index(settings)
    children = Children()
    try:
        with stop_on_signals(children):
            report = Planner(request, stores, index, children, progress_lines(quiet), placement).run()
    except Interrupted as exc:
        interrupted("plan", exc)
    finally:
        if placement is not None:
            placement.close()
        else:
            index.close()
            for store in stores:
                store.close()
    report.notes[:0] = notes
    return report, index


COMMANDS: list[click.Command] = [plan_cmd]
