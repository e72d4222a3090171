"""``neffcache why-miss``: why a graph missed, against every entry the stores and the index hold."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import click

from neffcache.application.config import Settings, load_settings
from neffcache.errors import ConfigError, NeffcacheError
from neffcache.instances import lookup_instance
from neffcache.misses.causes import Explanation
from neffcache.misses.explain import Comparison, Match
from neffcache.misses.inputs import Known, known_flags, missed_from_argument, missed_from_report
from neffcache.misses.nearest import StoreCatalog, why_miss
from neffcache.stores import open_store
from neffcache.toolchain import compiler_version, validate_version

from .errors import announce_index
from .options import endpoint_option, open_settings_index, store_options, tag_option
from .output import json_option, progress, render

_WIDTH = 72


def _version(settings: Settings) -> str | None:
    """The job's compiler version: named, else the installed compiler's when there is one."""
    if settings.compiler_version:
        return validate_version(settings.compiler_version)
    with contextlib.suppress(NeffcacheError, OSError):
        return compiler_version(settings.compiler)
    return None


def _known(settings: Settings, lnc: int | None, flags: tuple[str, ...], tags: dict[str, str]) -> Known:
    row = lookup_instance(settings.instance) if settings.instance else None
    version = _version(settings) if row is not None or settings.compiler_version else None
    return Known(compiler_version=version, target=row.target if row else None,
                 lnc=lnc or (row.default_lnc if row else None), flags=known_flags(flags),
                 tags={**settings.tags, **tags})


def _cut(text: str | None) -> str:
    text = "?" if text is None else text or "(none)"
    return text if len(text) <= _WIDTH else text[:_WIDTH - 3] + "..."


def _comparison_lines(number: int, comparison: Comparison) -> list[str]:
    cand = comparison.candidate
    where = ", ".join(cand.stores) or cand.source.value
    out = [f"  {number}. {cand.path} [{cand.state}] in {where} ({cand.why}; {cand.source.value})",
           f"     cause: {comparison.cause}"]
    for d in comparison.differences:
        shown = (f"{_cut(d.found)} → {_cut(d.wanted)}" if d.match is Match.DIFFERENT
                 else _cut(d.found if d.found is not None else d.wanted))
        note = f"  ({d.note})" if d.note else ""
        out.append(f"     {d.field.value:<9} {d.match.value:<9} {shown}{note}")
    diff = comparison.flags
    if diff is not None and not diff.same:
        out += [f"       + {f.spelling}" for f in diff.added] + [f"       - {f.spelling}" for f in diff.removed]
        out += [f"       ~ {c.found} → {c.wanted}" for c in diff.changed]
        if diff.reordered:
            out.append("       ~ the same flags in another order")
    return out


def explanation_text(found: Explanation, limit: int) -> str:
    missed = found.missed
    out = [f"{missed.origin or missed.path}" + (f" (looked for at {missed.path})" if missed.path
                                                 and missed.path != missed.origin else "")
           + (f" [{missed.status}]" if missed.status else "")]
    if missed.form_explanation:
        out.append(f"  keys compared under: {missed.form_explanation}")
    if found.held:
        out.append(f"  held now in: {', '.join(found.held)}")
    out += [f"  likely cause: {found.cause}", f"  would have hit: {found.fix}", f"  index: {found.index}"]
    shown = found.comparisons[:limit]
    if shown:
        out.append(f"  nearest entries ({len(shown)} of {len(found.comparisons)}, closest first):")
    for number, comparison in enumerate(shown, 1):
        out += _comparison_lines(number, comparison)
    return "\n".join(out)


def _text(results: list[Explanation], problems: list[str], limit: int) -> str:
    if not results:
        return "no missed graphs to explain"
    out = [explanation_text(r, limit) for r in results]
    if len(results) > 1:
        out.append(f"{len(results)} missed graphs explained; `--json` gives every field of every entry compared")
    out += [f"warning: {p}" for p in problems]
    return "\n\n".join(out)


@click.command("why-miss")
@click.argument("what", metavar="[KEY|ENTRY|HLO-FILE]", required=False)
@click.option("--from-report", "report", type=click.Path(dir_okay=False, path_type=Path),
              help="Explain every missed graph of a `neffcache plan --json` output or a `neffcache run --report` file.")
@click.option("--store", "stores", multiple=True, metavar="URL",
              help="A store to look in (path, fsx://, s3://...); repeatable. Default: the configured stores.")
@endpoint_option
@click.option("--index-url", metavar="URL", help="Index server to ask, fleet-wide (NEFFCACHE_INDEX_URL).")
@click.option("--token", metavar="TOKEN", help="Index token, read scope is enough (NEFFCACHE_TOKEN).")
@click.option("--instance", metavar="TYPE", help="The job's instance type: its target and LNC (NEFFCACHE_INSTANCE).")
@click.option("--lnc", type=click.IntRange(1, 2), help="The job's LNC (default: the instance's).")
@click.option("--compiler-version", metavar="VERSION",
              help="The job's compiler version (default: the installed neuronx-cc's, if any).")
@click.option("--flags", "flags", multiple=True, metavar="FLAGS",
              help="The job's compiler flags (as in NEURON_CC_FLAGS), for an HLO file or a key.")
@tag_option
@click.option("--limit", type=click.IntRange(1, 1000), default=5, show_default=True,
              help="Nearest entries shown per graph (--json shows all).")
@json_option
def why_miss_cmd(what: str | None, report: Path | None, stores: tuple[str, ...], index_url: str | None,
                 token: str | None, instance: str | None, lnc: int | None, compiler_version: str | None,
                 flags: tuple[str, ...], tags: dict[str, str], limit: int, as_json: bool) -> None:
    """Explain a cache miss: the nearest entries and what differs, field by field.

    WHAT is a runtime key (MODULE_<graph>+<flags>, a 32-hex native key, a 64-hex neffcache
    key), an entry path in a store (trn2-lnc2/neuronxcc-<version>/<key>) or an HLO file (its
    flags from --flags or the flags file beside it); --from-report explains every miss of a
    `neffcache plan --json` output or a `neffcache run --report` file. It looks in the stores
    (same HLO digest, same graph hash, same key, same model tag) and asks the index for the
    same fleet-wide, then names the likely cause (a compiler bump, a flag added or changed, a
    path in the flags, another target or LNC, another flags-file form) and what would have hit.
    Keys are compared under the flags form of the namespace the job looked in (neuronxcc):
    the form its own newest entries were named by, else the version table; the output says
    which rule decided.
    Read-only. Without an index it answers from the stores and says so.

    \b
    Examples:
      neffcache why-miss trn2-lnc2/neuronxcc-2.22.1.0+abc/MODULE_1234+e30acd3a --store /mnt/fsx/neuron-cache
      neffcache why-miss MODULE_1234+e30acd3a --instance trn2.48xlarge --compiler-version 2.22.1.0+abc
      neffcache why-miss /tmp/work/model.hlo_module.pb --flags "--model-type=transformer" --instance trn1.32xlarge
      neffcache why-miss --from-report run-report.json --store s3://ml-cache/neuron --json
    """
    if (what is None) == (report is None):
        raise click.UsageError("name one graph (KEY, ENTRY or HLO-FILE) or --from-report FILE")
    settings = load_settings(stores=stores, instance=instance, compiler_version=compiler_version,
                             index_url=index_url, token=token)
    if not settings.stores and not settings.index_url:
        raise ConfigError("name a store to look in (--store URL, NEFFCACHE_STORES) or an index (--index-url)")
    missed = (missed_from_report(report) if report is not None
              else [missed_from_argument(str(what), _known(settings, lnc, flags, tags))])
    catalogs = []
    for url in settings.stores:
        store = open_store(url, read_only=True, create=False, **store_options(settings))
        with progress(f"listing {url}", enabled=not as_json) as bar:
            catalogs.append(StoreCatalog.build(store, progress=lambda n: bar.update(n, detail="files")))
    index = open_settings_index(settings)
    try:
        with progress("explaining", len(missed), enabled=not as_json and len(missed) > 1) as bar:
            results = why_miss(missed, catalogs, index, progress=bar.update, instance=settings.instance)
    finally:
        index.close()
    problems = [p for c in catalogs for p in c.problems]
    data: dict[str, Any] = {"graphs": [r.to_json() for r in results], "stores": [c.store.url for c in catalogs],
                            "problems": problems}
    render(as_json, data, lambda: _text(results, problems, limit))
    announce_index(index)


COMMANDS: list[click.Command] = [why_miss_cmd]
