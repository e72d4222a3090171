"""What the user names as the missed graph, as a :class:`~neffcache.misses.explain.Missed`.

Four forms, told apart without guessing (:func:`missed_from_argument`): an existing file is an
HLO (``*.hlo_module.pb`` and the like: its digest and size, its flags from ``--flags`` or the
flags file a runtime keeps beside it, the entry and namespace from the directories around it
where they are a layout's); a bare key a layout claims (neuronxcc's ``MODULE_<graph>+<flags>``,
a 32-hex native key, neffcache's 64-hex key); an entry path a layout locates
(``trn2-lnc2/neuronxcc-<v>/MODULE_...``). And a report (:func:`missed_from_report`): ``neffcache
plan --json`` or ``neffcache run --report``, both a ``graphs`` list of
:class:`~neffcache.misses.wanted.WantedGraph` objects with a ``status`` (a bare list is read
too); the graphs whose status is a miss are explained.

What the command line says of the job (:class:`Known`: its toolchain, flags, tags) fills what
the input leaves unknown; what the input itself records wins. Every file here is untrusted:
a report or a flags file is read to a bound, only if it is a regular file (a FIFO would hang
the read), and parsed strictly; anything wrong is one :class:`~neffcache.errors.ConfigError`
naming the file and the field, and nothing is explained from a report that has one bad graph.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, BinaryIO

from neffcache.errors import ConfigError, InvalidKey
from neffcache.keys import safe_relpath
from neffcache.layouts import LAYOUTS, Layout
from neffcache.manifest import sha256_stream
from neffcache.misses.explain import GraphParts, Missed
from neffcache.misses.wanted import WantedGraph
from neffcache.toolchain import Toolchain

MAX_REPORT_BYTES = 256 << 20  # a plan of 100,000 graphs is ~60 MB
MAX_REPORT_GRAPHS = 200_000
MAX_FLAGS_FILE = 1 << 20
MAX_STATUS = 64


class ReportedStatus(StrEnum):
    """What a ``run --report`` says of a graph the job looked up and did not find."""

    MISS = "miss"  # looked up, not found; its compile did not finish (the job stopped)
    COMPILED = "compiled"  # not found, so the job compiled it
    FAILED = "failed"  # not found, and its compile failed


# The statuses of a report's graphs that are misses: plan's "miss" (nowhere) and "elsewhere"
# (only in a store the job is not pointed at, neffcache/misses/lookup.py), and run's above.
MISS_STATUSES = frozenset({"miss", "elsewhere", *ReportedStatus})


@dataclass(frozen=True)
class Known:
    """What the command line says of the job: its toolchain, flags and tags (None: not said)."""

    compiler_version: str | None = None
    target: str | None = None
    lnc: int | None = None
    flags: tuple[str, ...] | None = None
    tags: Mapping[str, str] = field(default_factory=dict)

    def fill(self, parts: GraphParts) -> GraphParts:
        """``parts`` with what they leave unknown taken from the command line."""
        return GraphParts(layout=parts.layout, key=parts.key,
                          compiler_version=parts.compiler_version or self.compiler_version,
                          target=parts.target or self.target, lnc=parts.lnc or self.lnc,
                          hlo_sha256=parts.hlo_sha256, hlo_size=parts.hlo_size,
                          flags=parts.flags if parts.flags is not None else self.flags,
                          tags={**self.tags, **parts.tags})

    @property
    def toolchain(self) -> Toolchain | None:
        if self.compiler_version and self.target and self.lnc:
            return Toolchain(self.compiler_version, self.target, self.lnc)
        return None


def _layout_claiming(key: str) -> Layout | None:
    return next((lay for lay in LAYOUTS.values() if lay.claims_key(key)), None)


def missed_from_key(key: str, known: Known) -> Missed:
    """A runtime key; where the job looked follows when the command line names the toolchain."""
    layout = _layout_claiming(key)
    if layout is None:
        raise ConfigError(f"{key!r} is not a key any layout names (see `neffcache why-miss --help`)")
    path = None
    if known.toolchain is not None:
        path = layout.plan_entry(layout.namespace_for(known.toolchain), key).path
    return Missed(path, known.fill(GraphParts(layout=layout.name, key=key)), origin=key)


def missed_from_entry_path(path: str, known: Known) -> Missed:
    """An entry path in a store: its namespace names the compiler (and neffcache's the target and LNC)."""
    try:
        clean = safe_relpath(path)
    except InvalidKey as exc:
        raise ConfigError(f"{path!r} is not an entry path: {exc}") from None
    for layout in LAYOUTS.values():
        found = layout.locate_entry(clean)
        if found is not None:
            ns = found.namespace
            parts = GraphParts(layout=layout.name, key=found.key, compiler_version=ns.compiler_version,
                               target=ns.target, lnc=ns.lnc)
            return Missed(found.path, known.fill(parts), origin=path)
    raise ConfigError(f"{path!r} is not an entry path of any layout (e.g. trn2-lnc2/neuronxcc-<version>/<key>)")


def missed_from_argument(value: str, known: Known) -> Missed:
    """An HLO file, a key or an entry path (see the module docstring)."""
    if os.path.isdir(value):  # an entry directory, the command run from the store's root
        return missed_from_entry_path(value, known)
    if os.path.lexists(value):
        return missed_from_hlo(Path(value), known)
    if "/" not in value and _layout_claiming(value) is not None:
        return missed_from_key(value, known)
    if "/" in value:
        return missed_from_entry_path(value, known)
    raise ConfigError(f"{value!r} is neither a file, a key nor an entry path (see `neffcache why-miss --help`)")


@contextlib.contextmanager
def _open_regular(path: Path, what: str) -> Iterator[BinaryIO]:
    """``path`` opened for reading if it is a regular file (opened first, then checked, so what
    is checked is what is read; O_NONBLOCK: opening a FIFO must not hang)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigError(f"{what} {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as stream:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{what} {path} is not a regular file")
        yield stream


def read_regular(path: Path, limit: int, what: str) -> bytes:
    """At most ``limit`` bytes of the regular file ``path``; ConfigError for anything else."""
    with _open_regular(path, what) as stream:
        data = stream.read(limit + 1)
    if len(data) > limit:
        raise ConfigError(f"{what} {path} is above the {limit} byte limit")
    return data


def _hlo_digest(path: Path) -> tuple[str, int]:
    with _open_regular(path, "HLO file") as stream:
        digest = sha256_stream(stream)
    return digest.sha256, digest.size


def _entry_around(path: Path) -> tuple[Layout, GraphParts] | None:
    """The layout and entry whose directory holds ``path`` (a store copied whole) or whose
    name the file's own name carries (a compile work directory's file)."""
    dirs = path.resolve().parent.parts
    for layout in LAYOUTS.values():
        for depth in (3, 2):  # <target dir>/<version dir>/<entry>, or <version dir>/<entry>
            found = layout.locate_entry("/".join(dirs[-depth:])) if len(dirs) >= depth else None
            if found is not None:
                ns = found.namespace
                return layout, GraphParts(layout=layout.name, key=found.key, compiler_version=ns.compiler_version,
                                          target=ns.target, lnc=ns.lnc)
        named = layout.entry_named(str(path))
        if named is not None:
            return layout, GraphParts(layout=layout.name, key=named)
    return None


def _flags_beside(path: Path, layout: Layout | None) -> tuple[tuple[str, ...] | None, str | None]:
    """(user flags, target) from the flags file the layout keeps beside the HLO, if any."""
    layouts = [layout] if layout is not None else list(LAYOUTS.values())
    for lay in layouts:
        for name in lay.flags_beside(path.name):
            beside = path.parent / name
            if beside.is_file():
                data = read_regular(beside, MAX_FLAGS_FILE, "flags file")
                try:
                    return tuple(lay.read_user_flags(name, data)), lay.flags_target(name, data)
                except ValueError as exc:  # FlagsFileError too
                    raise ConfigError(f"flags file {beside}: {exc}") from None
    return None, None


def missed_from_hlo(path: Path, known: Known) -> Missed:
    """An HLO file: its digest and size; its flags from ``--flags`` or the flags file beside it."""
    digest, size = _hlo_digest(path)
    around = _entry_around(path)
    layout = around[0] if around else next((lay for lay in LAYOUTS.values() if lay.flags_beside(path.name)), None)
    parts = around[1] if around else GraphParts(layout=layout.name if layout else None)
    flags, target = (known.flags, None) if known.flags is not None else _flags_beside(path, layout)
    parts = GraphParts(layout=parts.layout, key=parts.key, compiler_version=parts.compiler_version,
                       target=parts.target or target, lnc=parts.lnc, hlo_sha256=digest, hlo_size=size, flags=flags)
    filled = known.fill(parts)
    where = None
    if layout is not None and filled.key and filled.compiler_version and filled.target and filled.lnc:
        tc = Toolchain(filled.compiler_version, filled.target, filled.lnc)
        where = layout.plan_entry(layout.namespace_for(tc), filled.key).path
    return Missed(where, filled, origin=str(path))


def missed_from_wanted(graph: WantedGraph, status: str | None, origin: str) -> Missed:
    tc = graph.toolchain
    tags = dict(graph.tags)
    if graph.bucket is not None:
        tags.setdefault("bucket", graph.bucket)
    parts = GraphParts(layout=graph.layout, key=graph.key, compiler_version=tc.compiler_version if tc else None,
                       target=tc.target if tc else None, lnc=tc.lnc if tc else None, hlo_sha256=graph.hlo_sha256,
                       hlo_size=graph.hlo_size, flags=graph.flags, tags=tags)
    return Missed(graph.path, parts, origin=origin, status=status)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def parse_report(data: bytes, where: str) -> list[Missed]:
    """The missed graphs of a report's bytes (see the module docstring)."""
    try:
        value = json.loads(data, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ConfigError(f"report {where} is not JSON: {str(exc)[:200]}") from None
    graphs = value.get("graphs") if isinstance(value, dict) else value
    if not isinstance(graphs, list):
        raise ConfigError(f"report {where} has no list of graphs (expected `neffcache plan --json` output or a "
                          "`neffcache run --report` file)")
    if len(graphs) > MAX_REPORT_GRAPHS:
        raise ConfigError(f"report {where} lists {len(graphs)} graphs, above the {MAX_REPORT_GRAPHS} limit")
    out = []
    for number, item in enumerate(graphs, 1):
        status = item.get("status") if isinstance(item, dict) else None
        if status is not None and (not isinstance(status, str) or len(status) > MAX_STATUS):
            raise ConfigError(f"report {where}: graph {number}: 'status' must be a short string")
        if status is not None and status not in MISS_STATUSES:
            continue
        try:
            graph = WantedGraph.from_json(item)
        except ConfigError as exc:
            reason = str(exc).removeprefix("graph in the report: ")
            raise ConfigError(f"report {where}: graph {number}: {reason}") from None
        out.append(missed_from_wanted(graph, status, f"{where} graph {number}"))
    return out


def missed_from_report(path: Path) -> list[Missed]:
    return parse_report(read_regular(path, MAX_REPORT_BYTES, "report"), str(path))


def parse_flags(text: str) -> tuple[str, ...]:
    """``--flags`` as a shell would split it (as the runtimes split NEURON_CC_FLAGS)."""
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise ConfigError(f"--flags: {exc}") from None


def known_flags(values: Sequence[str]) -> tuple[str, ...] | None:
    return tuple(flag for text in values for flag in parse_flags(text)) if values else None
