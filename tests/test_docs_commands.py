"""Every ``neffcache ...`` command line in README.md and docs/*.md is one the CLI really has.

Code blocks are parsed whole by click (subcommand, flags, values, required arguments);
inline code spans are fragments, so for those the subcommand and each flag must exist. A doc
cannot drift from the CLI again: renaming a flag fails here until the docs follow.
(docs/operations.md has its own, stricter checks in tests/deploy/test_operations_doc.py.)
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from tests.deploy.commands import neffcache_argvs, option_names, parse_invocation

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Shell blocks only: untagged blocks hold synopses (`prune [--store URL]...`) and diagrams.
_BLOCK = re.compile(r"^\s*```(?:sh|bash|console|shell)\n(.*?)^\s*```", re.M | re.S)
# Variables the examples take from their CI system.
_VALUES = {"JOB_COMPLETION_INDEX": "0", "CI_NODE_INDEX": "1", "CI_NODE_TOTAL": "4"}


def _blocks(text: str) -> list[str]:
    return _BLOCK.findall(text)


def _inline(text: str) -> list[str]:
    bare = re.sub(r"```.*?```", "", text, flags=re.S)
    return [s for s in re.findall(r"`([^`\n]+)`", bare) if s.startswith("neffcache ") and "<" not in s]


def block_cases() -> list[tuple[str, list[str]]]:
    cases = []
    for doc in DOCS:
        for block in _blocks(doc.read_text()):
            cases += [(doc.name, argv) for argv in neffcache_argvs(block, _VALUES)]
    return cases


def inline_cases() -> list[tuple[str, str]]:
    return [(doc.name, span) for doc in DOCS for span in _inline(doc.read_text())]


def test_the_docs_show_commands() -> None:
    assert len(block_cases()) >= 15 and len(inline_cases()) >= 20


@pytest.mark.parametrize(("doc", "argv"), block_cases(), ids=lambda v: v if isinstance(v, str) else " ".join(v[:3]))
def test_code_block_commands_parse(doc: str, argv: list[str]) -> None:
    try:
        parse_invocation(argv)
    except (click.UsageError, click.BadParameter) as exc:
        pytest.fail(f"{doc}: `{' '.join(argv)}`: {exc}")


@pytest.mark.parametrize(("doc", "span"), inline_cases(), ids=lambda v: v)
def test_inline_commands_name_real_subcommands_and_flags(doc: str, span: str) -> None:
    from neffcache.cli.main import cli

    # `token create|list|revoke`, `push/pull`: a fragment naming alternatives; check each.
    first, *rest = span.split()[1:] or [""]
    for alternative in re.split(r"[|/]", first) if not first.startswith("-") else [first]:
        check_words(doc, span, [alternative, *rest], cli)


def check_words(doc: str, span: str, words: list[str], cli: click.Group) -> None:
    command: click.Command = cli
    ctx = click.Context(cli)
    while isinstance(command, click.Group) and words and not words[0].startswith("-"):
        names = re.split(r"[|/]", words[0])
        subs = [command.get_command(ctx, name) for name in names]
        assert all(sub is not None for sub in subs), f"{doc}: `{span}`: no such command {words[0]!r}"
        command, words = subs[0], words[1:]  # type: ignore[assignment]
    for word in words:
        if word == "--" or word in ("|", "&&", ">"):
            break
        if word.startswith("-"):
            assert word.split("=")[0] in option_names(command) | {"--help", "-h"}, f"{doc}: `{span}`: no option {word}"
