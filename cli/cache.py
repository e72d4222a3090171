"""Commands on one cache root: scan, verify, env, config."""

from __future__ import annotations

import dataclasses
import shlex
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import click

from neffcache.application.config import job_toolchain, load_settings
from neffcache.application.jobenv import job_env, render_env
from neffcache.application.trusted import trust_policy
from neffcache.entry import EntryState
from neffcache.errors import ConfigError
from neffcache.operations.failed import FailedGraph, failed_graphs
from neffcache.operations.scan import ScanReport, scan
from neffcache.operations.summary import ScanSummary, summarize
from neffcache.operations.verify import CheckStatus, VerifyReport, verify
from neffcache.stores import open_store
from neffcache.stores.base import Store
from neffcache.units import human_bytes, plural

from .errors import CORRUPT, SOME_ENTRIES_FAILED, UNTRUSTED, announce_index
from .options import (
    chosen_layouts,
    endpoint_option,
    index_options,
    layout_option,
    open_settings_index,
    store_options,
    toolchain_options,
)
from .output import emit_json, json_option, progress, render, shown_name, table, toml_lines

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
@endpoint_option
@json_option
def scan_cmd(store_urls: tuple[str, ...], manifests: bool, show_entries: bool, as_json: bool) -> None:
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
    the totals as it lists (its memory does not grow with the entries); --entries, --manifests
    and --json keep every entry.

    \b
    Examples:
      neffcache scan /var/tmp/neuron-compile-cache --entries
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
        if not (as_json or show_entries or manifests):
            bad = _scan_summary(store) or bad
            continue
        data, text, warned = _scan_full(store, manifests, show_entries, as_json)
        bad = warned or bad
        if not as_json:
            click.echo(text())
        found.append(data)
    if as_json:
        emit_json(found[0] if len(found) == 1 else found)
    if bad:  # a CORRUPT entry (a bad manifest, a bad name...): reported above, the rest listed
        sys.exit(SOME_ENTRIES_FAILED)


def _scan_full(store: Store, manifests: bool, show_entries: bool, as_json: bool
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

    def text() -> str:
        return (_scan_text(summary, report, show_entries, manifests, failed)
                + "".join(f"\nwarning: {shown_name(w)}" for w in warnings))

    return data, text, bool(report.warnings or warnings)


def _scan_summary(store: Store) -> bool:
    """A plain scan: the totals from one streaming pass (neffcache.operations.summary), no entry
    list; True when it warned."""
    with progress("scanning", enabled=True) as bar:
        summary = summarize(store, progress=lambda n: bar.update(n, detail="files"))
    warnings: list[str] = []
    failed = failed_graphs(store, summary.failed, warnings=warnings)  # a small read per FAILED entry
    click.echo(_scan_text(summary, None, False, False, failed)
               + "".join(f"\nwarning: {shown_name(w)}" for w in warnings))
    return bool(summary.warning_count or warnings)


def _verify_text(report: VerifyReport) -> str:
    out = [f"{report.store}: {report.count(CheckStatus.OK)} ok, {report.count(CheckStatus.CORRUPT)} corrupt, "
           f"{report.count(CheckStatus.UNVERIFIED)} without manifest (written by a runtime; "
           f"`neffcache pull` computes one) in {report.seconds:.1f}s"]
    for c in report.corrupt:
        where = f" -> quarantined to {c.quarantined_to}" if c.quarantined_to else ""
        where += f" ({c.error})" if c.error else ""
        out.append(f"CORRUPT {c.path}: {'; '.join(c.problems)}{where}")
    verdicts = report.verdicts()
    if verdicts:
        out.append("signatures: " + ", ".join(f"{n} {v}" for v, n in verdicts.items())
                   + ("" if "unsigned" not in verdicts else " (--require-signed refuses unsigned entries)"))
    for c in report.checks:
        if c.status is CheckStatus.FAILED:
            out.append(f"FAILED {c.path}: {'; '.join(c.problems)}")
        elif c.status is CheckStatus.REFUSED:
            out.append(f"REFUSED {c.path}: {'; '.join(c.problems)}")
        elif c.status is CheckStatus.MISMATCH:
            out.append(f"MISMATCH {c.path}: {'; '.join(c.problems)}")
        elif c.status is CheckStatus.UNVERIFIED and c.problems:
            out.append(f"WARNING {c.path} (written by a runtime, kept): {'; '.join(c.problems)}")
    out.extend(f"NOT CHECKED {problem}" for problem in report.listing_problems)
    if report.listing_problems:
        out.append(f"{len(report.listing_problems)} part(s) of the store could not be listed: what they hold "
                   "was not verified")
    return "\n".join(out)


@click.command("verify")
@click.argument("store_url", metavar="STORE")
@click.option("--fix", is_flag=True, help="Quarantine corrupt entries (moved under .neffcache/quarantine/).")
@click.option("--require-signed/--no-require-signed", default=None,
              help="Refuse entries no trusted key signed (default: NEFFCACHE_REQUIRE_SIGNED; keys: "
                   "NEFFCACHE_TRUSTED_KEYS).")
@index_options
@endpoint_option
@json_option
def verify_cmd(store_url: str, fix: bool, require_signed: bool | None, index_url: str | None, token: str | None,
               as_json: bool) -> None:
    """Check every entry's files against the sha256 digests in its manifest, who signed it, and
    whether its own inputs match its namespace.

    Exits 5 when corrupt entries remain (quarantined ones with --fix do not count), 15 when
    entries whose files match are refused by the trust policy (a bad, revoked or out-of-scope
    signature; unsigned under --require-signed) or contradict their namespace (a --target=trn1
    entry in a trn2 namespace, a manifest the index says was lost), else 1 when some entries
    could not be checked (unreadable, badly named: listed as FAILED) or part of the store could
    not be listed (a symlinked or unreadable directory: NOT CHECKED). Refused entries are
    reported, never quarantined. With an
    index server configured, each corrupt entry is reported there as an error, and each
    quarantined one as evicted from STORE.

    \b
    Example:
      neffcache verify fsx:///mnt/fsx/neuron-cache --fix
      NEFFCACHE_TRUSTED_KEYS=ci.pub neffcache verify s3://bucket/cache --require-signed
    """
    settings = load_settings(index_url=index_url, token=token)
    policy = trust_policy(settings, require_signed=require_signed)
    index = open_settings_index(settings)
    try:
        store = open_store(store_url, create=False, read_only=not fix, **store_options(settings))
        try:
            with progress("verifying", enabled=not as_json) as bar:
                report = verify(store, fix=fix, progress=bar.update, index=index, policy=policy)
        finally:
            store.close()
    finally:
        index.close()
    data = report.to_json()
    if index.enabled:
        data["index"] = index.counts().to_json()
    render(as_json, data, lambda: _verify_text(report))
    announce_index(index, [store_url])
    if any(c.quarantined_to is None for c in report.corrupt):
        sys.exit(CORRUPT)
    if report.untrusted:
        sys.exit(UNTRUSTED)
    if report.failed or report.listing_problems:
        sys.exit(SOME_ENTRIES_FAILED)


@click.command("env")
@toolchain_options
@click.option("--store", "store_url", metavar="URL", help="The shared cache (default: NEFFCACHE_STORES' first).")
@layout_option("Which runtime's variables to print.")
@click.option("--local", "local_root", metavar="DIR",
              help="Node-local directory for runtimes that keep a local tier beside the shared cache (vLLM-Neuron's "
                   "VLLM_CACHE_ROOT); never inside the store (default: NEFFCACHE_LOCAL_ROOT, else "
                   "/var/tmp/neffcache-local).")
@click.option("--shell", type=click.Choice(["bash", "fish", "json"]), default="bash", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="The same as --shell json: toolchain, env and notes as JSON.")
def env_cmd(instance: str | None, lnc: int | None, compiler_version: str | None, compiler: str | None,
            store_url: str | None, layout: str, local_root: str | None, shell: str, as_json: bool) -> None:
    """Print the exports a training or serving job needs to use the shared cache.

    The cache directories are versioned by toolchain (compiler version, target, LNC), so
    trn1 and trn2 jobs, or two compiler versions, never share NEFFs by accident. vLLM-Neuron
    gets the store as its shared tier (NEURON_LIBTORCH_REMOTE_CACHE) and a directory on local
    disk as its local tier (VLLM_CACHE_ROOT).

    \b
    Example:
      eval "$(neffcache env --instance trn2.48xlarge --store /mnt/fsx/neuron-cache)"
      eval "$(neffcache env --instance trn2.48xlarge --store /mnt/fsx/neuron-cache --layout vllm --local /nvme/vllm)"
    """
    settings = load_settings(instance=instance, compiler=compiler, compiler_version=compiler_version,
                             stores=(store_url,) if store_url else (), local_root=local_root)
    toolchain = job_toolchain(settings, lnc)
    env, notes = job_env(settings.local_store, toolchain, chosen_layouts(layout), local_root=settings.local_root)
    if shell == "json" or as_json:
        render(True, {"toolchain": toolchain.to_json(), "env": env, "notes": notes}, str)
        return
    click.echo(f"# neffcache: {toolchain.label} ({settings.instance})")
    for note in notes:
        click.echo(f"# note: {note}")
    click.echo(render_env(env, shell))


@click.command("config")
@json_option
def config_cmd(as_json: bool) -> None:
    """Show the settings in effect, as neffcache.toml takes them, and where they came from.

    Precedence: flags > NEFFCACHE_* variables > $NEFFCACHE_CONFIG or ./neffcache.toml >
    ~/.config/neffcache/neffcache.toml > defaults. Unset settings and the token are comments.

    \b
    Example:
      NEFFCACHE_STORES=/nvme/cache,s3://bucket/cache neffcache config --json
    """
    settings = load_settings()
    data = dataclasses.asdict(settings)
    data["token"] = "***" if settings.token else None
    shown = {k: v for k, v in dataclasses.asdict(settings).items() if k != "sources"}
    came_from = ", ".join(settings.sources) or "no file or variable"
    render(as_json, data, lambda: "\n".join([f"# in effect: defaults, then {came_from}; as neffcache.toml takes it",
                                             *toml_lines(shown, hidden=frozenset({"token"}))]))


COMMANDS: list[click.Command] = [scan_cmd, verify_cmd, env_cmd, config_cmd]
