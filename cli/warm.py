"""Commands that compile or wrap workloads: ``warm``, ``rewarm``, ``run``."""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from neffcache.application.config import job_toolchain
from neffcache.application.warm_logs import expired_runs, remove_runs, warm_log_home
from neffcache.toolchain import compiler_version as installed_version
from neffcache.toolchain import find_compiler
from neffcache.units import plural
from neffcache.warmers.logscan import compile_patterns
from neffcache.warmers.matrix import Shard, build_buckets
from neffcache.warmers.rewarm import Rewarmer, RewarmRequest
from neffcache.warmers.warm import Warmer, WarmRequest
from neffcache.warmers.wrap import RunRequest, RunResult, run_job

from .coldstart import local_run, local_run_options, with_local_tier
from .errors import announce_index
from .jobs import compile_options, drive, job_settings, open_job_placement, parallelism, progress_lines
from .options import (
    PASS_THROUGH,
    bucket_options,
    chosen_layouts,
    endpoint_option,
    flags_form_option,
    index_options,
    layout_option,
    store_option,
    tag_option,
    toolchain_options,
    workload_argument,
)
from .output import json_option, write_report


@click.command("warm", context_settings=PASS_THROUGH)
@toolchain_options
@store_option()
@endpoint_option
@index_options
@bucket_options
@compile_options
@click.option("--timeout", type=click.FloatRange(min=0.1), metavar="SECONDS",
              help="Stop a workload (SIGTERM, then SIGKILL to its process group) that runs longer.")
@click.option("--two-phase", is_flag=True,
              help="libneuronxla (neuronxcc layout): the workload only extracts graphs; neffcache compiles them "
                   "(leased, pooled).")
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

    A vLLM-Neuron server is warmed the same way: it compiles on the CPU host
    (VLLM_NEURON_CPU_COMPILE=1, NEURON_PLATFORM_TARGET_OVERRIDE from --instance) with the
    store as its shared tier and a private local tier, is stopped once it prints that it is
    up, and what it compiled lands in the store where serving pods' NEURON_LIBTORCH_REMOTE_CACHE
    reads it (--parallel also sets NEURON_LIBTORCH_PARALLEL_COMPILE_WORKERS).

    \b
    Example:
      neffcache warm --instance trn2.48xlarge --store /nvme/cache --store s3://ml-cache/neuron \\
          --bucket SEQ=512,1024,2048 --parallel 4 --shard $JOB_COMPLETION_INDEX/4 --tag model=llama3-8b \\
          -- python train.py --seq-len {SEQ} --max-steps 2
      neffcache warm --instance trn2.48xlarge --store /mnt/fsx/neuron-cache \\
          -- python3 -m vllm.entrypoints.openai.api_server --model meta-llama/Llama-3.1-8B
    """
    buckets = build_buckets(bucket_flags, matrix_file)  # a typo in the matrix fails before anything runs
    settings = job_settings(stores, instance=instance, compiler=compiler, compiler_version=compiler_version,
                            index_url=index_url, token=token, failed_ttl=failed_ttl)
    toolchain = job_toolchain(settings, lnc)
    exe = find_compiler(settings.compiler)
    all_tags = {**settings.tags, **tags}
    if log_dir is None:  # the runs' logs under the cache home are kept warm_log_days (neffcache.application.warm_logs)
        remove_runs(expired_runs(warm_log_home(), settings.warm_log_days))
    logs = log_dir or warm_log_home() / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    request = WarmRequest(command=command, instance=settings.instance or "", toolchain=toolchain, compiler=exe,
                          buckets=buckets, patterns=compile_patterns(patterns), log_dir=logs.absolute(),
                          shard=Shard.parse(shard), parallel=parallelism(settings, parallel), two_phase=two_phase,
                          timeout=timeout, compile_timeout=compile_timeout, compile_memory_mb=compile_memory,
                          retry_failed=retry_failed, failed_ttl=settings.failed_ttl, prefetch=not no_prefetch,
                          tags=all_tags, compile_workers=parallel, local_root=settings.local_root)
    placement = open_job_placement(settings, all_tags, "warm")
    drive("warm", placement, lambda children: Warmer(request, placement, children, progress_lines(quiet)).run(),
           as_json, allow_failures)


@click.command("rewarm")
@click.option("--from-compiler", "from_version", required=True, metavar="OLD",
              help="The compiler version whose entries to recompile, e.g. 2.21.33363.0+82129205.")
@toolchain_options
@store_option()
@endpoint_option
@index_options
@layout_option("Which runtimes' entries to recompile.")
@compile_options
@flags_form_option("the new entries are named by")
@click.option("--allow-failures", is_flag=True, help="Exit 0 even when graphs failed to compile.")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines on stderr.")
@tag_option
@json_option
def rewarm_cmd(from_version: str, instance: str | None, lnc: int | None, compiler_version: str | None,
               compiler: str | None, stores: tuple[str, ...], index_url: str | None, token: str | None, layout: str,
               parallel: int | None, shard: str | None, compile_timeout: float | None, compile_memory: float | None,
               retry_failed: bool, failed_ttl: float | None, flags_form: str | None, allow_failures: bool, quiet: bool,
               tags: dict[str, str], as_json: bool) -> None:
    """Recompile the stored HLOs of an old compiler's entries with the installed one.

    After a compiler bump, every entry of OLD that kept its HLO is compiled again with the
    neuronx-cc on PATH (or --compiler) for its own target and LNC, and published where the new
    runtime looks: neuronxcc at neuronxcc-NEW/MODULE_<same graph>+<suffix>/, the suffix the md5
    of the flags file in the form the new runtime names entries by. That form follows the
    libneuronxla release, not the compiler, so it is read off the new namespace's own newest
    entries in the stores (warm one graph with the new runtime first), else taken from the
    version table, else forced with --flags-form; the report says which rule decided.
    Parallel, sharded (--shard) and leased, so several hosts can share the work. --instance
    limits it to one target (and names the target of roots the runtime filled without a
    target directory).

    What it cannot do: TorchNeuron's native cache (torchneuron layout) names NEFFs by a key only the
    runtime computes, so rewarm recompiles only the HLOs kept under neffcache's own
    torchneuron-OLD/hlo/ and publishes them under neffcache's key (served by neffcache's API,
    not found by the native runtime); vLLM-Neuron's cache keeps no HLO to recompile. Warm
    those with `neffcache warm -- <your workload>` and the new compiler instead.

    \b
    Example:
      neffcache rewarm --from-compiler 2.21.33363.0+82129205 --store fsx:///mnt/fsx/neuron-cache \\
          --parallel 8 --shard 0/2
    """
    settings = job_settings(stores, instance=instance, compiler=compiler, compiler_version=compiler_version,
                            index_url=index_url, token=token, failed_ttl=failed_ttl)
    exe = find_compiler(settings.compiler)
    new_version = settings.compiler_version or installed_version(exe)
    all_tags = {**settings.tags, **tags}
    request = RewarmRequest(from_version=from_version, to_version=new_version, compiler=exe, instance=instance,
                            lnc=lnc, layouts=chosen_layouts(layout), shard=Shard.parse(shard),
                            parallel=parallelism(settings, parallel), compile_timeout=compile_timeout,
                            compile_memory_mb=compile_memory, retry_failed=retry_failed, tags=all_tags,
                            failed_ttl=settings.failed_ttl, flags_form=flags_form)
    placement = open_job_placement(settings, all_tags, "rewarm")
    drive("rewarm", placement, lambda children: Rewarmer(request, placement, children, progress_lines(quiet)).run(),
           as_json, allow_failures)


@click.command("run", context_settings=PASS_THROUGH)
@toolchain_options
@store_option()
@endpoint_option
@index_options
@click.option("--prefetch", is_flag=True, help="Pull the toolchain's namespace from the remote tiers first.")
@click.option("--prefetch-tag", "prefetch_tags", multiple=True, metavar="KEY=VALUE",
              help="Prefetch only entries with this tag (implies --prefetch); repeatable.")
@local_run_options
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
            report_file: Path | None, quiet: bool, tags: dict[str, str], command: tuple[str, ...],
            local_dir: str | None, **local: Any) -> None:
    """Run a training or inference job with the cache set up, and account for it.

    Sets the cache variables of every runtime for the toolchain, passes the job's output
    through unchanged while counting hits, misses, compiles and failures from the runtimes'
    log lines, forwards signals, then publishes what the job compiled to every writable
    store and reports it to the index. Exits with the job's exit code.

    With --local DIR the job runs against a node-local tier: its entries are prefetched into
    DIR from the --store tiers (verified, under the trust policy), the runtimes are pointed at
    DIR (vLLM-Neuron's shared tier stays the shared filesystem store), what the job commits is
    written back to the shared tiers while it runs (a spot reclaim loses little) and after it
    ends, each entry once, with this run's tags and compile seconds in its manifest. The
    report adds the prefetch and the write-back's lag.

    \b
    Example:
      neffcache run --instance trn2.48xlarge --store /nvme/cache --store s3://ml-cache/neuron \\
          --prefetch --tag model=llama3-8b --tag team=llm -- torchrun --nproc-per-node 32 train.py
      neffcache run --instance trn2.48xlarge --local /nvme/neffcache --store fsx:///mnt/fsx/neuron-cache \\
          --report /nvme/run.json -- torchrun --nproc-per-node 32 train.py
    """
    settings = job_settings(stores, instance=instance, compiler=compiler, compiler_version=compiler_version,
                         index_url=index_url, token=token)
    if local_dir is not None:
        settings = with_local_tier(settings, local_dir)
    elif any(local[k] is not None for k in ("prefetch_max_bytes", "prefetch_deadline", "require_signed")):
        raise click.UsageError("--prefetch-max-bytes, --prefetch-deadline and --require-signed go with --local DIR")
    toolchain = job_toolchain(settings, lnc)
    all_tags = {**settings.tags, **tags}
    parsed_prefetch = dict(t.split("=", 1) for t in prefetch_tags if "=" in t)
    if len(parsed_prefetch) != len(prefetch_tags):
        raise click.BadParameter("expected KEY=VALUE", param_hint="--prefetch-tag")
    placement = open_job_placement(settings, all_tags, "run")
    try:
        spec = local_run(settings, placement, toolchain, parsed_prefetch, **local) if local_dir else None
        request = RunRequest(command=command, toolchain=toolchain,
                             patterns=compile_patterns(patterns, defaults=not no_default_patterns),
                             prefetch=prefetch or bool(prefetch_tags), prefetch_tags=parsed_prefetch, tags=all_tags,
                             publish=not no_publish, failed_ttl=settings.failed_ttl, local=spec)
        result = run_job(request, placement)
    finally:
        placement.close()
    if report_file is not None:
        write_report(report_file, result.to_json())
    if not quiet:
        _summary(result, report_file, settings.stores)
    announce_index(placement.index, [store.url for store in placement.writable])
    sys.exit(result.exit_code)


def _summary(result: RunResult, report_file: Path | None, stores: Sequence[str]) -> None:
    c = result.counts
    click.echo(f"neffcache run: {plural(c['hit'], 'hit')}, {plural(c['miss'], 'miss')}, "
               f"{plural(c['compile'], 'compile')}, {plural(c['failure'], 'failure')}; "
               f"published {result.published} new entr{'y' if result.published == 1 else 'ies'}"
               + (f", prefetched {result.prefetched}" if result.prefetched else "")
               + f"; exit {result.exit_code}", err=True)
    if result.local is not None:
        back = result.local["write_back"]
        lag = f"lag p50 {back['lag_p50']}s, p99 {back['lag_p99']}s; " if back["lag_p50"] is not None else ""
        click.echo(f"neffcache run: wrote back {back['published']} entr{'y' if back['published'] == 1 else 'ies'} "
                   f"during the run ({lag}{'drained' if back['drained'] else 'NOT drained'})", err=True)
        fetched = result.local["prefetch"]
        if fetched.get("error"):
            click.echo(f"neffcache run: PROBLEM: the prefetch failed, the job ran without it: {fetched['error']}",
                       err=True)
        for row in [*fetched.get("refused", []), *fetched.get("failed", [])]:
            click.echo(f"neffcache run: PROBLEM: prefetch of {row['path']} ({row['store']}): {row['detail']}", err=True)
    if result.cleared:
        n = len(result.cleared)
        click.echo(f"neffcache run: cleared {n} failure{'' if n == 1 else 's'} the host caused "
                   "(killed, out of memory, missing library...): the next job compiles "
                   f"{'it' if n == 1 else 'them'} again", err=True)
    for problem in result.problems:
        click.echo(f"neffcache run: PROBLEM: {problem}", err=True)
    if report_file is not None and result.graphs:
        # The stores the job read: why-miss looks in them (it needs a store or an index).
        where = "".join(f" --store {shlex.quote(url)}" for url in stores)
        click.echo(f"neffcache run: {len(result.graphs)} graph{'' if len(result.graphs) == 1 else 's'} missed; "
                   f"why: neffcache why-miss --from-report {shlex.quote(str(report_file))}{where}", err=True)


COMMANDS: list[click.Command] = [warm_cmd, rewarm_cmd, run_cmd]
