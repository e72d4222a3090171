"""The ``neffcache`` command: a click group; each module holds the commands of one noun."""

from __future__ import annotations

import importlib
import logging

import click

from neffcache import __version__

from .errors import run_guarded

# Each module exposes COMMANDS: list[click.Command].
COMMAND_MODULES = (
    "neffcache.cli.cache_cmds",
    "neffcache.cli.sync_cmds",
    "neffcache.cli.server_cmds",
    "neffcache.cli.warm_cmds",
    "neffcache.cli.prune_cmds",
    "neffcache.cli.demo_cmd",
    "neffcache.cli.doctor_cmd",
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
