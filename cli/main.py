"""The ``neffcache`` command: a click group; commands live in one module per noun they act on.

A command's module is imported when that command runs, not before: importing every module (the
compiler drivers, the prune planner, the server's client) made ``neffcache --version`` cost
0.41-0.50 s of CPU, 0.11-0.16 s now (docs/architecture.md, "cli/"); ``--version`` also imports
the stores package, to say whether the C listing helper loads (0.15-0.2 s). ``--help`` lists every
command and so imports them all.
"""

from __future__ import annotations

import functools
import importlib
import io
import logging
import sys
from collections.abc import Mapping
from typing import Any

import click

from neffcache import __version__
from neffcache.redaction import RedactingFilter

from .errors import run_guarded

# Each module exposes COMMANDS: list[click.Command], named as here (tests/cli/test_cli_base.py
# holds the two to each other).
COMMAND_MODULES: Mapping[str, tuple[str, ...]] = {
    "neffcache.cli.scan": ("scan",),  # one cache root: what it holds
    "neffcache.cli.cache": ("verify", "env", "config"),  # one cache root
    "neffcache.cli.show": ("show",),  # one entry
    "neffcache.cli.sync": ("push", "pull", "promote"),  # between stores
    "neffcache.cli.coldstart": ("prefetch",),  # a pod's NEFFs to node-local disk before it starts
    "neffcache.cli.trust": ("key",),  # signing keys
    "neffcache.cli.warm": ("warm", "rewarm", "run"),  # compiling
    "neffcache.cli.plan": ("plan",),  # before compiling: what a job will miss, what it costs
    "neffcache.cli.prune": ("prune", "reconcile"),  # cleaning
    "neffcache.cli.failures": ("failures",),  # failed graphs by error signature, a bundle for the compiler team
    "neffcache.cli.why_miss": ("why-miss",),  # explaining a miss
    "neffcache.cli.upgrade": ("upgrade-report",),  # a compiler bump
    "neffcache.cli.index": ("stats", "flush"),  # a running index server
    "neffcache.cli.server": ("serve", "token", "db"),  # the index server itself
    "neffcache.cli.doctor": ("doctor",),
    "neffcache.cli.demo": ("demo",),
}


class LazyGroup(click.Group):
    """A group whose commands are imported from their module (``modules``: module -> the
    names of its COMMANDS) the first time one of them is asked for."""

    def __init__(self, *args: object, modules: Mapping[str, tuple[str, ...]], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.module_of = {name: module for module, names in modules.items() for name in names}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.module_of})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = self.module_of.get(cmd_name)
        if cmd_name not in self.commands and module is not None:
            for command in importlib.import_module(module).COMMANDS:
                self.add_command(_signing(command) if command.name in PUBLISHING else command)
            if cmd_name not in self.commands:  # the table above is wrong: a bug, not a usage error
                raise RuntimeError(f"{module} has no command {cmd_name!r} (cli/main.py COMMAND_MODULES)")
        return self.commands.get(cmd_name)


# The commands that mint manifests (compiles, adoption of runtime-written entries) or carry them.
PUBLISHING = frozenset({"warm", "rewarm", "run", "push", "pull", "prefetch", "promote", "plan"})


def _signing(command: click.Command) -> click.Command:
    """``command`` with its publisher set before it runs: what it mints carries its name and is
    signed with the settings' key (neffcache/operations/publisher.py); a key that cannot be read
    stops it before any work. Set when its callback runs, after click has parsed its arguments,
    so `warm --help` prints help even where the key cannot be read (the group's own callback
    runs before the subcommand sees its --help), and `-- ... --help` of a workload is no help."""
    run = command.callback
    if run is None or getattr(run, "signs", False):
        return command

    @functools.wraps(run)
    def signed(*args: Any, **kwargs: Any) -> Any:
        from neffcache.application.config import load_settings
        from neffcache.application.trusted import publisher as publisher_for
        from neffcache.operations import publisher
        publisher.use(publisher_for(load_settings(), str(command.name)))
        return run(*args, **kwargs)

    signed.signs = True  # type: ignore[attr-defined]
    command.callback = signed
    return command

EPILOG = """\b
Examples:
  neffcache env --instance trn2.48xlarge --store fsx:///mnt/fsx/neuron-cache
  neffcache warm --instance trn2.48xlarge -- python train.py --max-steps 2
  neffcache scan /var/tmp/neuron-compile-cache
  neffcache prune --store fsx:///mnt/fsx/neuron-cache --keep-compiler current

Settings come from flags, NEFFCACHE_* variables and neffcache.toml (see `neffcache config`).
"""


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """The version, and the listing path: the C helper is optional, and an install that went on
    without it (no compiler) lists files at about a third of the speed, with nothing else to say so."""
    if not value or ctx.resilient_parsing:
        return
    from neffcache.stores.local_listing import native_listing

    click.echo(f"neffcache, version {__version__}")
    click.echo(f"native listing: {native_listing().describe()}")
    ctx.exit()


@click.group(cls=LazyGroup, modules=COMMAND_MODULES, epilog=EPILOG,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version, and whether scans list in C, and exit.")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def cli(verbose: int) -> None:
    """neffcache: the compile cache for AWS Neuron (Trainium / Inferentia).

    Warms NEFF caches on CPU hosts, keeps shared FSx/S3 caches filled and clean,
    and shows hit rates.
    """
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # no log line prints a password or a token
        handler.addFilter(RedactingFilter())


def main() -> None:
    # A name from a store the text output did not pass through shown_name (cli/output.py) must
    # still not end the command under a strict stdout (PYTHONIOENCODING=utf-8:strict, a C locale):
    # what cannot be encoded is printed as an escape instead of raising UnicodeEncodeError.
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            stream.reconfigure(errors="backslashreplace")
    run_guarded(cli)


if __name__ == "__main__":
    main()
