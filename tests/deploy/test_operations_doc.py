"""docs/operations.md: every `neffcache ...` command it shows is one the CLI really has.

Code blocks are parsed whole by click (subcommand, flags, values, required arguments), for the
commands run inside `kubectl exec ... --` too; inline code spans are fragments, so for those the
subcommand and each flag must exist."""

from __future__ import annotations

import re

import click
import pytest

from tests.deploy.commands import neffcache_argvs, option_names, parse_invocation
from tests.deploy.files import OPERATIONS

TEXT = OPERATIONS.read_text()
BLOCKS = re.findall(r"^\s*```(?:sh|bash|console)\n(.*?)^\s*```", TEXT, re.M | re.S)
INLINE = [span for span in re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", TEXT, flags=re.S))
          if span.startswith("neffcache ")]


def test_the_guide_covers_the_issue() -> None:
    for heading in ("Sizing", "IAM and bucket policy", "S3 lifecycle rules vs `neffcache prune`",
                    "FSx for Lustre mount options", "The compiler-bump playbook", "Backup and restore of the index",
                    "Upgrading (schema migrations)", "What to monitor"):
        assert f"\n## {heading}" in TEXT, heading


def block_invocations() -> list[list[str]]:
    found = []
    for block in BLOCKS:
        found += neffcache_argvs(block, {})
    return found


@pytest.mark.parametrize("argv", block_invocations(), ids=lambda a: " ".join(a[:3]))
def test_code_block_commands_parse(argv: list[str]) -> None:
    parse_invocation(argv)


def test_there_are_commands_to_check() -> None:
    names = {" ".join(parse_invocation(a).path) for a in block_invocations()}
    assert {"rewarm", "warm", "prune", "pull", "scan", "stats", "reconcile", "token create"} <= names
    assert len(INLINE) >= 5


@pytest.mark.parametrize("span", INLINE)
def test_inline_commands_name_real_subcommands_and_flags(span: str) -> None:
    from neffcache.cli.main import cli

    words = span.split()[1:]
    command: click.Command = cli
    ctx = click.Context(cli)
    while isinstance(command, click.Group) and words:
        sub = command.get_command(ctx, words[0])
        assert sub is not None, f"`{span}`: no such command {words[0]!r}"
        command, words = sub, words[1:]
    for word in words:
        if word == "--":
            break
        if word.startswith("-"):
            assert word.split("=")[0] in option_names(command) | {"--help", "-h"}, f"`{span}`: no option {word}"
