"""Commands that compile or wrap workloads: ``warm``, ``rewarm``, ``run``."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from neffcache.application.config import Settings, job_toolchain, load_settings
from neffcache.application.warm_logs import expired_runs, remove_runs, warm_log_home
from neffcache.toolchain import compiler_version as installed_version
from neffcache.toolchain import find_compiler
from neffcache.units import human_bytes
from neffcache.warmers.children import Children, Interrupted, stop_on_signals
from neffcache.warmers.logscan import compile_patterns
from neffcache.warmers.matrix import Shard, build_buckets
from neffcache.warmers.placement import Placement, open_placement
from neffcache.warmers.report import GroupStatus, WarmReport
from neffcache.warmers.rewarm import Rewarmer, RewarmRequest
from neffcache.warmers.warm import Warmer, WarmRequest
from neffcache.warmers.wrap import RunRequest, run_job

from .errors import SOME_ENTRIES_FAILED, announce_index, killed_by
from .options import (
    PASS_THROUGH,
    bucket_options,
    chosen_layouts,
    duration,
    endpoint_option,
    endpoint_url,
    index_options,
    layout_option,
    store_option,
    tag_option,
    toolchain_options,
    watch_index,
    workload_argument,
)
from .output import json_option, render, table

F = TypeVar("F", bound=Callable[..., Any])


def _compile_options(f: F) -> F:
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


def _settings(stores: tuple[str, ...], **overrides: Any) -> Settings:
    return load_settings(stores=stores, **overrides)


def _parallel(settings: Settings, flag: int | None) -> int:
    return flag or settings.parallel or os.cpu_count() or 1


def _placement(settings: Settings, tags: dict[str, str], job: str) -> Placement:
    fields: dict[str, str] = {"job": job, **{k: tags[k] for k in ("model", "team") if k in tags}}
    if settings.instance:
        fields["instance_type"] = settings.instance
    placement = open_placement(settings.stores, index_url=settings.index_url, token=settings.token,
                               event_fields=fields, spool_root=Path(settings.spool_dir) if settings.spool_dir else None,
                               endpoint_url=endpoint_url(settings))
    watch_index(placement.index)
    return placement


def _progress(quiet: bool) -> Callable[[str], None]:
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
    out.extend(f"note: {n}" for n in report.notes)
    out.extend(f"PROBLEM: {p}" for p in report.problems)
    return "\n".join(out)


def _finish(report: WarmReport, placement: Placement, as_json: bool, allow_failures: bool) -> None:
    render(as_json, report.to_json(), lambda: report_text(report))
    announce_index(placement.index)
    if not report.ok and not allow_failures:
        sys.exit(SOME_ENTRIES_FAILED)


def _drive(command: str, placement: Placement, start: Callable[[Children], WarmReport], as_json: bool,
           allow_failures: bool) -> None:
    """Run a compiling job (warm, rewarm) with its children stopped on a signal, close its
    placement on every path, then render its report and exit by it."""
    children = Children()
    try:
        with stop_on_signals(children):
            report = start(children)
    except Interrupted as exc:
        _interrupted(command, exc)
    finally:
        placement.close()
    _finish(report, placement, as_json, allow_failures)


def _interrupted(command: str, exc: Interrupted) -> None:
    click.echo(f"neffcache {command}: {exc.args[0]}: stopped every child process group; "
               "the cache is consistent (only whole entries were published): rerun to finish", err=True)
    sys.exit(killed_by(exc.signum))


@click.command("warm", context_settings=PASS_THROUGH)
@toolchain_options
@store_option()
@endpoint_option
@index_options
@bucket_options
@_compile_options
@click.option("--timeout", type=click.FloatRange(min=0.1), metavar="SECONDS",
              help="Stop a workload (SIGTERM, then SIGKILL to its process group) that runs longer.")
@click.option("--two-phase", is_flag=True,
              help="Layout A: the workload only extracts graphs; neffcache compiles them (leased, pooled).")
@click.option("--no-prefetch", is_flag=True, help="Do not pull the namespace from remote tiers first.")
@click.option("--pattern", "patterns", multiple=True, metavar="KIND=REGEX",
              help="Extra log pattern (KIND: hit, miss, compile, failure) with a (?P<path>), (?P<entry>) "
                   "or (?P<key>) group.")
@click.option("--log-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where each bucket's workload output goes (default under ~/.cache/neffcache/warm-logs).")
@click.option("--allow-failures", is_flag=True, help="Exit 0 even when graphs failed or a workload crashed.")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines on stderr.")
@tag_option
@json_option
@workload_argument
def warm_cmd(instance: str | None, lnc: int | None, compiler_version: str | None, compiler: str | None,
             stores: tuple[str, ...], index_url: str | None, token: str | None, bucket_flags: tuple[str, ...],
             matrix_file: Path | None, parallel: int | None, shard: str | None, compile_timeout: float | None,
             compile_memory: float | None, retry_failed: bool, failed_ttl: float | None, timeout: float | None,
             two_phase: bool,
             no_prefetch: bool, patterns: tuple[str, ...], log_dir: Path | None, allow_failures: bool,
             quiet: bool, tags: dict[str, str], as_json: bool, command: tuple[str, ...]) -> None:
    """Compile a workload's graphs on a CPU host, compile-only, and publish the NEFFs.

    Runs COMMAND once per shape bucket with TORCH_NEURONX_COMPILE_ONLY=1 and
    NEURON_RT_FAKE_INSTANCE_TYPE set, and the cache variables of every runtime pointed at the
    toolchain's namespace, so only what the stores lack is compiled (for TorchNeuron's native
    cache this is the only way to warm it: the runtime writes its own keys). New entries get a
    manifest with the tags and go to every writable store. Exit 1 when a graph failed or a
    workload crashed or timed out (unless --allow-failures); 130/143 when interrupted.

    \b
    Example:
      neffcache warm --instance trn2.48xlarge --store /nvme/cache --store s3://ml-cache/neuron \\
          --bucket SEQ=512,1024,2048 --parallel 4 --shard $JOB_COMPLETION_INDEX/4 --tag model=llama3-8b \\
          -- python train.py --seq-len {SEQ} --max-steps 2
    """
    buckets = build_buckets(bucket_flags, matrix_file)  # a typo in the matrix fails before anything runs
    settings = _settings(stores, instance=instance, compiler=compiler, compiler_version=compiler_version,
                         index_url=index_url, token=token, failed_ttl=failed_ttl)
    toolchain = job_toolchain(settings, lnc)
    exe = find_compiler(settings.compiler)
    all_tags = {**settings.tags, **tags}
    if log_dir is None:  # the runs' logs under the cache home are kept warm_log_days (neffcache.application.warm_logs)
        remove_runs(expired_runs(warm_log_home(), settings.warm_log_days))
    logs = log_dir or warm_log_home() / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    request = WarmRequest(command=command, instance=settings.instance or "", toolchain=toolchain, compiler=exe,
                          buckets=buckets, patterns=compile_patterns(patterns), log_dir=logs.absolute(),
                          shard=Shard.parse(shard), parallel=_parallel(settings, parallel), two_phase=two_phase,
                          timeout=timeout, compile_timeout=compile_timeout, compile_memory_mb=compile_memory,
                          retry_failed=retry_failed, failed_ttl=settings.failed_ttl, prefetch=not no_prefetch,
                          tags=all_tags)
    placement = _placement(settings, all_tags, "warm")
    _drive("warm", placement, lambda children: Warmer(request, placement, children, _progress(quiet)).run(),
           as_json, allow_failures)


@click.command("rewarm")
@click.option("--from-compiler", "from_version", required=True, metavar="OLD",
              help="The compiler version whose entries to recompile, e.g. 2.21.33363.0+82129205.")
@toolchain_options
@store_option()
@endpoint_option
@index_options
@layout_option("Which runtimes' entries to recompile.")
@_compile_options
@click.option("--allow-failures", is_flag=True, help="Exit 0 even when graphs failed to compile.")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines on stderr.")
@tag_option
@json_option
def rewarm_cmd(from_version: str, instance: str | None, lnc: int | None, compiler_version: str | None,
               compiler: str | None, stores: tuple[str, ...], index_url: str | None, token: str | None, layout: str,
               parallel: int | None, shard: str | None, compile_timeout: float | None, compile_memory: float | None,
               retry_failed: bool, failed_ttl: float | None, allow_failures: bool, quiet: bool, tags: dict[str, str],
               as_json: bool) -> None:
    """Recompile the stored HLOs of an old compiler's entries with the installed one.

    After a compiler bump, every entry of OLD that kept its HLO is compiled again with the
    neuronx-cc on PATH (or --compiler) for its own target and LNC, and published where the new
    runtime looks: layout A at neuronxcc-NEW/MODULE_<same>+<same>/. Parallel, sharded (--shard)
    and leased, so several hosts can share the work. --instance limits it to one target (and
    names the target of roots the runtime filled without a target directory).

    What it cannot do: TorchNeuron's native cache (layout B) names NEFFs by a key only the
    runtime computes, so rewarm recompiles only the HLOs kept under neffcache's own
    torchneuron-OLD/hlo/ and publishes them under neffcache's key (served by neffcache's API,
    not found by the native runtime); vLLM's cache (layout C) keeps no HLO to recompile. Warm
    those with `neffcache warm -- <your workload>` and the new compiler instead.

    \b
    Example:
      neffcache rewarm --from-compiler 2.21.33363.0+82129205 --store fsx:///mnt/fsx/neuron-cache \\
          --parallel 8 --shard 0/2
    """
    settings = _settings(stores, instance=instance, compiler=compiler, compiler_version=compiler_version,
                         index_url=index_url, token=token, failed_ttl=failed_ttl)
    exe = find_compiler(settings.compiler)
    new_version = settings.compiler_version or installed_version(exe)
    all_tags = {**settings.tags, **tags}
    request = RewarmRequest(from_version=from_version, to_version=new_version, compiler=exe, instance=instance,
                            lnc=lnc, layouts=chosen_layouts(layout), shard=Shard.parse(shard),
                            parallel=_parallel(settings, parallel), compile_timeout=compile_timeout,
                            compile_memory_mb=compile_memory, retry_failed=retry_failed, tags=all_tags,
                            failed_ttl=settings.failed_ttl)
    placement = _placement(settings, all_tags, "rewarm")
    _drive("rewarm", placement, lambda children: Rewarmer(request, placement, children, _progress(quiet)).run(),
           as_json, allow_failures)


@click.command("run", context_settings=PASS_THROUGH)
@toolchain_options
@store_option()
@endpoint_option
@index_options
@click.option("--prefetch", is_flag=True, help="Pull the toolchain's namespace from the remote tiers first.")
@click.option("--prefetch-tag", "prefetch_tags", multiple=True, metavar="KEY=VALUE",
              help="Prefetch only entries with this tag (implies --prefetch); repeatable.")
@click.option("--pattern", "patterns", multiple=True, metavar="KIND=REGEX",
              help="Extra log pattern (KIND: hit, miss, compile, failure) with a (?P<path>), (?P<entry>) "
                   "or (?P<key>) group.")
@click.option("--no-default-patterns", is_flag=True,
              help="Use only the --pattern ones, not the runtimes' own lines.")
@click.option("--no-publish", is_flag=True, help="Do not publish what the job compiled.")
@click.option("--report", "report_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the counts as JSON to this file.")
@click.option("-q", "--quiet", is_flag=True, help="No summary line on stderr after the job.")
@tag_option
@workload_argument
def run_cmd(instance: str | None, lnc: int | None, compiler_version: str | None, compiler: str | None,
            stores: tuple[str, ...], index_url: str | None, token: str | None, prefetch: bool,
            prefetch_tags: tuple[str, ...], patterns: tuple[str, ...], no_default_patterns: bool, no_publish: bool,
            report_file: Path | None, quiet: bool, tags: dict[str, str], command: tuple[str, ...]) -> None:
    """Run a training or inference job with the cache set up, and account for it.

    Sets the cache variables of every runtime for the toolchain, passes the job's output
    through unchanged while counting hits, misses, compiles and failures from the runtimes'
    log lines, forwards signals, then publishes what the job compiled to every writable
    store and reports it to the index. Exits with the job's exit code.

    \b
    Example:
      neffcache run --instance trn2.48xlarge --store /nvme/cache --store s3://ml-cache/neuron \\
          --prefetch --tag model=llama3-8b --tag team=llm -- torchrun --nproc-per-node 32 train.py
    """
    settings = _settings(stores, instance=instance, compiler=compiler, compiler_version=compiler_version,
                         index_url=index_url, token=token)
    toolchain = job_toolchain(settings, lnc)
    all_tags = {**settings.tags, **tags}
    parsed_prefetch = dict(t.split("=", 1) for t in prefetch_tags if "=" in t)
    if len(parsed_prefetch) != len(prefetch_tags):
        raise click.BadParameter("expected KEY=VALUE", param_hint="--prefetch-tag")
    request = RunRequest(command=command, toolchain=toolchain,
                         patterns=compile_patterns(patterns, defaults=not no_default_patterns),
                         prefetch=prefetch or bool(prefetch_tags), prefetch_tags=parsed_prefetch, tags=all_tags,
                         publish=not no_publish)
    placement = _placement(settings, all_tags, "run")
    try:
        result = run_job(request, placement)
    finally:
        placement.close()
    if report_file is not None:
        report_file.write_text(json.dumps(result.to_json(), indent=2, sort_keys=True) + "\n")
    if not quiet:
        c = result.counts
        click.echo(f"neffcache run: {c['hit']} hits, {c['miss']} misses, {c['compile']} compiles, "
                   f"{c['failure']} failures; published {result.published} new entr"
                   f"{'y' if result.published == 1 else 'ies'}"
                   + (f", prefetched {result.prefetched}" if result.prefetched else "")
                   + f"; exit {result.exit_code}", err=True)
        for problem in result.problems:
            click.echo(f"neffcache run: PROBLEM: {problem}", err=True)
        if report_file is not None and result.graphs:
            click.echo(f"neffcache run: {len(result.graphs)} graph{'' if len(result.graphs) == 1 else 's'} missed; "
                       f"why: neffcache why-miss --from-report {report_file}", err=True)
    announce_index(placement.index)
    sys.exit(result.exit_code)


COMMANDS: list[click.Command] = [warm_cmd, rewarm_cmd, run_cmd]
