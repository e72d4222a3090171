"""Finding ``neffcache ...`` command lines in manifests, CI scripts and docs, and checking them
against the real click application: the subcommand exists, every flag exists, every value
converts (click's own parsing, without running the command)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import click

from neffcache.cli.main import cli
from neffcache.warmers.matrix import Shard

COMMAND_NAMES = frozenset(cli.list_commands(click.Context(cli)))

UNSET = "\x00UNSET:"
_OPERATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;"}
_REDIRECTS = {">", ">>", "<", "2>", "&>"}
_GH_EXPR = re.compile(r"\$\{\{\s*(?P<expr>[^}]*?)\s*\}\}")
_ARITH = re.compile(r"\$\(\((?P<expr>[^)]*)\)\)")
_SHELL_VAR = re.compile(r"\$\{(?P<braced>\w+)\}|\$(?P<bare>[A-Za-z_]\w*)")
_ASSIGNMENT = re.compile(r"^(?P<name>[A-Za-z_]\w*)=(?P<value>\S*)$")


@dataclass(frozen=True)
class Invocation:
    """One parsed ``neffcache`` command: the command path and click's parameter values."""

    argv: tuple[str, ...]
    path: tuple[str, ...]  # ("token", "create")
    params: Mapping[str, Any]
    command: click.Command

    @property
    def name(self) -> str:
        return " ".join(self.path)


def parse_invocation(argv: list[str] | tuple[str, ...]) -> Invocation:
    """Validate ``argv`` (starting with ``neffcache``) with click; raise click errors if wrong."""
    argv = list(argv)
    assert argv and argv[0] == "neffcache", argv
    leaked = [a for a in argv if UNSET in a]
    assert not leaked, f"unresolved variables in {shlex.join(argv)}: {[a.split(UNSET)[1] for a in leaked]}"
    rest = argv[1:]
    while rest and rest[0] in ("-v", "-vv", "--verbose"):
        rest = rest[1:]
    command: click.Command = cli
    parent = click.Context(cli, info_name="neffcache")
    path: list[str] = []
    while isinstance(command, click.Group):
        if command.invoke_without_command and path and (not rest or rest[0].startswith("-")):
            break  # a group that is a command of its own too (`neffcache failures --window 7d`)
        if not rest:
            raise click.UsageError(f"missing subcommand after {' '.join(['neffcache', *path])}")
        sub = command.get_command(parent, rest[0])
        if sub is None:
            raise click.UsageError(f"no such command: neffcache {' '.join([*path, rest[0]])}")
        path.append(rest[0])
        command, rest = sub, rest[1:]
        if isinstance(command, click.Group):
            parent = click.Context(command, info_name=path[-1], parent=parent)
    with command.make_context(path[-1], list(rest), parent=parent) as ctx:
        params = dict(ctx.params)
    for param in command.params:
        if isinstance(param, click.Argument) and param.nargs == -1 and param.type is click.UNPROCESSED:
            # warm/run stop parsing options at the first word they do not know and take the rest
            # as the workload: a misspelt flag would silently become part of the workload. So the
            # workload must follow `--`, and everything before it must have parsed as options.
            assert "--" in rest, f"put the workload after `--`: {shlex.join(argv)}"
            workload = tuple(rest[rest.index("--") + 1:])
            assert tuple(params[param.name or ""]) == workload, (
                f"{shlex.join(argv)}: words before `--` that are not options of `neffcache {' '.join(path)}`: "
                f"{list(params[param.name or ''])[:len(params[param.name or '']) - len(workload)]}")
    if params.get("shard"):
        Shard.parse(params["shard"])  # the real parser the command body uses
    return Invocation(tuple(argv), tuple(path), params, command)


def option_names(command: click.Command) -> set[str]:
    names: set[str] = set()
    for param in command.params:
        if isinstance(param, click.Option):
            names.update(param.opts)
            names.update(param.secondary_opts)
    return names


def expand(text: str, values: Mapping[str, str]) -> str:
    """Expand GitHub ``${{ expr }}``, shell ``$((arith))``, ``${VAR}`` and ``$VAR`` from
    ``values``. Unknown names become a marker that :func:`parse_invocation` rejects."""

    def gh(m: re.Match[str]) -> str:
        expr = m.group("expr")
        return values.get(expr, f"{UNSET}{expr}")

    def var(m: re.Match[str]) -> str:
        name = m.group("braced") or m.group("bare")
        return values.get(name, f"{UNSET}{name}")

    def arith(m: re.Match[str]) -> str:
        inner = _SHELL_VAR.sub(var, m.group("expr"))
        inner = re.sub(r"\b([A-Za-z_]\w*)\b", lambda v: values.get(v.group(1), f"{UNSET}{v.group(1)}"), inner)
        if UNSET in inner or not re.fullmatch(r"[\d\s+\-*/%()]+", inner):
            return f"{UNSET}{m.group('expr')}"
        return str(int(eval(inner)))  # digits and operators only, checked above

    text = _GH_EXPR.sub(gh, text)
    text = _ARITH.sub(arith, text)
    return _SHELL_VAR.sub(var, text)


def _simple_commands(tokens: list[str]) -> Iterator[list[str]]:
    current: list[str] = []
    skip_next = False
    for token in tokens:
        if skip_next:
            skip_next = False
            continue
        if token in _OPERATORS:
            if current:
                yield current
            current = []
        elif token in _REDIRECTS or token.startswith((">", "<")):
            skip_next = token in _REDIRECTS
        else:
            current.append(token)
    if current:
        yield current


def shell_lines(script: str) -> list[str]:
    """A shell script's logical lines: continuations joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", script)
    return [line for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def neffcache_argvs(script: str, values: Mapping[str, str]) -> list[list[str]]:
    """Every ``neffcache ...`` invocation in a shell script, variables expanded. Simple
    assignments (``SHARD="..."``) seen earlier in the script feed later expansions. A word
    ``neffcache`` anywhere in a simple command starts an invocation (``docker run IMAGE neffcache ...``)."""
    scope = dict(values)
    found = []
    for line in shell_lines(script):
        expanded = expand(line, scope)
        lexer = shlex.shlex(expanded, posix=True, punctuation_chars="();<>|&")
        lexer.whitespace_split = True
        tokens = list(lexer)
        for command in _simple_commands(tokens):
            if len(command) == 1 and (m := _ASSIGNMENT.match(command[0])):
                scope[m.group("name")] = m.group("value")
                continue
            starts = [i for i, word in enumerate(command) if word == "neffcache"]
            if starts:
                # `kubectl -n neffcache exec deploy/x -- neffcache token ...`: the invocation is the
                # `neffcache` followed by a real command; with none, the first (so typos still fail).
                real = [i for i in starts if i + 1 < len(command) and command[i + 1] in COMMAND_NAMES]
                found.append(command[(real or starts)[0]:])
    return found


def replace_workload(argv: list[str], workload: list[str]) -> list[str]:
    """The same neffcache flags, with the user's workload after ``--`` swapped for ``workload``."""
    if "--" not in argv:
        return argv
    return [*argv[:argv.index("--") + 1], *workload]
