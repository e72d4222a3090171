"""Reading cache hits, misses, compiles and failures from the runtimes' own log lines.

Neither runtime reports its cache activity any other way, so the lines of NEURON_FACTS.md §2
are the interface. Each pattern names what it found with a ``path`` group (layout A: a file
in the entry directory) or a ``key`` group (layout B), which :func:`entry_of` maps to the
entry's store path. Patterns are configurable (``--pattern KIND=REGEX``) because the native
backend's wording is not verified and log formats drift between releases.

What each kind counts: ``hit`` a graph served from the cache; ``miss`` a graph not found;
``compile`` a compiler run the runtime reported (layout A reports the call, so a failed
compile is also a compile; the native backend reports the stored NEFF); ``failure`` a failed
or skipped-as-failed graph.
"""

from __future__ import annotations

import posixpath
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from neffcache.entry import Namespace
from neffcache.errors import ConfigError
from neffcache.layouts import get_layout, locate

KINDS = ("hit", "miss", "compile", "failure")

DEFAULT_PATTERNS: tuple[tuple[str, str], ...] = (
    # libneuronxla (layout A)
    ("hit", r"Using a cached neff at (?P<path>\S+?\.neff)\b"),
    ("miss", r"Call compiler with cmd: .*?(?P<path>\S+\.hlo_module\.pb)\b"),
    ("compile", r"Call compiler with cmd: .*?(?P<path>\S+\.hlo_module\.pb)\b"),
    ("failure", r"Failed compilation with .*?(?P<path>[^\s'\",\[\]]+\.hlo_module\.pb)\b"),
    ("failure", r"Got a cached failed neff at (?P<path>\S+?\.neff)\b"),
    # TorchNeuron native (layout B; wording unverified upstream)
    ("hit", r"\[NEFF_CACHE\] Cache HIT for key: (?P<key>[0-9a-f]{64})"),
    ("miss", r"\[NEFF_CACHE\] Cache MISS for key: (?P<key>[0-9a-f]{64})"),
    ("compile", r"\[NEFF_CACHE\] Storing NEFF for key: (?P<key>[0-9a-f]{64})"),
    ("failure", r"\[NEFF_CACHE\] Compilation FAILED for key: (?P<key>[0-9a-f]{64})"),
)


@dataclass(frozen=True)
class Pattern:
    kind: str
    regex: re.Pattern[str]


def compile_patterns(extra: Iterable[str] = (), *, defaults: bool = True) -> list[Pattern]:
    """Default patterns plus ``KIND=REGEX`` strings (from ``--pattern``)."""
    patterns = [Pattern(k, re.compile(r)) for k, r in DEFAULT_PATTERNS] if defaults else []
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
    kind: str
    entry: str | None  # store path of the entry, when the line named one we manage
    line: str


@dataclass
class LogCounter:
    """Counts events in a stream of lines; thread-safe (stdout and stderr readers share one)."""

    patterns: Sequence[Pattern]
    root: str  # the local cache root the runtime writes to (absolute)
    namespaces: Sequence[Namespace] = ()
    events: list[LogEvent] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def feed(self, line: str) -> list[LogEvent]:
        found = []
        for pattern in self.patterns:
            match = pattern.regex.search(line)
            if match is None:
                continue
            groups = match.groupdict()
            entry = entry_of(self.root, self.namespaces, path=groups.get("path"), key=groups.get("key"))
            found.append(LogEvent(pattern.kind, entry, line.rstrip("\n")))
        if found:
            with self._lock:
                self.events.extend(found)
        return found

    def count(self, kind: str) -> int:
        with self._lock:
            return sum(1 for e in self.events if e.kind == kind)

    def entries(self, kind: str) -> list[str]:
        """Entries named by events of ``kind``, each once, in order."""
        with self._lock:
            return list(dict.fromkeys(e.entry for e in self.events if e.kind == kind and e.entry))

    def counts(self) -> dict[str, int]:
        return {kind: self.count(kind) for kind in KINDS}

    def failure_lines(self) -> list[LogEvent]:
        with self._lock:
            return [e for e in self.events if e.kind == "failure"]


def entry_of(root: str, namespaces: Sequence[Namespace], *, path: str | None, key: str | None) -> str | None:
    """The store path of the entry a log line names, or None when it is not under ``root``."""
    if key:
        for ns in namespaces:
            if ns.layout == "torchneuron":
                return get_layout("torchneuron").plan_entry(ns, key).path
        return None
    if not path:
        return None
    path = posixpath.normpath(path.removeprefix("file://"))
    prefix = root.rstrip("/") + "/"
    if not path.startswith(prefix):
        # A compile runs in a work directory: the file names the entry (model.MODULE_<g>+<f>...).
        for ns in namespaces:
            key = get_layout(ns.layout).entry_named(path)
            if key is not None:
                return get_layout(ns.layout).plan_entry(ns, key).path
        return None
    rel = path[len(prefix):]
    found = locate(posixpath.join(posixpath.dirname(rel), "model.neff")) or locate(rel)
    return found.path if found is not None else None
