"""Counting cache hits, misses, compiles and failures from the runtimes' own log lines.

Neither runtime reports its cache activity any other way, so its log lines are the interface.
What a line says is a runtime fact and lives in the runtime's layout
(:meth:`~neffcache.layouts.Layout.parse_log_line`, docs/runtimes.md); this module asks every
layout, maps what they found to entries, and counts. Extra patterns (``--pattern KIND=REGEX``)
cover wording that drifts between releases; a pattern names what it found with a ``path``
group (a file in the cache), an ``entry`` group (the entry's name in its namespace) or a
``key`` group (a runtime key that names no file).

How a line becomes an entry (a store path under the run's root):

- a cache path under the root (a hit's ``.../MODULE_<g>+<f>/model.neff``): the layout that
  locates it;
- an entry name (neuronxcc's ``MODULE_<g>+<f>``, also read from compiler work-directory paths
  outside the cache) in the run's namespace of that layout;
- a key that is no file name (TorchNeuron's readable op key): no entry, counted per namespace.

What each kind counts: ``hit`` a graph served from the cache; ``miss`` a graph not found (a
compile-call line is a miss too); ``compile`` a compiler run (a line saying a compile ended
and was stored counts as one if its start was not seen); ``failure`` a failed compile, or a
cached failure skipped (one per graph and attempt: two lines about one failure count once).
Compile seconds per entry run from its compile-call line to its success or failure line, by
the time the lines were read.

A runtime whose lines cannot say hit or miss (TorchNeuron's come from an in-process dictionary
in front of the disk cache) reports ``lookup`` (it looked a graph up: the disk served it, or it
compiled it), ``reuse`` (the process had it already) and ``stored``: none of them is counted as
a hit, a miss or a compile here; the caller counts those from what the run added to the cache
(:mod:`.growth`). A lookup whose key a later error line names is where the runtime raised.
"""

from __future__ import annotations

import posixpath
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from neffcache.entry import Namespace
from neffcache.errors import ConfigError
from neffcache.layouts import LAYOUTS, LogLine, get_layout, locate

KINDS = ("hit", "miss", "compile", "failure")
LOOKUP_KINDS = ("lookup", "reuse", "stored")  # lines of a runtime that cannot say hit or miss
_LINE_KINDS = (*KINDS, "success", *LOOKUP_KINDS)
_RAISED = "Error"  # where a runtime without failure lines raised: RuntimeError, ValueError...
_GROUPS = ("path", "entry", "key")


@dataclass(frozen=True)
class Pattern:
    """A way to read lines: a layout's own parser, or a user's ``KIND=REGEX``."""

    kind: str | None  # None: the layout's parser decides
    regex: re.Pattern[str] | None = None
    layout: str | None = None  # the layout whose parser reads, or whose namespace a regex means

    def read(self, line: str) -> LogLine | None:
        if self.regex is None:
            assert self.layout is not None
            return _parser(self.layout)(line)
        match = self.regex.search(line)
        if match is None:
            return None
        groups = match.groupdict()
        assert self.kind is not None
        return LogLine(self.kind, **{g: groups.get(g) for g in _GROUPS})


_Parse = Callable[[str], LogLine | None]


def _parser(name: str) -> _Parse:
    return get_layout(name).parse_log_line


def compile_patterns(extra: Iterable[str] = (), *, defaults: bool = True) -> list[Pattern]:
    """Every layout's own lines (unless ``defaults`` is off) plus ``KIND=REGEX`` strings."""
    patterns = [Pattern(None, layout=name) for name in LAYOUTS] if defaults else []
    for spec in extra:
        kind, sep, regex = spec.partition("=")
        if not sep or kind not in KINDS:
            raise ConfigError(f"--pattern takes KIND=REGEX with KIND one of {', '.join(KINDS)}, not {spec!r}")
        try:
            patterns.append(Pattern(kind, re.compile(regex)))
        except re.error as exc:
            raise ConfigError(f"--pattern {spec!r}: not a valid regex: {exc}") from None
    return patterns


@dataclass(frozen=True)
class LogEvent:
    kind: str  # hit, miss, compile, success, failure
    entry: str | None  # store path of the entry, when the line named one we manage
    line: str
    namespace: str | None = None  # the run's namespace the line was counted in, when known
    key: str | None = None  # a runtime key that names no file (torchneuron's op key)
    at: float = 0.0  # time.monotonic() when the line was read
    implied: bool = False  # not a line of its own: what another line means (a compile is a miss)


@dataclass
class LogCounter:
    """Counts events in a stream of lines; thread-safe (stdout and stderr readers share one)."""

    patterns: Sequence[Pattern]
    root: str  # the local cache root the runtime writes to (absolute)
    namespaces: Sequence[Namespace] = ()
    events: list[LogEvent] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _last: dict[object, LogEvent] = field(default_factory=dict, repr=False)  # per graph: its last event
    _started: dict[object, float] = field(default_factory=dict, repr=False)
    _seconds: dict[str, float] = field(default_factory=dict, repr=False)
    _pending: dict[object, LogEvent] = field(default_factory=dict, repr=False)  # lookups, nothing after
    _raised: set[object] = field(default_factory=set, repr=False)  # lookups a later error line names

    def feed(self, line: str, at: float | None = None) -> list[LogEvent]:
        text = line.rstrip("\n")
        now = time.monotonic() if at is None else at
        found: list[LogEvent] = []
        with self._lock:
            for pattern in self.patterns:
                parsed = pattern.read(text)
                if parsed is None or parsed.kind not in _LINE_KINDS:
                    continue
                found.extend(self._events(pattern.layout, parsed, text, now))
            self.events.extend(found)
            if not found and self._pending and _RAISED in text:
                # Only error lines are searched, so a chatty job costs no more than before.
                self._raised.update(ident for ident, e in self._pending.items() if e.key and e.key in text)
        return found

    def _events(self, layout: str | None, parsed: LogLine, text: str, now: float) -> list[LogEvent]:
        entry, ns = self.entry_for(parsed, layout)
        ident: object = entry or (layout, ns, parsed.entry or parsed.key or parsed.path)
        last = self._last.get(ident)
        kind = parsed.kind
        out: list[LogEvent] = []

        def add(k: str, implied: bool = False) -> None:
            out.append(LogEvent(k, entry, text, ns, parsed.key, now, implied))

        if kind in LOOKUP_KINDS:
            add(kind)
            if kind == "lookup":
                self._pending[ident] = out[-1]
            elif kind == "stored":
                self._pending.pop(ident, None)
            if kind != "reuse":  # a later step's reuse says nothing about the lookup before it
                self._last[ident] = out[-1]
            return out
        if kind == "failure" and last is not None and last.kind == "failure":
            return []  # the second line about the same failure ("Failed compilation" + "after N retries")
        if kind == "compile" and (last is None or last.kind != "miss"):
            add("miss", implied=True)
        if kind == "success" and (last is None or last.kind not in ("compile",)):
            add("compile", implied=True)
        add(kind)
        if kind == "compile":
            self._started[ident] = now
        elif kind in ("success", "failure"):
            begun = self._started.pop(ident, None)
            if begun is not None and entry is not None:
                self._seconds[entry] = round(now - begun, 3)
        self._last[ident] = out[-1]
        return out

    def entry_for(self, parsed: LogLine, layout: str | None) -> tuple[str | None, str | None]:
        """(store path of the entry, namespace path) a parsed line names in this run."""
        if parsed.path:
            path = posixpath.normpath(parsed.path.removeprefix("file://"))
            prefix = self.root.rstrip("/") + "/"
            if path.startswith(prefix):
                found = locate(path[len(prefix):])
                if found is not None:
                    return found.path, found.namespace.path
        ns = self._namespace(layout)
        if parsed.entry and ns is not None:
            lay = get_layout(ns.layout)
            plan = lay.plan_entry(ns, parsed.entry)
            found = lay.locate(posixpath.join(plan.base, plan.marker_name)) if plan.base else None
            if found is not None and found.path == plan.path and found.key == parsed.entry:
                return plan.path, ns.path
        return None, ns.path if ns is not None else None

    def _namespace(self, layout: str | None) -> Namespace | None:
        if layout is None:
            return None
        return next((ns for ns in self.namespaces if ns.layout == layout), None)

    def count(self, kind: str) -> int:
        with self._lock:
            return sum(1 for e in self.events if e.kind == kind)

    def entries(self, kind: str) -> list[str]:
        """Entries named by events of ``kind``, each once, in order."""
        with self._lock:
            return list(dict.fromkeys(e.entry for e in self.events if e.kind == kind and e.entry))

    def counts(self) -> dict[str, int]:
        return {kind: self.count(kind) for kind in KINDS}

    def by_namespace(self) -> dict[str, dict[str, int]]:
        """Counts per namespace path of the run (lines that name no entry included)."""
        out: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(KINDS, 0))
        with self._lock:
            for e in self.events:
                if e.namespace is not None and e.kind in KINDS:
                    out[e.namespace][e.kind] += 1
        return dict(out)

    def unnamed(self, kind: str) -> dict[str, int]:
        """Namespace path -> events of ``kind`` that named no entry (torchneuron's op keys)."""
        out: dict[str, int] = defaultdict(int)
        with self._lock:
            for e in self.events:
                if e.kind == kind and e.entry is None and e.namespace is not None:
                    out[e.namespace] += 1
        return dict(out)

    def compile_seconds(self, entry: str) -> float | None:
        """Seconds from the entry's compile-call line to its success or failure line."""
        with self._lock:
            return self._seconds.get(entry)

    def compiling(self) -> list[LogEvent]:
        """The graphs whose last line was a miss: the runtime neither stored nor failed nor
        started compiling them when its output ended (it raised on them, or was stopped); and
        the lookups of a runtime without miss lines that a later error line names.

        A compile-call line is not counted here: older runtimes log no success line, so a
        compile call with nothing after it is as likely a success. Nor is a lookup no error
        names: TorchNeuron prints one for every graph it serves from the disk too."""
        with self._lock:
            return [e for ident, e in self._last.items()
                    if e.kind == "miss" or (e.kind == "lookup" and ident in self._raised)]

    def lookups(self) -> dict[str, int]:
        """Namespace path -> graphs a runtime without miss lines looked up (distinct keys)."""
        out: dict[str, int] = defaultdict(int)
        with self._lock:
            for e in self._last.values():
                if e.kind in ("lookup", "stored") and e.namespace is not None:
                    out[e.namespace] += 1
        return dict(out)

    def reused(self) -> int:
        """Lookups the process answered from its own memory (never a cache hit)."""
        return self.count("reuse")

    def failure_lines(self) -> list[LogEvent]:
        with self._lock:
            return [e for e in self.events if e.kind == "failure"]

    def line_naming(self, text: str) -> LogEvent | None:
        """The latest compile-call event whose line contains ``text`` (a compiler's input path)."""
        with self._lock:
            return next((e for e in reversed(self.events) if e.kind == "compile" and not e.implied
                         and text in e.line), None)
