"""Layout A's flags file and the ``+<suffix>`` of a ``MODULE_<graph>+<suffix>`` name, by wrapper era.

libneuronxla names an entry ``MODULE_<graph_hash>+<flags_hash>`` where ``flags_hash`` is
``md5(bytes of the entry's flags file)[:8]`` (recomputed from real MODULE names and the flags
shown beside them, docs/runtimes.md, "Layout A"). What the file holds changed twice::

    era      compiler     file                  content (the bytes hashed)
    TEXT     <= 2.14      compile_flags.txt     the flag string
    LIST     2.15 - 2.20  compile_flags.json    json.dumps([*user flags])
    TARGET   >= 2.21      compile_flags.json    json.dumps(["--target=<t>", *user flags])

``--cache_dir=`` (and ``--retry_failed_compilation``, a wrapper option too) never reach the
file; ``--verbose=35`` is added to the compiler's command line after hashing. The target is in
the key only from 2.21 on. A real 2.26 trn2 entry ``+839ddec0`` had NEURON_CC_FLAGS
``--model-type=transformer --optlevel=1 --enable-saturate-infinity --lnc=2``: its file is
``["--target=trn2", "--model-type=transformer", "--optlevel=1", "--enable-saturate-infinity",
"--lnc=2"]``, so ``--lnc=2`` is one of the *user* flags there; whether the wrapper adds an
``--lnc`` of its own when the user gives none is unverified, and nothing here adds one.

Pure functions, no I/O: callers read and write the files.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Sequence
from enum import Enum

from neffcache.errors import FlagsFileError

FLAGS_TXT = "compile_flags.txt"
FLAGS_JSON = "compile_flags.json"
TARGET_FLAG = "--target="
# Options of the wrapper, not of the compiler: never in the flags file.
CACHE_DIR_FLAG = "--cache_dir"
RETRY_FLAG = "--retry_failed_compilation"  # the wrapper recompiles a cached failure
WRAPPER_ONLY = (CACHE_DIR_FLAG, RETRY_FLAG)
SUFFIX_LEN = 8


class FlagsEra(Enum):
    """The wrapper's flags-file form (see the module docstring)."""

    TEXT = "text"  # <= 2.14
    LIST = "list"  # 2.15 - 2.20
    TARGET = "target"  # >= 2.21

    @property
    def file_name(self) -> str:
        return FLAGS_TXT if self is FlagsEra.TEXT else FLAGS_JSON

    @property
    def since(self) -> str | None:
        """The first compiler (major.minor) of the era; None for the oldest."""
        return {FlagsEra.TEXT: None, FlagsEra.LIST: "2.15", FlagsEra.TARGET: "2.21"}[self]

    @property
    def form(self) -> str:
        """What the flags file holds in this era, in a few words (``why-miss`` shows it)."""
        return {FlagsEra.TEXT: f"{FLAGS_TXT}: the flag string",
                FlagsEra.LIST: f"{FLAGS_JSON}: the list of flags",
                FlagsEra.TARGET: f"{FLAGS_JSON}: --target=<t> then the list of flags"}[self]


def version_tuple(version: str) -> tuple[int, int] | None:
    """(major, minor) of a compiler version such as ``2.21.33363.0+82129205``, or None."""
    parts = version.split("+", 1)[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def era_of(version: str) -> FlagsEra | None:
    """The flags-file era of a compiler version; None when the version cannot be read."""
    vt = version_tuple(version)
    if vt is None:
        return None
    if vt <= (2, 14):
        return FlagsEra.TEXT
    if vt <= (2, 20):
        return FlagsEra.LIST
    return FlagsEra.TARGET


def user_flags(flags: Sequence[str]) -> list[str]:
    """``flags`` without the wrapper's own options (``--cache_dir[=]DIR``, retry)."""
    out: list[str] = []
    skip_next = False
    for flag in flags:
        if skip_next:
            skip_next = False
            continue
        name = flag.split("=", 1)[0]
        if name in WRAPPER_ONLY:
            skip_next = name == "--cache_dir" and "=" not in flag
            continue
        out.append(flag)
    return out


def without_cache_dir(flags: Sequence[str]) -> list[str]:
    """``flags`` without ``--cache_dir=DIR`` or ``--cache_dir DIR`` (which would send the
    runtime's NEFFs to a directory other than the namespace it is pointed at)."""
    out: list[str] = []
    skip_next = False
    for flag in flags:
        if skip_next:
            skip_next = False
        elif flag == CACHE_DIR_FLAG:
            skip_next = True
        elif not flag.startswith(CACHE_DIR_FLAG + "="):
            out.append(flag)
    return out


def flags_file(era: FlagsEra, target: str | None, flags: Sequence[str]) -> tuple[str, bytes]:
    """(name, bytes) of the flags file a runtime of ``era`` writes for these user flags.

    ``target`` is required from 2.21 on (it is the list's first element), ignored before.
    """
    flags = user_flags(flags)
    if era is FlagsEra.TEXT:
        return FLAGS_TXT, " ".join(flags).encode()
    if era is FlagsEra.LIST:
        return FLAGS_JSON, json.dumps(flags).encode()
    if not target:
        raise FlagsFileError("from neuronx-cc 2.21 on the target is part of the flags file: it is unknown")
    return FLAGS_JSON, json.dumps([TARGET_FLAG + target, *flags]).encode()


def suffix_of(data: bytes) -> str:
    """The ``+<suffix>`` a runtime gives an entry whose flags file holds ``data``."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()[:SUFFIX_LEN]


def read_flags_file(name: str, data: bytes) -> tuple[list[str], str | None]:
    """(user flags, target or None) recovered from a flags file named ``name``.

    A JSON list whose first element is ``--target=<t>`` is the 2.21+ form. Raises
    :class:`FlagsFileError` when the file is not what any era writes.
    """
    if name == FLAGS_TXT:
        try:
            text = data.decode()
        except UnicodeDecodeError:
            raise FlagsFileError(f"{name} is not text") from None
        try:
            return shlex.split(text), None
        except ValueError:
            return text.split(), None
    try:
        value = json.loads(data)
    except ValueError:
        raise FlagsFileError(f"{name} is not JSON") from None
    if not isinstance(value, list) or not all(isinstance(f, str) for f in value):
        raise FlagsFileError(f"{name} is not a JSON list of strings")
    if value and value[0].startswith(TARGET_FLAG):
        return value[1:], value[0][len(TARGET_FLAG):] or None
    return value, None


def split_module(key: str) -> tuple[str, str] | None:
    """(graph hash, flags suffix) of ``MODULE_<g>+<f>``, or None for another name."""
    if not key.startswith("MODULE_"):
        return None
    graph, plus, suffix = key[len("MODULE_"):].partition("+")
    if not plus or not graph or not suffix:
        return None
    return graph, suffix


def module_name(graph: str, suffix: str) -> str:
    return f"MODULE_{graph}+{suffix}"


def suffix_problem(key: str, data: bytes) -> str | None:
    """Why the flags file ``data`` does not belong to entry ``key``, or None when it does."""
    parts = split_module(key)
    if parts is None:
        return f"{key} is not a MODULE_<graph>+<flags> name"
    got = suffix_of(data)
    if got != parts[1]:
        return (f"flags file does not match the MODULE name (md5 {got}, name says +{parts[1]}): "
                "would publish a NEFF built with other flags than its key says")
    return None
