"""push and pull: copy the entries one store has and another lacks, verified."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from neffcache.application.config import load_settings
from neffcache.entry import Entry
from neffcache.index import IndexClient, entry_record
from neffcache.instances import TARGETS
from neffcache.manifest import Manifest
from neffcache.replication.sync import COPYABLE_STATES, SyncReport, sync
from neffcache.stores import open_store
from neffcache.stores.base import Store
from neffcache.units import human_bytes, plural

from .errors import SOME_ENTRIES_FAILED, announce_index
from .options import _parse_tags, endpoint_option, index_options, open_settings_index, store_options
from .output import json_option, progress, render

F = TypeVar("F", bound=Callable[..., Any])


def sync_options(f: F) -> F:
    options = [
        click.option("--namespace", "namespaces", multiple=True, metavar="PATH",
                     help="Only this namespace (trn2-lnc2/neuronxcc-2.27.5334.0+f702b353, or a leading part "
                          "such as trn2-lnc2); repeatable."),
        click.option("--compiler-version", "compiler_versions", multiple=True, metavar="VERSION",
                     help="Only entries of this compiler version; repeatable."),
        click.option("--target", "targets", multiple=True, type=click.Choice(list(TARGETS)),
                     help="Only entries of this compile target (needs neffcache's <target>-lnc<N> directory); "
                          "repeatable."),
        click.option("--state", "states", multiple=True, default=["SUCCESS"], show_default=True,
                     type=click.Choice(sorted(s.value for s in COPYABLE_STATES)),
                     help="Entry states to copy; repeatable (FAILED/EMPTY share compile failures and HLOs)."),
        click.option("--tag", "tags", multiple=True, callback=_parse_tags, metavar="KEY=VALUE",
                     help="Only entries whose manifest has this tag; repeatable (all must match)."),
        click.option("--parallel", type=click.IntRange(1, 256), default=16, show_default=True,
                     help="Entries in flight at once (S3 also splits big NEFFs into parallel parts)."),
        endpoint_option,
        index_options,
        json_option,
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _open(url: str, options: dict[str, Any], parallel: int, **kwargs: Any) -> Store:
    return open_store(url, **kwargs, **options, max_concurrency=parallel)


def _text(verb: str, report: SyncReport) -> str:
    rate = report.bytes / report.seconds if report.seconds > 0 else 0.0
    out = [f"created {report.dst} (it did not exist)"] if report.created_destination else []
    out += [f"{verb} {report.src} -> {report.dst}: {len(report.copied)} copied ({human_bytes(report.bytes)}), "
           f"{len(report.skipped)} skipped, {len(report.failed)} failed, {report.filtered} filtered out "
           f"in {report.seconds:.1f}s ({human_bytes(rate)}/s)"]
    for reason, count in sorted(report.skipped_reasons().items()):
        out.append(f"  skipped {count}: {reason}")
    for failure in report.failed:
        out.append(f"FAILED {failure.path}: {failure.reason}")
    if report.foreign:
        shown = ", ".join(report.foreign[:5]) + (" ..." if len(report.foreign) > 5 else "")
        out.append(f"  foreign, kept: {len(report.foreign)} file(s) that are no entry's, not copied ({shown})")
    return "\n".join(out)


def _run(verb: str, src_url: str, dst_url: str, namespaces: tuple[str, ...], compiler_versions: tuple[str, ...],
         targets: tuple[str, ...], states: tuple[str, ...], tags: dict[str, str], parallel: int,
         index_url: str | None, token: str | None, as_json: bool) -> None:
    settings = load_settings(index_url=index_url, token=token)
    # Every entry copied is registered with the index as held by DST. Reports never fail the
    # copy: an index that is down gets them from the spool later.
    index = open_settings_index(settings)
    try:
        options = store_options(settings)
        src = _open(src_url, options, parallel, read_only=True, create=False)
        try:
            dst = _open(dst_url, options, parallel)

            def register(entry: Entry, manifest: Manifest | None) -> None:
                index.register_entry(entry_record(entry, dst.url, manifest))

            try:
                with progress(f"{verb}ing", enabled=not as_json) as bar:
                    report = sync(src, dst, namespaces=namespaces, compiler_versions=compiler_versions,
                                  targets=targets, states=states, tags=tags, parallel=parallel,
                                  progress=lambda done, total, size: bar.update(done, total, human_bytes(size)),
                                  on_copied=register if index.enabled else None)
            finally:
                dst.close()
        finally:
            src.close()
    finally:
        index.close()
    data = report.to_json()
    pending = len(index.spool.pending()) if isinstance(index, IndexClient) else 0
    counts = index.counts()
    # Registered: delivered, or safely in the spool for `flush`; never what was dropped.
    registered = counts.reported - counts.lost - counts.buffered
    if index.enabled:
        data["index"] = {"url": settings.index_url, "registered": registered, "spooled_batches": pending,
                         **counts.to_json()}

    def text() -> str:
        out = _text(verb, report)
        if index.enabled:
            # Registered = delivered or waiting in the spool; the notice on stderr says which.
            out += f"\nindex {settings.index_url}: {plural(registered, 'entry')} registered"
        return out

    render(as_json, data, text)
    announce_index(index, [dst_url])
    if report.failed:
        sys.exit(SOME_ENTRIES_FAILED)


@click.command("push")
@click.argument("src_url", metavar="SRC")
@click.argument("dst_url", metavar="DST")
@sync_options
def push_cmd(src_url: str, dst_url: str, **options: Any) -> None:
    """Publish the entries SRC has and DST lacks: a local cache to S3, FSx to S3.

    Both sides are listed once and compared by entry; each entry is checked against its
    manifest (one is computed for entries a runtime wrote) and published whole, so an
    interrupted push leaves nothing half-visible and a rerun finishes it. Exits 1 when any
    entry failed (reasons are printed).

    \b
    Example:
      neffcache push /var/tmp/neuron-compile-cache s3://my-bucket/neuron-cache --target trn2 --parallel 32
    """
    _run("push", src_url, dst_url, **options)


@click.command("pull")
@click.argument("src_url", metavar="SRC")
@click.argument("dst_url", metavar="DST")
@sync_options
def pull_cmd(src_url: str, dst_url: str, **options: Any) -> None:
    """Fetch the entries SRC has and DST lacks: S3 to a local or FSx cache.

    Every entry is verified against its manifest before it becomes visible in DST; a digest
    mismatch is reported and never lands. Exits 1 when any entry failed.

    \b
    Example:
      neffcache pull s3://my-bucket/neuron-cache fsx:///mnt/fsx/neuron-cache \\
          --namespace trn2-lnc2/neuronxcc-2.27.5334.0+f702b353 --tag model=llama
    """
    _run("pull", src_url, dst_url, **options)


COMMANDS: list[click.Command] = [push_cmd, pull_cmd]
