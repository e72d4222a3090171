"""``neffcache failures``: failed graphs grouped by error signature; ``failures bundle``: one
packed for the compiler team."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from neffcache.application.config import Settings, load_settings
from neffcache.errors import ConfigError, IndexServerError
from neffcache.failure_groups import (
    FailureGroup,
    SeenIn,
    group_sightings,
    merge_groups,
    resolve_signature,
    signature_prefix,
)
from neffcache.failures import FailureClass
from neffcache.operations.failed import FailedGraph, store_failures
from neffcache.operations.repro import write_bundle
from neffcache.prune import FailedSelect
from neffcache.redaction import redact_text
from neffcache.stores import open_store
from neffcache.stores.base import Store
from neffcache.units import parse_duration, plural

from .options import (
    duration,
    endpoint_option,
    index_options,
    index_window,
    open_settings_index,
    store_option,
    store_options,
)
from .output import json_option, progress, render, table

F = TypeVar("F", bound=Callable[..., Any])


def failed_options(f: F) -> F:
    """``prune``'s ``--failed [all|compiler|environment|expired]`` and ``--failed-ttl AGE``."""
    f = click.option("--failed-ttl", metavar="AGE", callback=duration,
                     help="With --failed expired: failures older than AGE (default: setting failed_ttl).")(f)
    return click.option("--failed", type=click.Choice([s.value for s in FailedSelect]), is_flag=False,
                        flag_value="all", metavar="[all|compiler|environment|expired]",
                        help="Remove failed entries: all (the default), compiler errors, environment failures "
                             "(the host failed the compile: Ctrl-C, OOM kill...), or those older than "
                             "--failed-ttl.")(f)


def failed_rule(failed: str | None, ttl: float | None) -> dict[str, Any]:
    """The :class:`~neffcache.prune.PrunePolicy` fields of ``--failed`` and the failure TTL."""
    return {"failed": failed is not None, "failed_select": FailedSelect(failed or "all"), "failed_ttl": ttl}


def _window(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, float]:
    """The window as the index takes it (it is sent there too), and in seconds."""
    return value, parse_duration(index_window(ctx, param, value))


def _store_failures(stores: list[Store], since: float | None, warnings: list[str], *,
                    quiet: bool) -> list[FailedGraph]:
    found: list[FailedGraph] = []
    with progress("reading failure logs", enabled=not quiet) as bar:
        for store in stores:
            found.extend(store_failures(store, since=since, warnings=warnings))
            bar.update(len(found), detail=f"failures, {store.url}")
    return found


def _open(urls: tuple[str, ...]) -> list[Store]:
    options = store_options()
    return [open_store(url, read_only=True, create=False, **options) for url in urls]


def _index_groups(settings: Settings, window: str, warnings: list[str]) -> tuple[list[FailureGroup], str | None]:
    """The index's groups of the window, and why there are none when it did not answer."""
    if not settings.index_url:
        return [], "no index server configured (NEFFCACHE_INDEX_URL): from the stores only"
    index = open_settings_index(settings)
    try:
        body = index.failures(window)
    except IndexServerError as exc:
        return [], redact_text(f"index {settings.index_url} did not answer ({exc}): from the stores only")
    finally:
        index.close()
    groups = []
    for item in body.get("groups", []) if isinstance(body, dict) else []:
        try:
            groups.append(FailureGroup.from_json(item))
        except (ValueError, TypeError, AttributeError) as exc:
            warnings.append(f"the index sent a group neffcache cannot read: {exc}")
    if isinstance(body, dict) and body.get("truncated"):
        warnings.append("the index grouped only the newest error events of the window (its limit)")
    return groups, None


def _ago(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return "just now"


def _bundle_hint(groups: list[FailureGroup]) -> list[str]:
    """The command that packs the first compiler error a store holds, as it runs: a bundle is
    made from a store's failed entry (an index event has no HLO), and only a compiler error goes
    to the compiler team (an environment or storage failure is no compiler bug)."""
    for group in groups:
        store = group.sample.get("store")
        if group.failure_class is FailureClass.COMPILER and SeenIn.STORE in group.sources and isinstance(store, str):
            return [f"pack one for the compiler team: neffcache failures bundle {group.signature[:8]} "
                    f"-o repro.tar.gz --store {shlex.quote(store)}"]
    return []


def _text(groups: list[FailureGroup], head: str, notes: list[str]) -> str:
    now = time.time()
    rows = [[g.signature, g.failure_class, g.graphs, g.occurrences, _ago(now - g.last_seen),
             ",".join(g.compiler_versions)[:40] or "-", ",".join(g.models)[:30] or "-", ",".join(g.teams)[:20] or "-",
             g.pattern.splitlines()[0][:70]] for g in groups]
    out = [head]
    if rows:
        out.append(table(rows, ["signature", "class", "graphs", "seen", "last", "compilers", "models", "teams",
                                "error"]))
        first = groups[0]
        where = f" in {first.sample.get('store')}" if first.sample.get("store") else ""
        out.append(f"sample of {first.signature}: {first.sample.get('path') or '-'}{where}: "
                   f"{first.sample.get('message')}")
        out.extend(_bundle_hint(groups))
    out.extend(f"note: {n}" for n in notes)
    return "\n".join(out)


@click.group("failures", invoke_without_command=True)
@store_option("A store whose failed entries to read (path, fsx://, s3://...); repeatable. Default: NEFFCACHE_STORES.")
@endpoint_option
@index_options
@click.option("--window", default="7d", show_default=True, callback=_window, metavar="AGE",
              help="Failures seen in the last AGE (failure logs written, error events sent).")
@click.option("--class", "only", type=click.Choice([c.value for c in FailureClass]),
              help="Only compiler errors, environment failures (the host failed the compile) or storage "
                   "faults (an entry's bytes went bad: `verify` found it).")
@json_option
@click.pass_context
def failures_group(ctx: click.Context, stores: tuple[str, ...], index_url: str | None, token: str | None,
                   window: tuple[str, float], only: str | None, as_json: bool) -> None:
    """Failed graphs fleet-wide, grouped by the signature of their error.

    A signature names an error whatever host hit it: paths, numbers, hex hashes and temp
    names are stripped from the compiler's text before it is hashed. Per signature: its class
    (compiler error; environment: the host failed the compile; storage: a stored entry's bytes
    went bad, as `verify` reports it), how many graphs and how
    often, first and last seen, compiler versions, models and teams, and a sample entry. Read
    from the stores' failed entries and from the index server's error events (GET
    /v1/failures); with the index down it answers from the stores and says so.

    \b
    Examples:
      neffcache failures --store fsx:///mnt/fsx/neuron-cache --window 30d
      neffcache failures bundle 3f2a9c1e -o repro.tar.gz --store fsx:///mnt/fsx/neuron-cache
    """
    if ctx.invoked_subcommand is not None:
        return
    settings = load_settings(stores=stores, index_url=index_url, token=token)
    label, seconds = window
    warnings: list[str] = []
    opened = _open(settings.stores)
    try:
        failed = _store_failures(opened, time.time() - seconds, warnings, quiet=as_json)
    finally:
        for store in opened:
            store.close()
    index_groups, index_note = _index_groups(settings, label, warnings)
    groups = merge_groups(group_sightings(f.sighting() for f in failed), index_groups)
    if only:
        groups = [g for g in groups if g.failure_class == only]
    notes = [*([index_note] if index_note else []), *warnings]
    shown_index = redact_text(settings.index_url or "") if not index_note else None
    head = (f"failures of the last {label}: {plural(len(groups), 'signature')}, "
            f"{plural(sum(g.graphs for g in groups), 'graph')} "
            f"(stores: {', '.join(settings.stores) or 'none'}; index: {shown_index or '-'})")
    data: dict[str, Any] = {"window": label, "stores": list(settings.stores),
                            "index": shown_index, "notes": notes,
                            "groups": [g.to_json() for g in groups]}
    render(as_json, data, lambda: _text(groups, head, notes))


@failures_group.command("bundle")
@click.argument("signature")
@click.option("-o", "--output", "dest", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The archive to write (.tar.gz); replaced atomically if it exists.")
@store_option("A store holding a failed entry of SIGNATURE; repeatable. Default: NEFFCACHE_STORES.")
@endpoint_option
@json_option
def bundle_cmd(signature: str, dest: Path, stores: tuple[str, ...], as_json: bool) -> None:
    """Pack one failed graph of SIGNATURE for the compiler team.

    SIGNATURE is one `neffcache failures` lists (a unique prefix of 4 digits or more does).
    The archive holds the sample's HLO, its flags as the compiler got them, the compiler
    version, target and LNC, its failure log, a README with the command line that reproduces
    the failure (neuronx-cc compile ... --target ... --lnc ... --output model.neff) and a
    repro.sh that runs it. Written atomically; every member is a plain file inside one
    directory, so extracting it writes nowhere else.

    \b
    Example:
      neffcache failures bundle 3f2a9c1e -o repro.tar.gz --store /var/tmp/neuron-compile-cache
    """
    try:
        signature = signature_prefix(signature)  # bad input fails before any store is read
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    settings = load_settings(stores=stores)
    if not settings.stores:
        raise ConfigError("name the stores holding the failed entry: --store URL (or NEFFCACHE_STORES)")
    if not dest.absolute().parent.is_dir():
        raise ConfigError(f"{dest.absolute().parent} is not a directory: cannot write {dest.name} there")
    opened = _open(settings.stores)
    try:
        failed = _store_failures(opened, None, [], quiet=as_json)
        try:
            sig = resolve_signature(signature, (f.signature for f in failed))
        except ValueError as exc:
            raise ConfigError(f"{exc} (in {', '.join(settings.stores)})") from None
        sample = max((f for f in failed if f.signature == sig), key=lambda f: f.failed_at)
        bundle = write_bundle(next(s for s in opened if s.url == sample.store), sample, dest)
    finally:
        for store in opened:
            store.close()
    render(as_json, bundle.to_json(), lambda: (
        f"wrote {bundle.path}: failure {sig} ({sample.verdict.cause}) of {sample.path} in {sample.store}\n"
        f"reproduce: tar xzf {bundle.path.name} && sh {bundle.members[0].split('/')[0]}/repro.sh"))


COMMANDS: list[click.Command] = [failures_group]
