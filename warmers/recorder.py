"""``neffcache plan``'s recording ``neuronx-cc``: it records what it is asked to compile, and compiles nothing.

``plan`` runs the job once against a private scratch cache with this stand-in first on PATH
(installed as a small executable script by :func:`install_recorder`, the way
:mod:`neffcache.testing.shim` installs the simulated compiler). To the runtime it is the
toolchain's compiler:

- ``neuronx-cc --version`` prints what the installed compiler prints (its output, replayed
  from a file ``plan`` wrote), or its version line when ``plan`` names a version that is not
  installed: the runtime derives its cache namespace from it, so the paths it looks up are
  the ones a real run would;
- ``neuronx-cc compile <hlo> --output <neff> ...`` appends one JSON line to the records file
  (the HLO's sha256 and size, target, LNC, the flags, the input and output paths), keeps a
  copy of the HLO beside it (``hlo/<sha256>``), writes a placeholder NEFF
  (:mod:`neffcache.placeholder`) to ``--output`` and exits 0 at once, so the runtime stores it in
  the scratch cache and goes on to its next graph.

It runs only under ``plan``: without ``NEFFCACHE_PLAN_RECORDS`` (the records directory) it
refuses to compile and writes nothing, so a placeholder never appears where no one expects one.

Kept import-light on purpose (the standard library and :mod:`neffcache.placeholder`): a job
with a thousand graphs starts it a thousand times.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neffcache.placeholder import placeholder_bytes

ENV_RECORDS = "NEFFCACHE_PLAN_RECORDS"
ENV_VERSION_TEXT = "NEFFCACHE_PLAN_VERSION_TEXT"
RECORDS_FILE = "invocations.jsonl"
HLO_DIR = "hlo"
COMPILER_NAME = "neuronx-cc"
# The compiler's options that take a value (``--opt value`` or ``--opt=value``), and those of
# them that say where files go, what to build for or how chatty to be: the runtime (or the
# compile pool) passes these itself, so they are not the graph's flags.
_VALUE_OPTIONS = frozenset({"--framework", "--target", "--output", "--lnc", "--model-type", "--auto-cast",
                            "--auto-cast-type", "--verbose", "--logfile", "--workdir", "--optlevel", "-O"})
_NOT_FLAGS = frozenset({"--framework", "--target", "--output", "--lnc", "--verbose", "--logfile", "--workdir"})


@dataclass(frozen=True)
class Invocation:
    """One ``compile`` command line as the runtime gave it."""

    input: str
    output: str
    target: str | None
    lnc: int | None
    flags: tuple[str, ...]


def parse_compile(argv: Sequence[str]) -> Invocation:
    """The arguments after ``compile``. The input is the positional that names an existing file
    (an unknown ``--flag value`` may put another positional before it); ValueError when none does."""
    options: dict[str, str] = {}
    flags: list[str] = []
    positionals: list[str] = []
    rest = deque(argv)
    while rest:
        arg = rest.popleft()
        name, eq, value = arg.partition("=")
        if arg.startswith("-O") and len(arg) > 2 and not eq:
            name, value, eq = "-O", arg[2:], "="
        if name in _VALUE_OPTIONS:
            if not eq:
                if not rest:
                    raise ValueError(f"{name} needs a value")
                value = rest.popleft()
            options[name] = value
            if name not in _NOT_FLAGS:
                flags.append(f"{name}={value}" if name != "-O" else f"-O{value}")
        elif arg.startswith("-") and arg != "-":
            flags.append(arg)
            # An option the compiler has and we do not know, with its value: kept together.
            if not eq and rest and not rest[0].startswith("-") and not os.path.isfile(rest[0]):
                flags.append(rest.popleft())
        else:
            positionals.append(arg)
    inputs = [p for p in positionals if os.path.isfile(p)]
    if not inputs:
        raise ValueError(f"no input file among {positionals!r}")
    lnc = options.get("--lnc")
    return Invocation(inputs[0], options.get("--output", "file.neff"), options.get("--target"),
                      int(lnc) if lnc and lnc.isdigit() else None, tuple(flags))


def _write_new(path: Path, data: bytes) -> None:
    """``data`` at ``path`` whole (temp name + rename), unless the file is there already."""
    if path.exists():
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def record(records: Path, call: Invocation, argv: Sequence[str]) -> dict[str, Any]:
    """Keep the HLO, append the invocation's line, write the placeholder NEFF: in that order, so
    a line always has its HLO and the runtime sees a NEFF only once the compile is recorded."""
    hlo = Path(call.input).read_bytes()
    digest = hashlib.sha256(hlo).hexdigest()
    (records / HLO_DIR).mkdir(parents=True, exist_ok=True)
    _write_new(records / HLO_DIR / digest, hlo)
    line = {"hlo_sha256": digest, "hlo_size": len(hlo), "input": call.input, "output": call.output,
            "target": call.target, "lnc": call.lnc, "flags": list(call.flags), "argv": list(argv),
            "pid": os.getpid(), "time": time.time()}
    fd = os.open(records / RECORDS_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, (json.dumps(line, sort_keys=True) + "\n").encode())  # one write: lines never interleave
    finally:
        os.close(fd)
    out = Path(call.output)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.placeholder.tmp")
    try:
        tmp.write_bytes(placeholder_bytes(digest, len(hlo)))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return line


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["--version"], ["-V"]):
        text_file = os.environ.get(ENV_VERSION_TEXT, "")
        try:
            sys.stdout.write(Path(text_file).read_text())
        except OSError as exc:
            print(f"{COMPILER_NAME} (neffcache plan recorder): cannot read the version text: {exc}", file=sys.stderr)
            return 2
        return 0
    if args[:1] != ["compile"]:
        print(f"{COMPILER_NAME} (neffcache plan recorder): only `--version` and `compile` are answered, "
              f"not {shlex.join(args[:1]) or 'nothing'}", file=sys.stderr)
        return 2
    records = os.environ.get(ENV_RECORDS, "")
    if not records or not Path(records).is_dir():
        print(f"{COMPILER_NAME} (neffcache plan recorder): {ENV_RECORDS} names no directory: run by `neffcache "
              "plan` only; nothing was written", file=sys.stderr)
        return 1
    try:
        call = parse_compile(args[1:])
        record(Path(records), call, args)
    except (OSError, ValueError) as exc:
        print(f"ERROR:{COMPILER_NAME} (neffcache plan recorder): {exc}\nCompiler status ERROR", file=sys.stderr)
        return 1
    print("Compiler status PASS (neffcache plan: recorded, not compiled; the NEFF is a placeholder)")
    return 0


def install_recorder(bin_dir: Path, version_text: str, *, python: str = sys.executable) -> Path:
    """Write ``bin_dir/neuronx-cc`` running this module, answering ``--version`` with ``version_text``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    text_file = bin_dir / "version.txt"
    text_file.write_text(version_text)
    script = "\n".join([
        "#!/bin/sh",
        "# neuronx-cc stand-in written by `neffcache plan`: records compiles, writes placeholder NEFFs.",
        f"{ENV_VERSION_TEXT}={shlex.quote(str(text_file))} && export {ENV_VERSION_TEXT}",
        f'exec {shlex.quote(python)} -m neffcache.warmers.recorder "$@"',
    ]) + "\n"
    path = bin_dir / COMPILER_NAME
    tmp = bin_dir / f".{COMPILER_NAME}.{os.getpid()}.tmp"
    tmp.write_text(script)
    tmp.chmod(0o700)
    os.replace(tmp, path)
    return path


def read_records(records: Path) -> list[dict[str, Any]]:
    """The invocations recorded in ``records`` (lines that are not a recorder's are skipped: a
    workload could write there too; nothing read here is trusted further than its types)."""
    try:
        text = (records / RECORDS_FILE).read_text(errors="replace")
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and isinstance(item.get("hlo_sha256"), str) and isinstance(item.get("flags"), list):
            out.append(item)
    return out


if __name__ == "__main__":
    sys.exit(main())
