"""Commands that run or administer the index server: ``serve``, ``token create|list|revoke``, ``db``.

They work on the database without a running server, through
:class:`neffcache.server.services.admin.IndexAdmin` (``token`` is how the first token of a fresh
server is made); ``stats`` and ``flush`` (cli/index.py) ask a running index over HTTP.
The server extras are imported inside the commands so the CLI works without them installed.
"""

from __future__ import annotations

import functools
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from neffcache.errors import ConfigError

from .errors import DB_SCHEMA_BEHIND
from .output import emit_json, json_option, render, table

if TYPE_CHECKING:
    from neffcache.server.config import ServerSettings
    from neffcache.server.services.admin import IndexAdmin, SchemaState

DEFAULT_PORT = 8787
F = TypeVar("F", bound=Callable[..., Any])


def _server_settings(database_url: str | None, data_dir: Path | None, **extra: Any) -> ServerSettings:
    try:
        from neffcache.server.config import ServerSettings
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ConfigError(f"the index server needs the server extras: pip install 'neffcache[server]' "
                          f"({exc})") from None
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    values: dict[str, Any] = {k: v for k, v in extra.items() if v is not None}
    if database_url:
        values["database_url"] = database_url
    if data_dir:
        values["data_dir"] = data_dir
    try:
        return ServerSettings(**values)
    except ValidationError as exc:  # a bad NEFFCACHE_SERVER_* value or option: one line naming it
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "settings"
        raise ConfigError(f"server setting {where}: {first['msg']}") from None
    except SettingsError as exc:  # a NEFFCACHE_SERVER_* variable that is not the JSON its field needs
        raise ConfigError(f"server setting: {exc} (NEFFCACHE_SERVER_PRICES is JSON, e.g. "
                          "{\"trn2.48xlarge\": 44.70})") from None


def _prices(pairs: tuple[str, ...]) -> dict[str, float] | None:
    """``--price TYPE=AMOUNT`` options as a mapping (None when none were given, so the
    NEFFCACHE_SERVER_PRICES variable still applies); amounts are checked by ServerSettings."""
    if not pairs:
        return None
    prices: dict[str, float] = {}
    for pair in pairs:
        name, sep, amount = pair.partition("=")
        name = name.strip()
        try:
            price = float(amount)
        except ValueError:
            sep = ""
        if not sep or not name:
            raise click.BadParameter(f"{pair!r}: expected INSTANCE_TYPE=PRICE_PER_HOUR, e.g. trn2.48xlarge=44.70",
                                     param_hint="--price")
        if name in prices:  # two prices for one type is a typo either way: never pick one silently
            raise click.BadParameter(f"{name} is priced twice", param_hint="--price")
        prices[name] = price
    return prices


def _database_options(f: Any) -> Any:
    f = click.option("--data-dir", type=click.Path(path_type=Path, file_okay=False),
                     help="Where the embedded SQLite database lives (NEFFCACHE_SERVER_DATA_DIR; "
                          "default ~/.local/share/neffcache/server).")(f)
    return click.option("--database-url", metavar="URL",
                        help="SQLAlchemy URL, e.g. postgresql+psycopg://user@db/neffcache "
                             "(NEFFCACHE_SERVER_DATABASE_URL; default: SQLite in --data-dir).")(f)


def same_database(database_url: str | None, data_dir: Path | None) -> str:
    """The options that point another command at the database this one used, for a hint that
    runs as printed: `` --data-dir DIR`` or `` --database-url URL`` as given (a URL with a
    password is shown with it hidden: a hint never prints a secret), "" for the default."""
    if database_url:
        from neffcache.server.services.admin import redacted_url

        return f" --database-url {shlex.quote(redacted_url(database_url))}"
    return f" --data-dir {shlex.quote(str(data_dir))}" if data_dir else ""


def _database_errors(command: F) -> F:
    """Turn a bad database URL or an unreachable database into a one-line error, not a traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _require_server_extras()
        from neffcache.server.services.admin import database_errors

        with database_errors():
            return command(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _require_server_extras() -> None:
    """A one-line error naming the extra to install when the server's dependencies are missing."""
    try:
        import alembic  # noqa: F401
        import fastapi  # noqa: F401
        import sqlalchemy  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"this command needs the server extras ({exc.name} is not installed): "
                          "pip install 'neffcache[server]'") from None


def _open_admin(settings: ServerSettings, *, upgrade: bool = True) -> IndexAdmin:
    """The index database; ``upgrade`` migrates its schema to head first."""
    from neffcache.server.services.admin import IndexAdmin

    return IndexAdmin(settings, upgrade=upgrade)


def _limit_options(f: Any) -> Any:
    """What a connection or a client may hold (docs/index-server.md#limits); each defaults to
    its NEFFCACHE_SERVER_* variable, then to ServerSettings' default."""
    f = click.option("--auth-failures-per-minute", type=click.IntRange(1), default=None, metavar="N",
                     help="Failed token checks a client address may make per minute and worker before it "
                          "gets 429 (default 30).")(f)
    f = click.option("--max-connections", type=click.IntRange(16), default=None, metavar="N",
                     help="Connections per worker (default 1024, lowered to fit `ulimit -n`); at the cap the "
                          "longest-idle one is closed to make room.")(f)
    f = click.option("--body-timeout", "body_timeout_seconds", type=click.FloatRange(0, min_open=True),
                     default=None, metavar="SECONDS", help="Time to send a request body once its headers are "
                     "in (default 60); then 408.")(f)
    return click.option("--header-timeout", "header_timeout_seconds", type=click.FloatRange(0, min_open=True),
                        default=None, metavar="SECONDS", help="Time to send a request's headers from its first "
                        "byte or from connecting (default 10); then 408.")(f)


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on (0.0.0.0 for all).")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(1, 65535))
@_database_options
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Server processes, each accepting on a socket of its own on the port (SIGHUP replaces "
                   "them in turn); with PostgreSQL, several replicas behind a load balancer also work.")
@click.option("--anonymous-read", is_flag=True, default=None,
              help="Allow reads (stats, lookups, dashboard, metrics) without a token.")
@click.option("--price", "price_pairs", multiple=True, metavar="TYPE=PER_HOUR",
              help="What an hour of an instance type costs you (repeat per type; NEFFCACHE_SERVER_PRICES as "
                   "JSON). With prices, stats and the dashboard show compile time in money too.")
@click.option("--currency", default=None, metavar="LABEL", help="Label of --price amounts (default USD).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
@click.option("--access-log", is_flag=True, default=None,
              help="Log one line per request (NEFFCACHE_SERVER_ACCESS_LOG; off by default: it costs a third "
                   "of the lookups a worker answers).")
@_limit_options
@_database_errors
def serve_cmd(host: str, port: int, database_url: str | None, data_dir: Path | None, workers: int,
              anonymous_read: bool | None, price_pairs: tuple[str, ...], currency: str | None,
              log_level: str, access_log: bool | None, **limits: Any) -> None:
    """Run the index server: catalog, events, leases, dashboard at /, metrics at /metrics.

    With no arguments it keeps an embedded SQLite database under ~/.local/share/neffcache/server;
    for several replicas point them all at one PostgreSQL with --database-url. The schema is
    upgraded before the server starts. ServerSettings also come from NEFFCACHE_SERVER_* variables
    (NEFFCACHE_SERVER_ADMIN_TOKEN, NEFFCACHE_SERVER_MAX_BODY_BYTES, ...).

    \b
    Example:
      neffcache serve
      neffcache serve --host 0.0.0.0 --port 8787 \\
          --database-url postgresql+psycopg://neffcache@db:5432/neffcache --workers 4
      neffcache serve --price trn2.48xlarge=44.70 --price trn1.32xlarge=21.50 --currency USD
    """
    from neffcache.server.app import listening_sockets, serve
    from neffcache.server.services.admin import redacted_url

    settings = _server_settings(database_url, data_dir, anonymous_read=anonymous_read,
                                prices=_prices(price_pairs), currency=currency, access_log=access_log, **limits)
    with _open_admin(settings) as admin:
        has_tokens = admin.has_tokens()
    shown_url = redacted_url(settings.resolved_database_url())
    try:
        # Bound before "serving on" is printed, with or without --workers: a port in use is one
        # line and one exit code, not a log line from uvicorn after we claimed to serve.
        sockets = listening_sockets(host, port, workers)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc} "
                          "(another server there? choose another --port)") from None
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host  # noqa: S104 - comparing, not binding
    click.echo(f"neffcache index serving on http://{shown}:{port}/  (API docs: /docs, metrics: /metrics)")
    click.echo(f"database: {shown_url}")
    if not has_tokens and settings.admin_token is None:
        click.echo(f"no tokens yet: create one with `neffcache token create ci --scope write"
                   f"{same_database(database_url, data_dir)}`")
    serve(settings, sockets, host=host, port=port, log_level=log_level)


@click.group("token")
def token_group() -> None:
    """Manage the index server's API tokens (directly in its database).

    \b
    Example:
      neffcache token create ci-warmers --scope write
      neffcache token list
      neffcache token revoke ci-warmers
    """


@token_group.command("create")
@click.argument("name")
@click.option("--scope", type=click.Choice(["read", "write", "admin"]), default="read", show_default=True,
              help="read: stats, lookups, dashboard; write: also register entries, send events, leases; "
                   "admin: also manage tokens.")
@click.option("--team", default="", metavar="TEAM",
              help="The team the token reports for: its events count for TEAM only, and no other token "
                   "without a team may report for TEAM.")
@click.option("--prefix", "prefixes", multiple=True, metavar="PREFIX",
              help="Write only entries under PREFIX (an entry path, e.g. pr-123/) or stores under it "
                   "(a URL, e.g. s3://bucket/pr/123/); repeatable. Default: anywhere.")
@_database_options
@json_option
@_database_errors
def token_create(name: str, scope: str, team: str, prefixes: tuple[str, ...], database_url: str | None,
                 data_dir: Path | None, as_json: bool) -> None:
    """Create a token and print it once (only its hash is stored).

    \b
    Examples:
      export NEFFCACHE_TOKEN=$(neffcache token create ci-warmers --scope write --team search)
      neffcache token create pr-123 --scope write --prefix s3://bucket/pr/123/
    """
    with _open_admin(_server_settings(database_url, data_dir)) as admin:
        info, secret = admin.create_token(name, scope, team=team, prefixes=prefixes)
    if as_json:
        emit_json({**info.to_json(), "token": secret})
        return
    click.echo(secret)
    click.echo(f"created token {info.name!r} ({info.id}) with scope {info.scope}; it is shown only now", err=True)


@token_group.command("list")
@_database_options
@json_option
@_database_errors
def token_list(database_url: str | None, data_dir: Path | None, as_json: bool) -> None:
    """List tokens (never their secrets), revoked ones included.

    \b
    Example:
      neffcache token list --database-url postgresql+psycopg://neffcache@db/neffcache
    """
    with _open_admin(_server_settings(database_url, data_dir)) as admin:
        found = admin.list_tokens()
    if as_json:
        emit_json([t.to_json() for t in found])
        return
    if not found:
        click.echo(f"no tokens; create one with `neffcache token create ci --scope write"
                   f"{same_database(database_url, data_dir)}`")
        return
    rows = [[t.name, t.id, t.scope, t.team or "-", " ".join(t.prefixes) or "*", _when(t.created),
             _when(t.last_used), "revoked " + _when(t.revoked) if t.revoked else "active"] for t in found]
    click.echo(table(rows, ["name", "id", "scope", "team", "prefixes", "created", "last used", "status"]))


@token_group.command("revoke")
@click.argument("token")
@_database_options
@_database_errors
def token_revoke(token: str, database_url: str | None, data_dir: Path | None) -> None:
    """Revoke a token by name or id. Servers stop accepting it within seconds.

    \b
    Example:
      neffcache token revoke ci-warmers
    """
    with _open_admin(_server_settings(database_url, data_dir)) as admin:
        info = admin.revoke_token(token)
    if info is None:
        raise ConfigError(f"no token named or with id {token!r} (see `neffcache token list"
                          f"{same_database(database_url, data_dir)}`)")
    click.echo(f"revoked token {info.name!r} ({info.id})")


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts)) if ts else "-"


@click.group("db")
def db_group() -> None:
    """The index server's database schema: see where it stands, upgrade it ahead of a rollout.

    `neffcache serve` upgrades the schema itself before it listens (replicas take turns); use
    these with NEFFCACHE_SERVER_AUTO_MIGRATE=0, or to migrate in a maintenance window.

    \b
    Example:
      neffcache db status --database-url postgresql+psycopg://neffcache@db/neffcache --check
      neffcache db upgrade --database-url postgresql+psycopg://neffcache@db/neffcache
    """


def _schema_text(state: SchemaState, database: str = "") -> str:
    """``database``: :func:`same_database` of the command, so the upgrade hint runs as printed."""
    current = state.current or "(empty: no schema yet)"
    verdict = "up to date" if state.up_to_date else f"behind: run `neffcache db upgrade{database}`"
    return f"database {state.database}: schema at {current}, this neffcache needs {state.head} ({verdict})"


@db_group.command("status")
@_database_options
@click.option("--check", is_flag=True, help="Exit 8 when the schema is not at this neffcache's head.")
@json_option
@_database_errors
def db_status_cmd(database_url: str | None, data_dir: Path | None, check: bool, as_json: bool) -> None:
    """Show the schema revision of the database and the one this neffcache needs (changes nothing).

    \b
    Example:
      neffcache db status --json
    """
    with _open_admin(_server_settings(database_url, data_dir), upgrade=False) as admin:
        state = admin.schema()
    render(as_json, state.to_json(), lambda: _schema_text(state, same_database(database_url, data_dir)))
    if check and not state.up_to_date:
        sys.exit(DB_SCHEMA_BEHIND)


@db_group.command("upgrade")
@_database_options
@json_option
@_database_errors
def db_upgrade_cmd(database_url: str | None, data_dir: Path | None, as_json: bool) -> None:
    """Upgrade the schema to this neffcache's head (an empty database gets the whole schema).

    Safe while replicas run or start: upgrades take turns on a PostgreSQL advisory lock.
    Snapshot the database first; downgrades are not supported.

    \b
    Example:
      neffcache db upgrade --database-url postgresql+psycopg://neffcache@db/neffcache
    """
    with _open_admin(_server_settings(database_url, data_dir), upgrade=False) as admin:
        before = admin.upgrade()
        state = admin.schema()
    render(as_json, {**state.to_json(), "before": before},
           lambda: (f"upgraded from {before or '(empty)'}: " if before != state.current
                    else "nothing to do: ") + _schema_text(state))


COMMANDS: list[click.Command] = [serve_cmd, token_group, db_group]
