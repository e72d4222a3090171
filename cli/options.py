"""Options several commands share, as decorators (sqlite-utils' habit)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from neffcache.errors import ConfigError
from neffcache.keys import is_canonical_relpath
from neffcache.layouts import LAYOUTS
from neffcache.layouts.flags import CHOOSABLE, forms_help, version_table_text
from neffcache.tags import check_user_tags

if TYPE_CHECKING:
    from neffcache.application.config import Settings
    from neffcache.index import Index

F = TypeVar("F", bound=Callable[..., Any])


def _parse_tags(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    tags = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {value!r}", ctx=ctx, param=param)
        tags[key.strip()] = val.strip()
    try:
        check_user_tags(tags)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    return tags


EVERY_LAYOUT = ("all", "both")  # "both" from the days of two layouts: the same as "all"


def layout_option(help_text: str) -> Callable[[F], F]:
    """``--layout all|<a layout name>``: the choices are the layouts neffcache knows."""
    return click.option("--layout", type=click.Choice([*EVERY_LAYOUT, *LAYOUTS]), default="all",
                        show_default=True, help=help_text)


def chosen_layouts(value: str) -> tuple[str, ...]:
    return tuple(LAYOUTS) if value in EVERY_LAYOUT else (value,)


def flags_form_option(what: str) -> Callable[[F], F]:
    """``--flags-form text|list|target``: force the flags-file form of the new neuronxcc
    namespaces instead of deciding it from their entries (neffcache.layouts.flags_form)."""
    return click.option(
        "--flags-form", type=click.Choice(CHOOSABLE),
        help=f"neuronxcc: the flags-file form {what} ({forms_help()}). Default: the form of the "
             f"namespace's newest entries, else the version table ({version_table_text()}).")


def bucket_options(f: F) -> F:
    """``--bucket KEY=V1,V2`` (repeatable: a product) and ``--matrix FILE``: the shape buckets a
    workload runs over (``warm``, ``plan``; neffcache.warmers.matrix builds them)."""
    f = click.option("--matrix", "matrix_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help="Buckets from a JSON/TOML file: {\"matrix\": {KEY: [...]}, \"include\": [{...}]}.")(f)
    return click.option("--bucket", "bucket_flags", multiple=True, metavar="KEY=V1,V2",
                        help="A matrix axis: KEY becomes an env variable and replaces {KEY} in CMD; repeat for "
                             "a product.")(f)


PASS_THROUGH = {"ignore_unknown_options": True, "allow_interspersed_args": False}


def _workload(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    # Unknown options are passed through so the workload keeps its own flags; but a command
    # never starts with "-": that is a mistyped neffcache option, not a workload to run.
    if value and value[0].startswith("-") and value[0] != "--":
        raise click.UsageError(f"no such option: {value[0]} (the workload goes after `--`)", ctx=ctx)
    if value and value[0] == "--":
        value = value[1:]
    if not value:
        raise click.UsageError("name the workload to run after `--`", ctx=ctx)
    return value


def workload_argument(f: F) -> F:
    """``-- COMMAND...``: the workload a command runs (``warm``, ``run``, ``plan``), its own flags
    passed through untouched (the command needs ``context_settings=PASS_THROUGH``)."""
    return click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED, callback=_workload)(f)


def size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """A click callback: ``500G``, ``1.5T``, ``64GiB`` or bytes, as bytes (None when not given)."""
    from neffcache.units import parse_size

    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """A click callback: ``30d``, ``12h``, ``90m`` or seconds, as seconds (None when not given)."""
    from neffcache.units import parse_duration

    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def index_window(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A click callback: a window the index server takes (24h, 7d, 2w, 90m, seconds), checked
    before any request, so a typo is a usage error (exit 2), not an index server error."""
    from neffcache.index.records import check_window

    try:
        return check_window(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def tag_option(f: F) -> F:
    return click.option("--tag", "tags", multiple=True, callback=_parse_tags, metavar="KEY=VALUE",
                        help="A tag recorded with entries and events (model, team, bucket...); repeatable.")(f)


def store_option(
    help_text: str = "A store URL (path, fsx://, s3://...); repeat for tiers, fastest first.",
) -> Callable[[F], F]:
    def decorate(f: F) -> F:
        return click.option("--store", "stores", multiple=True, metavar="URL", help=help_text)(f)

    return decorate


_ENDPOINT_KEY = "neffcache.endpoint_url"


def _remember_endpoint(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value:
        ctx.meta[_ENDPOINT_KEY] = value


def endpoint_option(f: F) -> F:
    """``--endpoint-url URL`` on every command that opens a store: an S3-compatible endpoint for
    s3:// stores (MinIO, Ceph RGW, LocalStack...). It is not a parameter of the command: it is
    kept on the click context and read by :func:`store_options`, the one place that turns the
    flag and the settings into store options."""
    return click.option("--endpoint-url", metavar="URL", expose_value=False, callback=_remember_endpoint,
                        help="S3-compatible endpoint for s3:// stores (NEFFCACHE_ENDPOINT_URL, endpoint_url in "
                             "neffcache.toml, else AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, else AWS).")(f)


def endpoint_url(settings: Settings | None = None) -> str | None:
    """The endpoint for s3:// stores: --endpoint-url, else the settings' ``endpoint_url``
    (``NEFFCACHE_ENDPOINT_URL``, neffcache.toml); None leaves it to the S3 store, which reads
    ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` as boto3 does."""
    ctx = click.get_current_context(silent=True)
    flag = ctx.meta.get(_ENDPOINT_KEY) if ctx is not None else None
    if flag:
        return str(flag)
    if settings is None:
        from neffcache.application.config import load_settings

        settings = load_settings()
    return settings.endpoint_url


def store_options(settings: Settings | None = None) -> dict[str, Any]:
    """Keyword options for :func:`neffcache.stores.open_store` from the flag and the settings."""
    url = endpoint_url(settings)
    return {"endpoint_url": url} if url else {}


def toolchain_options(f: F) -> F:
    f = click.option("--compiler", metavar="PATH", help="The neuronx-cc to run (default: the one on PATH).")(f)
    f = click.option("--compiler-version", metavar="VERSION",
                     help="Name the compiler version instead of running `neuronx-cc --version`.")(f)
    f = click.option("--lnc", type=click.IntRange(1, 2), help="Logical NeuronCore config (default: the instance's).")(f)
    return click.option("--instance", metavar="TYPE",
                        help="Instance type the NEFFs are for, e.g. trn2.48xlarge (NEFFCACHE_INSTANCE).")(f)


def index_options(f: F) -> F:
    """--index-url and --token; both default to the settings (NEFFCACHE_INDEX_URL, NEFFCACHE_TOKEN)."""
    f = click.option("--token", metavar="TOKEN", help="Index token with write scope (NEFFCACHE_TOKEN).")(f)
    return click.option("--index-url", metavar="URL",
                        help="Index server to register entries and send events to (NEFFCACHE_INDEX_URL); "
                             "when it is down, reports wait in the spool (see `neffcache flush`).")(f)


def open_settings_index(settings: Settings) -> Index:
    """The index the settings name (a NullIndex when none), spooling where they say. Close it,
    then call :func:`neffcache.cli.errors.announce_index` after the command's output."""
    from neffcache.index import open_index

    return watch_index(open_index(settings.index_url, settings.token,
                                  spool_root=Path(settings.spool_dir) if settings.spool_dir else None))


def watch_index(index: Index) -> Index:
    """Have ``index`` say at once, in one line, when the index refuses its token while the
    command runs (the reports are kept; the end-of-command notice counts them)."""
    index.on_problem = lambda message: click.echo(f"neffcache: {message}", err=True)
    return index


MAX_REPORT_BYTES = 64 << 20


def report_paths(path: Path) -> frozenset[str]:
    """The entry paths a ``run --report`` or ``plan --json`` file names (its ``graphs``): what
    ``prefetch --from-report`` copies and ``prune --pin-from-report`` keeps. The file is
    untrusted: a regular file of at most :data:`MAX_REPORT_BYTES`, JSON with a ``graphs`` list;
    a path that is not a canonical relative path is ignored (it names no entry of a store)."""
    from neffcache.misses.inputs import read_regular  # here: every command imports this module


    raw = read_regular(path, MAX_REPORT_BYTES, "report")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{path}: not a JSON report ({str(exc)[:200]})") from None
    graphs = data.get("graphs") if isinstance(data, dict) else None
    if not isinstance(graphs, list):
        raise ConfigError(f"{path}: no 'graphs' list (a `neffcache run --report` or `plan --json` file)")
    paths = {g["path"] for g in graphs if isinstance(g, dict) and isinstance(g.get("path"), str)
             and is_canonical_relpath(g["path"])}
    return frozenset(paths)

