"""CLI commands that talk to the index server (serve, token, stats)."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
