"""One table from library errors to a one-line message and an exit code.

A traceback is printed only with ``NEFFCACHE_DEBUG=1`` (huggingface_hub's cli/_errors.py habit).
"""

from __future__ import annotations

import os
import sys
import traceback

import click

from neffcache import errors as e

# (error class, exit code, prefix); the first matching row wins, so subclasses come first.
ERROR_TABLE: list[tuple[type[BaseException], int, str]] = [
    (e.UnknownInstanceType, 2, "unknown instance type"),
    (e.InvalidURL, 2, "bad store URL"),
    (e.ConfigError, 2, "configuration error"),
    (e.InvalidKey, 2, "invalid key"),
    (e.CompilerNotFound, 3, "compiler not found"),
    (e.ToolchainError, 3, "compiler error"),
    (e.AccessDenied, 4, "access denied"),
    (e.StoreUnavailable, 4, "store unavailable"),
    (e.ReadOnlyStore, 4, "read-only store"),
    (e.EntryNotFound, 4, "not found"),
    (e.NoSpace, 8, "no space"),
    (e.StoreError, 4, "store error"),
    (e.CorruptEntry, 5, "corrupt entry"),
    (e.SourceChanged, 5, "source changed"),
    (e.LeaseHeld, 6, "busy"),
    (e.IndexServerError, 7, "index server error"),
    (e.NeffcacheError, 1, "error"),
    (OSError, 4, "I/O error"),
]


def debug_enabled() -> bool:
    return os.environ.get("NEFFCACHE_DEBUG", "") not in ("", "0", "false")


def report(exc: BaseException) -> int:
    """Print ``exc`` as one line on stderr and return the exit code."""
    for cls, code, prefix in ERROR_TABLE:
        if isinstance(exc, cls):
            if debug_enabled():
                traceback.print_exception(exc)
            message = str(exc) or type(exc).__name__
            line = message if message.startswith(prefix) else f"{prefix}: {message}"
            click.echo(f"neffcache: {line}", err=True)
            if code == 1 and not debug_enabled():
                click.echo("(set NEFFCACHE_DEBUG=1 for a traceback)", err=True)
            return code
    raise exc


def run_guarded(main: click.Group, args: list[str] | None = None) -> None:
    try:
        main.main(args=args, prog_name="neffcache", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("neffcache: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("neffcache: interrupted; the cache is consistent (rerun to finish)", err=True)
        sys.exit(130)
    except (e.NeffcacheError, OSError) as exc:
        sys.exit(report(exc))
