"""prefetch: a pod's NEFFs from the shared tiers to node-local disk, verified, before it starts."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from neffcache.application.config import Settings, job_toolchain, load_settings
from neffcache.application.jobenv import local_tier_env, render_env, runtime_root
from neffcache.application.trusted import trust_policy
from neffcache.errors import ConfigError
from neffcache.index import Index
from neffcache.layouts import LAYOUTS
from neffcache.replication.prefetch import PrefetchReport, PrefetchRequest, prefetch
from neffcache.stores import open_store
from neffcache.stores.base import Store
from neffcache.toolchain import Toolchain
from neffcache.units import human_bytes
from neffcache.warmers.local_run import LocalRun
from neffcache.warmers.placement import Placement

from .errors import SOME_ENTRIES_FAILED
from .options import (
    _parse_tags,
    chosen_layouts,
    duration,
    index_options,
    layout_option,
    open_settings_index,
    report_paths,
    size,
    store_options,
    toolchain_options,
)
from .output import json_option, progress, render, write_atomically

F = TypeVar("F", bound=Callable[..., Any])


@click.command("prefetch")
@click.option("--to", "local_root", metavar="DIR", help="The node-local tier (default: NEFFCACHE_LOCAL_ROOT).")
@click.option("--store", "store_urls", multiple=True, metavar="URL",
              help="A shared tier to copy from, fastest first; repeatable (default: NEFFCACHE_STORES).")
@toolchain_options
@layout_option("Which runtime's entries to fetch.")
@click.option("--from-report", "report_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Only the graphs a `run --report` or `plan --json` file names.")
@click.option("--tag", "tags", multiple=True, callback=_parse_tags, metavar="KEY=VALUE",
              help="Only entries whose manifest has this tag; repeatable.")
@click.option("--model", help="Only entries tagged model=MODEL.")
@click.option("--max-bytes", metavar="SIZE", callback=size,
              help="Copy at most this much (e.g. 20G): the most recently used first.")
@click.option("--deadline", metavar="DURATION", callback=duration,
              help="Start no copy after this long (e.g. 90s): the job starts on time.")
@click.option("--parallel", type=click.IntRange(1, 256), default=8, show_default=True, help="Entries in flight.")
@click.option("--require-signed", is_flag=True, default=None,
              help="Refuse entries no trusted key signed (default: NEFFCACHE_REQUIRE_SIGNED).")
@click.option("--env-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the exports here (an init container hands them to the job).")
@click.option("--best-effort", is_flag=True,
              help="Exit 0 even when some entries failed or were refused (they are still reported): the job "
                   "then compiles what is missing instead of not starting.")
@index_options
@json_option
def prefetch_cmd(local_root: str | None, store_urls: tuple[str, ...], instance: str | None, lnc: int | None,
                 compiler_version: str | None, compiler: str | None, layout: str, report_file: Path | None,
                 tags: dict[str, str], model: str | None, max_bytes: int | None, deadline: float | None,
                 parallel: int, require_signed: bool | None, env_file: Path | None, best_effort: bool,
                 index_url: str | None, token: str | None, as_json: bool) -> None:
    """Copy the entries a job will need from the shared tiers to node-local disk, verified.

    By default every committed entry of the instance's toolchain (compiler, target, LNC), most
    recently used first (the index's record, else the stores' stamps). Each is checked against
    its manifest and the trust policy before it becomes visible; a rerun copies only what is
    missing. vLLM-Neuron's entries land in its local tier's form. Prints the exports that point
    the job at the local tier.

    \b
    Example:
      neffcache prefetch --instance trn2.48xlarge --store s3://ml-neuron-cache/prod --to /nvme/neffcache \\
          --max-bytes 40G --deadline 120s --env-file /shared/neffcache.env
    """
    settings = load_settings(instance=instance, compiler=compiler, compiler_version=compiler_version,
                             local_root=local_root, index_url=index_url, token=token)
    toolchain = job_toolchain(settings, lnc)
    sources_urls = store_urls or tuple(u for u in settings.stores if not _same_dir(u, settings.local_root))
    if not sources_urls:
        raise ConfigError("name a shared tier to copy from: --store URL (or NEFFCACHE_STORES)")
    layouts = chosen_layouts(layout)
    req = PrefetchRequest(
        namespaces=tuple(LAYOUTS[name].namespace_for(toolchain) for name in layouts),
        paths=report_paths(report_file) if report_file else None,
        tags={**tags, **({"model": model} if model else {})},
        max_bytes=max_bytes, deadline=deadline,
        parallel=parallel, policy=trust_policy(settings, require_signed=require_signed))
    report = _prefetch(settings, sources_urls, req, as_json)
    shared = next((u for u in sources_urls if runtime_root(u)[1]), None)
    env, notes = local_tier_env(settings.local_root, shared, toolchain, layouts)
    if env_file is not None:
        write_atomically(env_file, (render_env(env, "bash") + "\n").encode())
    data = {**report.to_json(), "toolchain": toolchain.to_json(), "env": env, "notes": notes}
    render(as_json, data, lambda: _text(report, env, notes))
    if not report.ok and not best_effort:
        sys.exit(SOME_ENTRIES_FAILED)


def _prefetch(settings: Any, urls: tuple[str, ...], req: PrefetchRequest, quiet: bool) -> PrefetchReport:
    options = store_options(settings)
    index = open_settings_index(settings)
    sources: list[Store] = []
    try:
        sources = [open_store(u, **options, read_only=True, create=False, max_concurrency=req.parallel)
                   for u in urls]
        dst = open_store(settings.local_root, **options)
        try:
            usage = _index_usage(index, sources)
            with progress("prefetching", enabled=not quiet) as bar:
                return prefetch(sources, dst, req, usage=usage,
                                progress=lambda done, total, size: bar.update(done, total, human_bytes(size)))
        finally:
            dst.close()
    finally:
        for store in sources:
            store.close()
        index.close()


def _index_usage(index: Index, sources: list[Store]) -> dict[str, float] | None:
    """Entry path -> last use the index recorded in any of ``sources``; None without an index
    (or one that is down: the stores' stamps then)."""
    if not index.enabled:
        return None
    usage: dict[str, float] = {}
    try:
        for store in sources:
            for row in index.find_entries(store=store.url, page_size=1000):
                if row.get("last_used") is not None and isinstance(row.get("path"), str):
                    usage[row["path"]] = max(usage.get(row["path"], 0.0), float(row["last_used"]))
    except Exception as exc:
        click.echo(f"neffcache: the index gave no usage ({exc}); ordering by the stores' stamps", err=True)
        return None
    return usage


def _same_dir(url: str, local: str) -> bool:
    root, is_local = runtime_root(url)
    return is_local and Path(root).resolve() == Path(local).resolve()


def _text(report: PrefetchReport, env: dict[str, str], notes: list[str]) -> str:
    rate = report.bytes / report.seconds if report.seconds > 0 else 0.0
    out = [f"prefetched {len(report.copied)} of {report.planned} entries ({human_bytes(report.bytes)}, "
           f"{human_bytes(rate)}/s) into {report.dst} in {report.seconds:.1f}s; {report.present} were there already"]
    if report.unsigned:
        out.append(f"  {report.unsigned} copied without a trusted signature (--require-signed refuses them)")
    if report.over_budget:
        out.append(f"  {len(report.over_budget)} left out by --max-bytes")
    if report.after_deadline:
        out.append(f"  {len(report.after_deadline)} left out by --deadline")
    out += [f"REFUSED {f.path} ({f.store}): {f.detail}" for f in report.refused]
    out += [f"FAILED {f.path} ({f.store}): {f.detail}" for f in report.failed]
    out += [f"# note: {n}" for n in notes]
    out.append(render_env(env, "bash"))
    return "\n".join(out)


def local_run_options(f: F) -> F:
    """``run --local``'s options (the rest of its prefetch is ``--prefetch-tag``)."""
    options = [
        click.option("--local", "local_dir", metavar="DIR",
                     help="Run against this node-local tier: prefetch the job's entries into it from the --store "
                          "tiers (verified, trust policy), write back what the job commits while it runs and "
                          "after it ends."),
        click.option("--prefetch-max-bytes", metavar="SIZE", callback=size,
                     help="--local: copy at most this much before the job (the most recently used first)."),
        click.option("--prefetch-deadline", metavar="DURATION", callback=duration,
                     help="--local: start no copy after this long; the job starts on time."),
        click.option("--require-signed", is_flag=True, default=None,
                     help="--local: prefetch only entries a trusted key signed (default: NEFFCACHE_REQUIRE_SIGNED)."),
        click.option("--drain-timeout", callback=duration, default="30s", show_default=True, metavar="DURATION",
                     help="--local: how long the write-back may take after the job ends (within the pod's grace "
                          "period)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def with_local_tier(settings: Settings, local_dir: str) -> Settings:
    """The settings of ``run --local DIR``: DIR first, the shared tiers behind it (never DIR twice)."""
    shared = tuple(u for u in settings.stores if not _same_dir(u, local_dir))
    if not shared:
        raise ConfigError("run --local needs a shared tier to prefetch from and write back to: --store URL "
                          "(or NEFFCACHE_STORES)")
    return dataclasses.replace(settings, stores=(os.path.abspath(local_dir), *shared))


def local_run(settings: Settings, placement: Placement, toolchain: Toolchain, tags: Mapping[str, str], *,
              prefetch_max_bytes: int | None, prefetch_deadline: float | None, require_signed: bool | None,
              drain_timeout: float, **_: Any) -> LocalRun:
    """What ``run --local`` prefetches (every layout's namespace of the toolchain, most recently
    used first by the index's record) and how it writes back."""
    req = PrefetchRequest(namespaces=tuple(layout.namespace_for(toolchain) for layout in LAYOUTS.values()),
                          tags=dict(tags), max_bytes=prefetch_max_bytes, deadline=prefetch_deadline,
                          policy=trust_policy(settings, require_signed=require_signed))
    return LocalRun(req, usage=_index_usage(placement.index, placement.remotes), drain_timeout=drain_timeout)


COMMANDS = [prefetch_cmd]
