"""The upgrades suite runs the CLI over the simulated toolchain with a live index, as the warmers do."""

from tests.warmers.conftest import cli, index  # noqa: F401
