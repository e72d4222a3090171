"""One table from library errors to a one-line message and an exit code.

A traceback is printed only with ``NEFFCACHE_DEBUG=1`` (huggingface_hub's cli/_errors.py habit).
"""

from __future__ import annotations

import os
import shlex
import sys
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from neffcache import errors as e
from neffcache.index.reports import ReportCounts
from neffcache.redaction import redact_text

if TYPE_CHECKING:
    from neffcache.index import Index

# Every exit code the CLI uses, in one place (the names below; commands use only these):
#   0 OK                                   7 INDEX_FAILED: the index server failed
#   1 SOME_ENTRIES_FAILED (below)          8 DB_SCHEMA_BEHIND (`db status --check`)
#   2 USAGE: usage or configuration        9 REFUSED: a destructive plan refused by the guard rails
#   3 COMPILER: the compiler               10 DOCTOR_WARNINGS: the worst finding is a warning
#   4 STORE: a store (unreachable, denied, unsafe path, I/O)   11 DOCTOR_PROBLEMS: something is a problem
#   5 CORRUPT: a corrupt entry, or a source that changed mid-copy   12 NO_SPACE at the destination
#   6 BUSY: a lease another process holds  13 NOT_WARM (`plan --require-warm`): some graph would compile
#                                          14 UPGRADE_NOT_READY: `upgrade-report --gate` not met
#                                          15 UNTRUSTED (`verify`): entries refused by the trust policy
#                                          130 INTERRUPTED (Ctrl-C)
#   128 + N: stopped by signal N (`warm`, `rewarm`: SIGTERM gives 143), see :func:`killed_by`
#   `run` exits with its workload's own exit code.
OK = 0
USAGE = 2
COMPILER = 3
STORE = 4
CORRUPT = 5
BUSY = 6
INDEX_FAILED = 7
DB_SCHEMA_BEHIND = 8
DOCTOR_WARNINGS = 10
DOCTOR_PROBLEMS = 11
NO_SPACE = 12
# `plan --require-warm`: the job would compile at least one graph (a store lacks it): a CI gate
# holds the training job on it. Its own code so a pipeline tells "not warm yet" from a failure.
NOT_WARM = 13
# `upgrade-report --gate F`: readiness below F, or a graph that compiled under the old compiler
# fails under the new one. The report itself was complete; the upgrade is not ready.
UPGRADE_NOT_READY = 14
INTERRUPTED = 130
_SIGNAL_BASE = 128


def killed_by(signum: int) -> int:
    """The shell's exit code of a process stopped by signal ``signum``."""
    return _SIGNAL_BASE + signum


# Exit codes of commands that work through many entries and finish what they can: one bad
# entry (a bad name, an unreadable or undeletable file, a crafted manifest, a broken lease) is
# reported against that entry and the rest are done, then the command exits with this code.
# It is the code push, pull and warm always used for "some entries failed"; verify keeps its
# own CORRUPT for corrupt entries left in place (the more specific news), and 1 otherwise.
SOME_ENTRIES_FAILED = 1

# A destructive plan the guard rails stopped (it would empty a store or its newest toolchain, or
# remove more than --max-share of its bytes): nothing was changed; --force with --yes runs it.
REFUSED = 9
# verify: entries whose bytes match but that no reader should load (refused by the trust
# policy, contradicting their namespace's target or compiler, or whose manifest was lost). Its
# own code: a CI gate on `verify --require-signed` tells it from corruption and from I/O faults.
UNTRUSTED = 15

# (error class, exit code, prefix); the first matching row wins, so subclasses come first.
ERROR_TABLE: list[tuple[type[BaseException], int, str]] = [
    (e.UnknownInstanceType, USAGE, "unknown instance type"),
    (e.InvalidURL, USAGE, "bad store URL"),
    (e.ConfigError, USAGE, "configuration error"),
    (e.InvalidKey, USAGE, "invalid key"),
    (e.CompilerNotFound, COMPILER, "compiler not found"),
    (e.ToolchainError, COMPILER, "compiler error"),
    (e.UnsafePath, STORE, "unsafe path"),
    (e.AccessDenied, STORE, "access denied"),
    (e.StoreUnavailable, STORE, "store unavailable"),
    (e.ReadOnlyStore, STORE, "read-only store"),
    (e.EntryNotFound, STORE, "not found"),
    (e.NoSpace, NO_SPACE, "no space"),
    (e.StoreError, STORE, "store error"),
    (e.PlaceholderNeff, CORRUPT, "placeholder refused"),
    (e.CorruptEntry, CORRUPT, "corrupt entry"),
    (e.SourceChanged, CORRUPT, "source changed"),
    (e.LeaseHeld, BUSY, "busy"),
    (e.RefusedPlan, REFUSED, "refused"),
    (e.IndexServerError, INDEX_FAILED, "index server error"),
    (e.NeffcacheError, SOME_ENTRIES_FAILED, "error"),
    (OSError, STORE, "I/O error"),
]


def index_warning(counts: ReportCounts, stores: Sequence[str] = (), url: str | None = None) -> str | None:
    """The one line a command prints at its end when index reports were lost (a full or
    unwritable spool and an unreachable index): a warning, not an exit code — see
    :class:`neffcache.index.client.ReportCounts` for why. It ends with the reconcile that
    restores the index from ``stores`` (the stores the command wrote), runnable as printed:
    ``url``, when given, is an index the settings do not name, put before the command."""
    if not counts.lost and not counts.spool_error:
        return None
    line = f"neffcache: warning: {counts.lost} of {counts.reported} index reports lost"
    if counts.spool_error:
        line += f" ({counts.spool_error})"
    if not stores:
        return line + "; `neffcache reconcile --store URL --yes` for each store it wrote restores the index"
    env = f"NEFFCACHE_INDEX_URL={shlex.quote(url)} " if url else ""
    where = " ".join(f"--store {shlex.quote(store)}" for store in stores)
    return line + f"; once the index answers, `{env}neffcache reconcile {where} --yes` restores it from the stores"


def spool_notice(counts: ReportCounts, url: str | None, flush_url: bool = False) -> str | None:
    """The one line a command prints at its end when reports wait in the spool: how many, why
    (index unreachable, token refused, server error) and the command that delivers them."""
    if not counts.waiting:
        return None
    n = counts.waiting
    why = counts.problem or "not delivered yet"
    command = f"neffcache flush --index-url {url}" if flush_url and url else "neffcache flush"
    return f"neffcache: {n} index report{'' if n == 1 else 's'} spooled ({why}); deliver them with `{command}`"


def announce_index(index: Index | None, stores: Sequence[str] = ()) -> None:
    """Print what a command's index reports came to, on stderr, after its output: the lost
    warning and the spool notice, one line each (nothing when all were delivered). Every
    command that reports to the index calls this after closing it, so none fails silently.
    ``stores``: the stores the command wrote, which a reconcile reads back."""
    if index is None or not index.enabled:
        return
    counts = index.counts()
    url = index.url
    flush_url = url is not None and url != _configured_index_url()
    for line in (index_warning(counts, stores, url if flush_url else None), spool_notice(counts, url, flush_url)):
        if line:
            click.echo(redact_text(line), err=True)


def _configured_index_url() -> str | None:
    """The index a plain ``neffcache flush`` would deliver to (no flags)."""
    from neffcache.application.config import load_settings

    try:
        url = load_settings().index_url
    except e.ConfigError:
        return None
    return url.rstrip("/") if url else None


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
            click.echo(f"neffcache: {redact_text(line)}", err=True)  # an index URL's password, a token
            if code == SOME_ENTRIES_FAILED and not debug_enabled():
                click.echo("(set NEFFCACHE_DEBUG=1 for a traceback)", err=True)
            return code
    raise exc


def run_guarded(main: click.Group, args: list[str] | None = None) -> None:
    try:
        main.main(args=args, prog_name="neffcache", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("neffcache: interrupted", err=True)
        sys.exit(INTERRUPTED)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("neffcache: interrupted; the cache is consistent (rerun to finish)", err=True)
        sys.exit(INTERRUPTED)
    except (e.NeffcacheError, OSError) as exc:
        sys.exit(report(exc))
