"""push and pull: copy the entries one store has and another lacks, verified."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import click

from neffcache.application.config import Settings, load_settings
from neffcache.application.trusted import trust_policy
from neffcache.entry import Entry
from neffcache.errors import ConfigError
from neffcache.index import Index, entry_record
from neffcache.instances import TARGETS
from neffcache.manifest import Manifest
from neffcache.operations import publisher
from neffcache.operations.lost_manifests import lost_problem, recorded_digests
from neffcache.redaction import redact_text
from neffcache.replication.inotify import open_watch
from neffcache.replication.sync import COPYABLE_STATES, SyncReport, sync
from neffcache.replication.watch import WriteBack
from neffcache.stores import open_store
from neffcache.stores.base import Store
from neffcache.toolchain import Toolchain, resolve_toolchain
from neffcache.trust import TrustPolicy
from neffcache.units import human_bytes, plural

from .errors import SOME_ENTRIES_FAILED, announce_index
from .options import _parse_tags, duration, endpoint_option, index_options, open_settings_index, store_options
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


def _reader_policy(verb: str, settings: Settings, require_signed: bool | None) -> TrustPolicy | None:
    """pull and promote judge every entry they copy; push publishes, it does not judge. promote
    re-signs, so it takes only what a trusted key signed, and needs a key of its own."""
    if verb == "promote" and publisher.current().signing_key is None:
        raise ConfigError("promote signs what it publishes: set signing_key (NEFFCACHE_SIGNING_KEY) to the key of "
                          "the destination's writers")
    if verb not in ("pull", "promote"):
        return None
    return trust_policy(settings, require_signed=True if verb == "promote" else require_signed)


def _lost_check(index: Index) -> Callable[[Store, Entry], str | None]:
    def lost(store: Store, entry: Entry) -> str | None:
        recorded = recorded_digests(index, [entry.path])
        return lost_problem(store, entry, recorded[entry.path]) if entry.path in recorded else None
    return lost


def _run(verb: str, src_url: str, dst_url: str, namespaces: tuple[str, ...], compiler_versions: tuple[str, ...],
         targets: tuple[str, ...], states: tuple[str, ...], tags: dict[str, str], parallel: int,
         index_url: str | None, token: str | None, as_json: bool, adopt_into: Toolchain | None = None,
         require_signed: bool | None = None, adopt: bool = False) -> None:
    settings = load_settings(index_url=index_url, token=token)
    policy = _reader_policy(verb, settings, require_signed)
    # push mints manifests for entries that have none, except where the index recorded one
    # (the manifest was lost: a substitute NEFF?) unless --adopt vouches for the bytes.
    check_lost = verb == "push" and not adopt
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
                with progress(verb.removesuffix("e") + "ing", enabled=not as_json) as bar:
                    report = sync(src, dst, namespaces=namespaces, compiler_versions=compiler_versions,
                                  targets=targets, states=states, tags=tags, parallel=parallel,
                                  progress=lambda done, total, size: bar.update(done, total, human_bytes(size)),
                                  on_copied=register if index.enabled else None, adopt_into=adopt_into,
                                  policy=policy, lost=_lost_check(index) if check_lost and index.enabled else None,
                                  promote=verb == "promote")
            finally:
                dst.close()
        finally:
            src.close()
    finally:
        index.close()
    data = report.to_json()
    pending = index.pending_batches()
    counts = index.counts()
    # Registered: delivered, or safely in the spool for `flush`; never what was dropped.
    registered = counts.reported - counts.lost - counts.buffered
    if index.enabled:
        data["index"] = {"url": redact_text(settings.index_url or ""), "registered": registered,
                         "spooled_batches": pending,
                         **counts.to_json()}

    def text() -> str:
        out = _text(verb, report)
        if index.enabled:
            # Registered = delivered or waiting in the spool; the notice on stderr says which.
            out += f"\nindex {redact_text(settings.index_url or '')}: {plural(registered, 'entry')} registered"
        return out

    render(as_json, data, text)
    announce_index(index, [dst_url])
    if report.failed:
        sys.exit(SOME_ENTRIES_FAILED)


@click.command("push")
@click.argument("src_url", metavar="SRC")
@click.argument("dst_url", metavar="DST")
@sync_options
@click.option("--watch", is_flag=True,
              help="Keep running beside a job (a sidecar): publish every entry the runtime commits in SRC within "
                   "seconds; on SIGTERM/SIGINT drain what is committed, then exit 0.")
@click.option("--interval", type=click.FloatRange(0.1, 3600), default=2.0, show_default=True,
              help="--watch: seconds between listings when no change was signalled (inotify wakes it sooner).")
@click.option("--drain-timeout", callback=duration, default="30s", show_default=True, metavar="DURATION",
              help="--watch: how long the last round may take after SIGTERM (within the pod's grace period).")
@click.option("--adopt-instance", metavar="TYPE",
              help="Publish entries of unknown toolchain (at a runtime's own root, which names no compiler: NxD "
                   "Inference's compiled models, vLLM-Neuron's own cache) into this instance's namespace: you "
                   "vouch that its toolchain built them.")
@click.option("--adopt-compiler-version", metavar="VERSION",
              help="With --adopt-instance: their compiler version (default: the installed neuronx-cc's).")
@click.option("--adopt", is_flag=True,
              help="Mint manifests even for entries whose manifest the index says was lost (their NEFF may be a "
                   "substitute): you vouch for these bytes.")
def push_cmd(src_url: str, dst_url: str, watch: bool, interval: float, drain_timeout: float,
             adopt_instance: str | None, adopt_compiler_version: str | None, adopt: bool, **options: Any) -> None:
    """Publish the entries SRC has and DST lacks: a local cache to S3, FSx to S3.

    Both sides are listed once and compared by entry; each entry is checked against its
    manifest (one is computed for entries a runtime wrote) and published whole, so an
    interrupted push leaves nothing half-visible and a rerun finishes it. Exits 1 when any
    entry failed (reasons are printed).

    With --watch it stays up beside the job and publishes what the runtime commits as it
    commits it (vLLM-Neuron's save_cache(), without anyone calling it); never an entry whose
    compile still holds its lock or whose commit marker is missing.

    With --adopt-instance, entries a runtime wrote at its own root, where no path says which
    toolchain built them, land in that toolchain's namespace, where prefetch and prune by
    compiler find them (NxD Inference's compiled models, from the host that compiled them).

    An entry without a manifest gets one made of its bytes, unless the index recorded it as
    published: its manifest was lost and its NEFF may be a substitute, so it is reported and
    not pushed; --adopt vouches for it.

    \b
    Example:
      neffcache push /var/tmp/neuron-compile-cache s3://my-bucket/neuron-cache --target trn2 --parallel 32
      neffcache push /nvme/neffcache s3://my-bucket/neuron-cache --watch --drain-timeout 25s
      neffcache push /models/Llama-3.1-8B s3://my-bucket/neuron-cache --adopt-instance trn2.48xlarge
    """
    if adopt_compiler_version and not adopt_instance:
        raise click.UsageError("--adopt-compiler-version goes with --adopt-instance")
    adopt_into = resolve_toolchain(adopt_instance, compiler_version_override=adopt_compiler_version) \
        if adopt_instance else None
    if watch:
        if adopt_into is not None:
            raise click.UsageError("--adopt-instance is for a one-off push, not --watch")
        _watch(src_url, dst_url, interval, drain_timeout, **options)
        return
    _run("push", src_url, dst_url, **options, adopt_into=adopt_into, adopt=adopt)


def _watch(src_url: str, dst_url: str, interval: float, drain_timeout: float, *, namespaces: tuple[str, ...],
           parallel: int, index_url: str | None, token: str | None, as_json: bool, **_: Any) -> None:
    """The write-back sidecar: rounds until SIGTERM or SIGINT, then a drain; exit 0."""
    settings = load_settings(index_url=index_url, token=token)
    index = open_settings_index(settings)
    options = store_options(settings)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    src = _open(src_url, options, parallel, read_only=True, create=False)
    dst = _open(dst_url, options, parallel)
    watch = open_watch(src.watchable_root)
    try:
        def register(entry: Entry, manifest: Manifest | None) -> None:
            index.register_entry(entry_record(entry, dst.url, manifest))

        writer = WriteBack(src, dst, namespaces=namespaces, interval=interval, parallel=parallel,
                           on_copied=register if index.enabled else None, wake=watch.wait if watch else None)
        # On stderr even with --json (stdout holds the report): a supervisor can wait for it.
        click.echo(f"watching {src.url} -> {dst.url} ({'inotify' if watch else 'polling'} "
                   f"every {interval:g}s); SIGTERM drains and exits", err=True)
        report = writer.run(stop, drain_timeout=drain_timeout)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        if watch is not None:
            watch.close()
        src.close()
        dst.close()
        index.close()
    render(as_json, report.to_json(), lambda: (
        f"write-back {report.src} -> {report.dst}: {len(report.published)} published in {report.rounds} rounds, "
        f"{len(report.failed)} failures, drained: {'yes' if report.drained else f'no, {report.left} left'}"))
    announce_index(index)


@click.command("pull")
@click.argument("src_url", metavar="SRC")
@click.argument("dst_url", metavar="DST")
@sync_options
@click.option("--require-signed/--no-require-signed", default=None,
              help="Copy only entries a trusted key signed (default: NEFFCACHE_REQUIRE_SIGNED; keys: "
                   "NEFFCACHE_TRUSTED_KEYS).")
def pull_cmd(src_url: str, dst_url: str, require_signed: bool | None, **options: Any) -> None:
    """Fetch the entries SRC has and DST lacks: S3 to a local or FSx cache.

    Every entry is verified against its manifest before it becomes visible in DST; a digest
    mismatch is reported and never lands. So is an entry your trust policy refuses (a bad,
    revoked or out-of-scope signature; unsigned under --require-signed) or whose flags
    contradict its namespace (a --target=trn1 NEFF in a trn2 namespace). Exits 1 when any
    entry failed.

    \b
    Example:
      neffcache pull s3://my-bucket/neuron-cache fsx:///mnt/fsx/neuron-cache \\
          --namespace trn2-lnc2/neuronxcc-2.27.5334.0+f702b353 --tag model=llama
      NEFFCACHE_TRUSTED_KEYS=ci.pub neffcache pull s3://my-bucket/neuron-cache /var/tmp/neuron-compile-cache \\
          --require-signed
    """
    _run("pull", src_url, dst_url, **options, require_signed=require_signed)


@click.command("promote")
@click.argument("src_url", metavar="SRC")
@click.argument("dst_url", metavar="DST")
@sync_options
def promote_cmd(src_url: str, dst_url: str, **options: Any) -> None:
    """Re-verify the entries of a pull-request tier and publish them into main's, signed by main.

    The branch-tier pattern: pull-request CI warms into its own tier (s3://bucket/pr/123) with
    a key your trust policy allows only there; after the merge, promote copies what DST lacks,
    each entry checked against its manifest, refused unless a trusted key signed it for SRC
    (signatures are required here) and its flags match its namespace, then signed with the
    settings' key (NEFFCACHE_SIGNING_KEY: main's). The entry's provenance keeps its original
    producer and notes where it was promoted from. Exits 1 when any entry failed or was refused.

    \b
    Example:
      NEFFCACHE_SIGNING_KEY=/secrets/main.key NEFFCACHE_CONFIG=trust.toml \\
          neffcache promote s3://bucket/pr/123 s3://bucket/main
    """
    _run("promote", src_url, dst_url, **options)


COMMANDS: list[click.Command] = [push_cmd, pull_cmd, promote_cmd]
