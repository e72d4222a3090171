"""The ``neffcache`` command: a click group; commands live in one module per noun they act on."""

from __future__ import annotations

import importlib
import logging

import click

from neffcache import __version__

from .errors import run_guarded

# Each module exposes COMMANDS: list[click.Command].
COMMAND_MODULES = (
    "neffcache.cli.cache",  # one cache root: scan, show, verify, env, config
    "neffcache.cli.sync",  # between stores: push, pull
    "neffcache.cli.warm",  # compiling: warm, rewarm, run
    "neffcache.cli.plan",  # before compiling: plan (what a job will miss, what it costs)
    "neffcache.cli.prune",  # cleaning: prune, reconcile
    "neffcache.cli.failures",  # failed graphs by error signature, and a bundle for the compiler team
    "neffcache.cli.why_miss",  # explaining a miss: why-miss
    "neffcache.cli.upgrade",  # a compiler bump: upgrade-report
    "neffcache.cli.index",  # a running index server: stats, flush
    "neffcache.cli.server",  # the index server itself: serve, token, db
    "neffcache.cli.doctor",
    "neffcache.cli.demo",
)

EPILOG = """\b
Examples:
  neffcache env --instance trn2.48xlarge --store fsx:///mnt/fsx/neuron-cache
  neffcache warm --instance trn2.48xlarge -- python train.py --max-steps 2
  neffcache scan /var/tmp/neuron-compile-cache
  neffcache prune --store fsx:///mnt/fsx/neuron-cache --keep-compiler current

Settings come from flags, NEFFCACHE_* variables and neffcache.toml (see `neffcache config`).
"""


@click.group(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="neffcache")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def cli(verbose: int) -> None:
    """neffcache: the compile cache for AWS Neuron (Trainium / Inferentia).

    Warms NEFF caches on CPU hosts, keeps shared FSx/S3 caches filled and clean,
    and shows hit rates.
    """
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


for _module in COMMAND_MODULES:
    for _command in importlib.import_module(_module).COMMANDS:
        cli.add_command(_command)


def main() -> None:
    run_guarded(cli)


if __name__ == "__main__":
    main()
