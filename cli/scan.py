"""``neffcache scan``: the entries of a cache by namespace and state, its largest entries."""

from __future__ import annotations

import shlex
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import click

from neffcache.application.config import load_settings
from neffcache.entry import EntryState
from neffcache.errors import ConfigError
from neffcache.operations.failed import FailedGraph, failed_graphs
from neffcache.scan.report import ScanReport, scan
from neffcache.scan.sinks import MAX_LARGEST, Largest, SizedEntry, sized
from neffcache.scan.summary import ScanSummary, summarize
from neffcache.stores import open_store
from neffcache.stores.base import Store
from neffcache.units import human_bytes, plural

from .errors import SOME_ENTRIES_FAILED
from .options import endpoint_option, store_options
from .output import emit_json, json_option, progress, shown_name, table

STATES = [s.value for s in EntryState]


def _manifest_summary(report: ScanReport) -> dict[str, dict[str, int]]:
    """What --manifests promises: entries by tag and by producer (from the manifests read)."""
    tags: Counter[str] = Counter()
    producers: Counter[str] = Counter()
    for e in report.entries:
        if e.manifest is not None:
            tags.update(f"{k}={v}" for k, v in e.manifest.tags.items())
            producers[e.manifest.producer or "(none)"] += 1
    return {"tags": dict(tags.most_common()), "producers": dict(producers.most_common())}


def _failures_json(failed: list[FailedGraph]) -> dict[str, object]:
    by_class = Counter(f.verdict.failure_class.value for f in failed)
    return {"compiler": by_class.get("compiler", 0), "environment": by_class.get("environment", 0),
            "signatures": len({f.signature for f in failed}), "entries": [f.to_json() for f in failed[:1000]]}


def _failures_text(failed: list[FailedGraph], store: str) -> list[str]:
    if not failed:
        return []
    compiler = [f for f in failed if not f.verdict.is_environment]
    where = shlex.quote(store)
    signatures = plural(len({f.signature for f in compiler}), "signature")
    out = [f"failed: {plural(len(compiler), 'compiler error')} ({signatures}; `neffcache failures --store {where}`), "
           f"{plural(len(failed) - len(compiler), 'environment failure')} (the "
           "host failed the compile, not the graph: warm compiles them again, "
           f"`neffcache prune --store {where} --failed environment` plans their removal)"]
    out += [f"  {f.verdict.failure_class:<11} {f.signature}  {f.path}: {f.message[:120]}" for f in failed[:20]]
    return out + ([f"  ... and {len(failed) - 20} more (--json lists them)"] if len(failed) > 20 else [])


def _scan_text(summary: ScanSummary, report: ScanReport | None, show_entries: bool, manifests: bool = False,
               failed: list[FailedGraph] | None = None) -> str:
    """The text of a scan: from its totals alone, or with the full report for --entries/--manifests."""
    failed = failed or []
    rows = []
    for s in summary.namespaces:
        ns = s.namespace
        tc = f"{ns.target or '?'} lnc={ns.lnc or '?'}"
        rows.append([shown_name(ns.label), ns.layout, ns.compiler_version or "?", tc, s.entries,
                     *(s.states.get(st, 0) for st in STATES), human_bytes(s.size)])
    out = [f"{summary.store}: {plural(summary.entries, 'entry')}, {human_bytes(summary.size)} "
           f"(scanned in {summary.seconds:.2f}s)"]
    if rows:
        out.append(table(rows, ["namespace", "layout", "compiler", "target", "entries", *STATES, "size"]))
    if report is not None and manifests:
        out.extend(_manifests_text(report))
    if report is not None and show_entries:
        out.append("")
        out.append(_entries_table(report, manifests))
    if summary.garbage_count:
        out.append(f"garbage: {summary.garbage_files} temp files and {summary.uncommitted_entries} "
                   f"uncommitted entries, {human_bytes(summary.garbage_size)} "
                   f"(`neffcache prune --store {shlex.quote(summary.store)} --garbage` plans their removal)")
    if summary.foreign_files:
        out.append(f"foreign, kept: {summary.foreign_files} files no runtime or neffcache wrote (other tools', "
                   f"unknown), {human_bytes(summary.foreign_size)}; neffcache never removes them")
    out.extend(_failures_text(failed, summary.store))
    out.extend(f"warning: {shown_name(w)}" for w in summary.warnings)
    if summary.warning_count > len(summary.warnings):
        out.append(f"warning: ... and {summary.warning_count - len(summary.warnings)} more (--json lists them all)")
    return "\n".join(out)


def _manifests_text(report: ScanReport) -> list[str]:
    summary = _manifest_summary(report)
    out = []
    for title, counts in (("tags", summary["tags"]), ("producers", summary["producers"])):
        shown = ", ".join(f"{k} ({n})" for k, n in list(counts.items())[:20])
        out.append(f"{title}: {shown or '(no manifests)'}" + (" ..." if len(counts) > 20 else ""))
    return out


def _entries_table(report: ScanReport, manifests: bool) -> str:
    if manifests:
        return table([[shown_name(e.path), e.state.value, human_bytes(e.size),
                       shown_name(e.manifest.producer) if e.manifest else "-",
                       shown_name(",".join(f"{k}={v}" for k, v in sorted(e.manifest.tags.items())))
                       if e.manifest else "-"]
                      for e in report.entries], ["entry", "state", "size", "producer", "tags"])
    return table([[shown_name(e.path), e.state.value, human_bytes(e.size), "yes" if e.has_manifest else "no"]
                  for e in report.entries], ["entry", "state", "size", "manifest"])


@click.command("scan")
@click.argument("store_urls", metavar="[STORE]...", nargs=-1)
@click.option("--manifests", is_flag=True,
              help="Also read every manifest: compare each file's size with it (a mismatch is CORRUPT) and show "
                   "entries by tag and producer (with --entries, each entry's). About 7x the time of a plain scan "
                   "on a local disk, a GET per entry on S3.")
@click.option("--entries", "show_entries", is_flag=True, help="List every entry, not only namespaces.")
@click.option("--largest", type=click.IntRange(1, MAX_LARGEST), metavar="N",
              help="Also show the N largest entries (path, state, size, files), at a plain scan's speed and "
                   "memory. With --json: the totals and these N, not every entry (add --entries for every entry).")
@endpoint_option
@json_option
def scan_cmd(store_urls: tuple[str, ...], manifests: bool, show_entries: bool, largest: int | None,
             as_json: bool) -> None:
    """Show the entries of a cache by namespace and state.

    STORE is a path or URL (/var/tmp/neuron-compile-cache, fsx:///mnt/fsx/cache, s3://bucket/prefix);
    without one, each configured store (NEFFCACHE_STORES, `stores` in neffcache.toml) in turn
    (--json: a list, one object per store, when there are several).
    A plain scan lists the store once (about the cost of `find`) and judges each entry by what
    the listing shows: its commit marker, its files and their names, an empty NEFF. It opens no
    file but the failure logs of FAILED entries, each judged a compiler error (with its
    signature) or an environment failure (the host failed the compile: warm compiles those
    again); --manifests also compares every file's size with the entry's manifest, and
    `neffcache verify` checks the sha256 digests. Corrupt entries are listed as warnings (and
    the exit code is then 1); temp files of interrupted writes as garbage; files of other tools
    (or unknown) as foreign: reported with their size, never removed. A plain scan keeps only
    the totals as it lists (its memory does not grow with the entries), and so does --largest;
    --entries, --manifests and --json without --largest keep every entry.

    \b
    Examples:
      neffcache scan /var/tmp/neuron-compile-cache --entries
      neffcache scan /mnt/fsx/neuron-cache --largest 10 --json
      neffcache scan s3://my-bucket/neuron-cache --manifests --endpoint-url http://minio:9000
    """
    settings = load_settings()
    urls = store_urls or settings.stores
    if not urls:
        raise ConfigError("name the store to scan: STORE (a path or URL), or configure stores (NEFFCACHE_STORES, "
                          "`stores` in neffcache.toml)")
    bad, found = False, []
    for url in urls:
        store = open_store(url, read_only=True, create=False, **store_options(settings))
        if not (show_entries or manifests) and (largest or not as_json):
            data, text, warned = _scan_summary(store, largest, as_json)
        else:
            data, text, warned = _scan_full(store, manifests, show_entries, largest, as_json)
        bad = warned or bad
        if not as_json:
            click.echo(text())
        found.append(data)
    if as_json:
        emit_json(found[0] if len(found) == 1 else found)
    if bad:  # a CORRUPT entry (a bad manifest, a bad name...): reported above, the rest listed
        sys.exit(SOME_ENTRIES_FAILED)


def _scan_full(store: Store, manifests: bool, show_entries: bool, largest: int | None, as_json: bool
               ) -> tuple[dict[str, Any], Callable[[], str], bool]:
    """A scan that keeps every entry: its JSON, its text, and whether it warned."""
    with progress("scanning", enabled=not as_json) as bar:
        report = scan(store, read_manifests=manifests, progress=lambda n: bar.update(n, detail="files"))
    warnings: list[str] = []
    failed = failed_graphs(store, report.entries, warnings=warnings)  # a small read per FAILED entry
    data = {**report.to_json(), "failures": _failures_json(failed)}
    data["warnings"] = [*report.warnings, *warnings]
    if manifests:
        data.update(_manifest_summary(report))
    if show_entries:
        data["entry_list"] = [{"path": e.path, "state": e.state.value, "size": e.size, "layout": e.layout,
                               "problems": list(e.problems), "manifest": e.has_manifest,
                               **({"producer": e.manifest.producer, "tags": dict(e.manifest.tags),
                                   "created": e.manifest.created} if e.manifest is not None else {})}
                              for e in report.entries]
    summary = ScanSummary.of_report(report, max_warnings=len(report.warnings))
    top = None
    if largest:
        sink = Largest(largest)
        sink.add_all(sized(e) for e in report.entries)
        top = sink.entries()
        data["largest"] = _largest_json(top)

    def text() -> str:
        return (_scan_text(summary, report, show_entries, manifests, failed) + _largest_text(top)
                + "".join(f"\nwarning: {shown_name(w)}" for w in warnings))

    return data, text, bool(report.warnings or warnings)


def _scan_summary(store: Store, largest: int | None, as_json: bool
                  ) -> tuple[dict[str, Any], Callable[[], str], bool]:
    """A plain scan: the totals from one streaming pass (neffcache.scan.summary), no entry
    list, and the ``largest`` largest entries when asked (a sink: neffcache/scan/sinks.py);
    its JSON, its text, and whether it warned."""
    sinks = [Largest(largest)] if largest else []
    with progress("scanning", enabled=not as_json) as bar:
        summary = summarize(store, progress=lambda n: bar.update(n, detail="files"), sinks=sinks)
    warnings: list[str] = []
    failed = failed_graphs(store, summary.failed, warnings=warnings)  # a small read per FAILED entry
    top = sinks[0].entries() if sinks else None
    data = {**summary.to_json(), "failures": _failures_json(failed)}
    data["warnings"] = [*summary.warnings, *warnings]
    if top is not None:
        data["largest"] = _largest_json(top)

    def text() -> str:
        return (_scan_text(summary, None, False, False, failed) + _largest_text(top)
                + "".join(f"\nwarning: {shown_name(w)}" for w in warnings))

    return data, text, bool(summary.warning_count or warnings)


def _largest_json(top: list[SizedEntry]) -> list[dict[str, object]]:
    return [{"path": e.path, "state": e.state.value, "size": e.size, "files": e.files, "layout": e.namespace.layout,
             "compiler_version": e.namespace.compiler_version} for e in top]


def _largest_text(top: list[SizedEntry] | None) -> str:
    if top is None:
        return ""
    if not top:
        return "\n\nlargest entries: none (no committed entry)"
    rows = [[shown_name(e.path), e.state.value, human_bytes(e.size), e.files] for e in top]
    return f"\n\nlargest {plural(len(top), 'entry')}:\n" + table(rows, ["entry", "state", "size", "files"])


COMMANDS: list[click.Command] = [scan_cmd]
