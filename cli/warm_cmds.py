"""Placeholder: commands of an issue still being built."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
