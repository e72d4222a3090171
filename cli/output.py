"""Rendering results: tables for people, ``--json`` for programs, progress on stderr."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


# How a name from a store is shown: a path on disk may hold any byte but "/" and NUL. Bytes that
# are not UTF-8 reach Python as lone surrogates (surrogateescape), which a strict UTF-8 stdout
# cannot encode (a traceback, the rest of the output lost); control characters would drive the
# terminal. Both are shown as \xNN, and a backslash as \\ so the escapes are unambiguous.
_SHOWN = {**{c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))},
          **{c: f"\\x{c - 0xDC00:02x}" for c in range(0xDC80, 0xDD00)}, ord("\\"): "\\\\"}


def shown_name(name: str) -> str:
    """A raw name (a path from a store, a file name) as the text output shows it: the one place
    that decides, so every command prints a name the same way and never fails to."""
    return name.translate(_SHOWN)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")(f)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def toml_value(value: Any) -> str:
    """``value`` as TOML (strings, numbers, booleans, lists and string tables: what settings hold).
    A TOML basic string takes JSON's escapes, so json.dumps writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def toml_lines(values: dict[str, Any], hidden: frozenset[str] = frozenset()) -> list[str]:
    """``key = value`` lines a neffcache.toml takes; an unset key (None) and a ``hidden`` one (a
    secret) as a comment, so the lines read back as exactly the settings shown."""
    out = []
    for key, value in values.items():
        if key in hidden and value is not None:
            out.append(f"# {key} is set (not shown)")
        elif value is None:
            out.append(f"# {key} is not set")
        else:
            out.append(f"{key} = {toml_value(value)}")
    return out


def write_report(path: Path, data: Any) -> None:
    """Write a JSON report file whole or not at all: a temp file beside it, then a rename. A job
    killed mid-write leaves the previous report (or none), never half of one that
    `why-miss --from-report` would then refuse."""
    write_atomically(path, (json.dumps(data, indent=2, sort_keys=True, default=str) + "\n").encode())


def write_atomically(path: Path, body: bytes) -> None:
    """``body`` into ``path`` whole or not at all (a temp file beside it, then a rename)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or Path("."))
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(body)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise


def table(rows: Sequence[Sequence[object]], headers: Sequence[str]) -> str:
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))

    return "\n".join([line(cells[0]), "  ".join("-" * w for w in widths), *(line(r) for r in cells[1:])])


class Progress:
    """A one-line progress counter on stderr: redrawn on a terminal, sparse lines otherwise."""

    def __init__(self, label: str, total: int | None = None, *, enabled: bool = True) -> None:
        self.label = label
        self.total = total
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self._last = 0.0
        self.count = 0

    def update(self, count: int, total: int | None = None, detail: str = "") -> None:
        self.count = count
        if total is not None:
            self.total = total
        now = time.monotonic()
        if not self.enabled or now - self._last < (0.1 if self.tty else 5.0):
            return
        self._last = now
        self._draw(detail)

    def _draw(self, detail: str = "") -> None:
        of = f"/{self.total}" if self.total else ""
        text = f"{self.label}: {self.count}{of} {detail}".rstrip()
        if self.tty:
            click.echo(f"\r\x1b[2K{text}", err=True, nl=False)
        else:
            click.echo(text, err=True)

    def close(self) -> None:
        if self.enabled and self.tty and self._last:
            click.echo("\r\x1b[2K", err=True, nl=False)


@contextmanager
def progress(label: str, total: int | None = None, *, enabled: bool = True) -> Iterator[Progress]:
    bar = Progress(label, total, enabled=enabled)
    try:
        yield bar
    finally:
        bar.close()


def render(as_json: bool, data: Any, text: Callable[[], str]) -> None:
    if as_json:
        emit_json(data)
    else:
        click.echo(text())
