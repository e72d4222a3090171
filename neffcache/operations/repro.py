"""A compiler error packed for the compiler team: ``neffcache failures bundle``.

One failed entry (a sample of a signature) becomes a ``.tar.gz`` a compiler team can run on
its own: the HLO the compiler got, the entry's flags file and failure log as they are, the
flags as the compiler got them, the compiler version, target and LNC, a ``README.md`` with
the command line and a ``repro.sh`` that runs it::

    neffcache-repro-<signature>/
        README.md  repro.sh  failure.json  command.json
        <the HLO>  <the flags file>  <the failure log>     (the runtime's own names)

The command is rebuilt from the one the failure log records (neuronxcc's log names it; the
input, the output and the paths only the failing host had are dropped) or, when the log names
none, from the entry's flags file and its namespace's target and LNC. The compiler's argument
shape is the one docs/runtimes.md, "The compiler", describes.

The archive is written to a temp file beside the destination and renamed over it, so no half
archive is ever visible; every member is a regular file directly under the bundle directory,
so extracting it cannot write outside the directory it is extracted in (no absolute path, no
``..``, no link, no device).
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import tarfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from neffcache.errors import ConfigError, EntryNotFound
from neffcache.layouts import get_layout
from neffcache.operations.failed import FailedGraph
from neffcache.stores.base import Store
from neffcache.toolchain import COMPILER_NAME

# Options of ``neuronx-cc compile`` that take a value (``--opt value`` or ``--opt=value``).
_VALUE_OPTIONS = frozenset({"--framework", "--target", "--output", "--lnc", "--model-type", "--auto-cast",
                            "--auto-cast-type", "--verbose", "--logfile", "--workdir", "--optlevel", "-O",
                            "--cache_dir"})
# What the bundle sets itself (input, output, target, LNC, framework), and what names a path
# only the failing host had: never copied from the recorded command.
_DROPPED = frozenset({"--framework", "--target", "--output", "--lnc", "--logfile", "--workdir", "--cache_dir"})
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,200}$")


@dataclass(frozen=True)
class ReproCommand:
    """The compile to rerun: ``argv`` as the README shows it (the HLO by its bundle name)."""

    argv: tuple[str, ...]
    flags: tuple[str, ...]  # the user's flags, as the compiler got them
    target: str | None
    lnc: int | None


class Bundle(NamedTuple):
    """An archive :func:`write_bundle` wrote: where, for which signature, what it holds."""

    path: Path
    signature: str
    members: tuple[str, ...]
    command: ReproCommand

    def to_json(self) -> dict[str, object]:
        return {"path": str(self.path), "signature": self.signature, "members": list(self.members),
                "command": list(self.command.argv), "flags": list(self.command.flags),
                "target": self.command.target, "lnc": self.command.lnc}


def split_command(argv: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """(flags kept, the values of the options the bundle sets) of a recorded ``neuronx-cc
    compile`` command: its input (the first positional) and the options of :data:`_DROPPED`
    are taken out; every other flag is kept as the compiler got it."""
    args = list(argv[2:] if len(argv) > 1 and argv[1] == "compile" else argv[1:])
    kept: list[str] = []
    taken: dict[str, str] = {}
    seen_input = False
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        name, eq, value = tok.partition("=")
        if tok.startswith("-") and name in _VALUE_OPTIONS and not eq and i < len(args):
            value, i = args[i], i + 1
        elif not tok.startswith("-") and not seen_input:
            seen_input = True  # the input HLO: the bundle's own copy replaces it
            continue
        if name in _DROPPED:
            taken[name] = value
        else:
            kept.append(f"{name}={value}" if name in _VALUE_OPTIONS and not eq and value else tok)
    return kept, taken


def repro_command(store: Store, failed: FailedGraph, hlo_name: str) -> ReproCommand:
    """The compile that reproduces ``failed``: from its log's command, else its flags file."""
    entry = failed.entry
    tc = entry.toolchain
    target, lnc = entry.namespace.target or (tc.target if tc else None), entry.namespace.lnc or (tc.lnc if tc else None)
    if failed.command is not None:
        flags, taken = split_command(failed.command)
        target = taken.get("--target") or target
        lnc = int(taken["--lnc"]) if taken.get("--lnc", "").isdigit() else lnc
    else:
        layout = get_layout(entry.layout)
        name = layout.flags_of(entry)
        flags = layout.read_user_flags(name, store.read_bytes(entry.store_path(name))) if name else []
    if target is None:
        raise ConfigError(f"{entry.path}: the compile target is unknown (no target directory, no command in "
                          "its failure log): cannot write a command that reproduces it")
    # The NEFF under the name the entry's runtime gives it (neuronxcc: model.neff).
    output = get_layout(entry.layout).names(entry.namespace, entry.key).neff or "compiled.neff"
    argv = [COMPILER_NAME, "compile", "--framework=XLA", hlo_name, "--target", target,
            *(["--lnc", str(lnc)] if lnc else []), "--output", output, *flags]
    return ReproCommand(tuple(argv), tuple(flags), target, lnc)


def _readme(failed: FailedGraph, command: ReproCommand) -> str:
    version = failed.entry.namespace.compiler_version or "(unknown)"
    return f"""# neffcache failure {failed.signature}

{failed.verdict.failure_class} failure ({failed.verdict.cause}) of neuronx-cc {version}, target
{command.target}, LNC {command.lnc or "(the target's default)"}; packed by `neffcache failures bundle`
from entry `{failed.path}` of `{failed.store}`.

The compiler said:

```text
{failed.message}
```

Reproduce it with neuronx-cc {version} (run `./repro.sh`, or this in this directory):

```sh
{shlex.join(command.argv)}
```

The compiler exits non-zero and prints the error above. `failure.json` has the details
(signature, verdict, toolchain), `command.json` the command the failing host ran; the failure
log and the flags file are the entry's own.
"""


def _script(failed: FailedGraph, command: ReproCommand) -> str:
    args = shlex.join(command.argv[1:])
    return ("#!/bin/sh\n"
            f"# Reproduces neffcache failure {failed.signature} ({failed.verdict.cause}).\n"
            "# NEURONX_CC=/path/to/neuronx-cc picks the compiler (default: the one on PATH).\n"
            'cd "$(dirname "$0")" || exit 2\n'
            f'exec "${{NEURONX_CC:-{COMPILER_NAME}}}" {args}\n')


def _members(store: Store, failed: FailedGraph, command: ReproCommand, hlo_name: str) -> dict[str, bytes]:
    entry = failed.entry
    layout = get_layout(entry.layout)
    names = [hlo_name, *([n] if (n := layout.flags_of(entry)) else []), failed.log_name]
    files = {}
    for name in dict.fromkeys(names):
        try:
            files[name] = store.read_bytes(entry.store_path(name))
        except EntryNotFound:
            raise EntryNotFound(f"{entry.path}/{name} went away while the bundle was written (a retry replaced "
                                "the failure?)", store=store.url, path=entry.path) from None
    details = {**failed.to_json(), "target": command.target, "lnc": command.lnc, "pattern_of": "neffcache.failures"}
    files["failure.json"] = json.dumps(details, indent=2, sort_keys=True).encode()
    files["command.json"] = json.dumps({"argv": list(command.argv), "flags": list(command.flags),
                                        "recorded": list(failed.command) if failed.command else None},
                                       indent=2).encode()
    files["README.md"] = _readme(failed, command).encode()
    files["repro.sh"] = _script(failed, command).encode()
    return files


def write_bundle(store: Store, failed: FailedGraph, dest: Path) -> Bundle:
    """Pack ``failed`` (a FAILED entry of ``store``) into the ``.tar.gz`` at ``dest``, atomically."""
    hlo_name = get_layout(failed.entry.layout).hlo_of(failed.entry)
    if hlo_name is None:
        raise EntryNotFound(f"{failed.path} keeps no HLO: nothing to reproduce the failure from",
                            store=store.url, path=failed.path)
    command = repro_command(store, failed, hlo_name)
    files = _members(store, failed, command, hlo_name)
    top = f"neffcache-repro-{failed.signature}"
    for name in files:
        if not _SAFE_NAME.match(name) or name in (".", ".."):
            raise ConfigError(f"{failed.path}: refusing to pack a file named {name!r}")
    dest = dest.absolute()
    if dest.is_dir():
        raise ConfigError(f"{dest} is a directory: name the archive to write (-o repro.tar.gz)")
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "xb") as raw:
            with tarfile.open(fileobj=raw, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
                for name, data in files.items():
                    info = tarfile.TarInfo(f"{top}/{name}")
                    info.size, info.mtime, info.type = len(data), int(time.time()), tarfile.REGTYPE
                    info.mode = 0o755 if name == "repro.sh" else 0o644
                    tar.addfile(info, io.BytesIO(data))
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return Bundle(dest, failed.signature, tuple(f"{top}/{n}" for n in files), command)
