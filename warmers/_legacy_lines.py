"""TRANSITIONAL, delete when layout A's ``parse_log_line`` lands (issue #11, part 2).

Until then layout A's parser returns None, and the log consumers would count nothing from
libneuronxla's lines. This reads them the way that parser is specified to (NEURON_FACTS.md §2):
``LogLine(kind, entry="MODULE_<g>+<f>", path=...)``, a compile-call line as ``compile``. It is
used only while the layout has no parser of its own (:func:`neffcache.warmers.logscan._parser`),
so the day the real one is merged this module is dead code: remove it and its one import.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from neffcache.layouts import LogLine

_MODULE = r"MODULE_[^/\s'\",\[\]+]+\+[0-9a-f]{8}"
_PATH = r"(?P<path>[^\s'\",\[\]]*?(?P<module>" + _MODULE + r")[^\s'\",\[\]]*?\.(?:hlo_module\.pb|hlo\.pb|neff))"
_LINES = (
    ("hit", re.compile(r"Using a cached neff at " + _PATH)),
    ("compile", re.compile(r"Call compiler with cmd: .*?" + _PATH)),
    ("success", re.compile(r"Compilation Successfully Completed for " + _PATH)),
    ("failure", re.compile(r"Failed compilation with .*?" + _PATH)),
    ("failure", re.compile(r"Compilation failed for " + _PATH)),
    ("failure", re.compile(r"Got a cached failed neff at " + _PATH)),
)


def parse_neuronxcc_line(line: str) -> LogLine | None:
    for kind, regex in _LINES:
        match = regex.search(line)
        if match is not None:
            path = match.group("path")
            return LogLine(kind, entry=match.group("module"), path=path if path.startswith("/") else None)
    return None


def legacy_parsers() -> dict[str, Callable[[str], LogLine | None]]:
    return {"neuronxcc": parse_neuronxcc_line}
