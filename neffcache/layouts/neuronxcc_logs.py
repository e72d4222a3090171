"""libneuronxla's log lines and the entry names they print (neuronxcc; docs/runtimes.md,
"neuronxcc"): what :class:`~neffcache.layouts.neuronxcc.NeuronxccLayout` reads from a job's
output, and from the failure log (``model.log``) it writes in the same words. Apart from the
layout's cache files because they are a separate fact of the runtime: what it prints, not
what it stores.
"""

from __future__ import annotations

import ast
import re

from neffcache.layouts.records import FailureLog, LogLine

# The runtime's log lines (docs/runtimes.md, "neuronxcc"). An entry is named by the MODULE_<g>+<f> in a
# path: a cache path (.../MODULE_<g>+<f>/model.neff) or a work-directory file name
# (/tmp/<user>/neuroncc_compile_workdir/<uuid>/model.MODULE_<g>+<f>.hlo_module.pb; NxD:
# /tmp/nxd_model/<model>/_tp0_bk0/...; before 2024 the command was a Python list and the
# file .hlo.pb).
_MODULE = r"MODULE_[0-9A-Za-z_]+\+[0-9A-Za-z]+"
_ENTRY_RE = re.compile(r"(?:^|[/.])(" + _MODULE + r")(?=[/.])")
_PATH = r"[^\s'\",\[\]]+"
HLO_FILE_RE = re.compile(r"\.(?:hlo_module|hlo)\.pb$")
_WORKFILE_RE = re.compile(r"(?:^|/)model\.(" + _MODULE + r")\.(?:hlo_module\.pb|hlo\.pb|neff)$")
_LOG_RES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("hit", re.compile(r"Using a cached neff at (?P<path>\S+?/model\.neff)(?=\.?(?:\s|$))")),
    ("compile", re.compile(r"Call compiler with cmd: .*?(?P<path>" + _PATH
                           + r"\.(?:hlo_module|hlo)\.pb)(?=[\s'\",\]]|$)")),
    ("success", re.compile(r"Compilation Successfully Completed for (?P<path>" + _PATH
                           + r"\.(?:hlo_module|hlo)\.pb)")),
    ("failure", re.compile(r"Compilation failed for (?P<path>" + _PATH
                           + r"\.(?:hlo_module|hlo)\.pb) after \d+ retr")),
    ("failure", re.compile(r"Failed compilation with .*?(?P<path>" + _PATH
                           + r"\.(?:hlo_module|hlo)\.pb)(?=[\s'\",\]]|$)")),
    ("failure", re.compile(r"Got a cached failed neff at (?P<path>\S+?/model\.neff)(?=\.?(?:\s|$))")),
)
FAILED_WITH = "Failed compilation with "  # how libneuronxla's failure log begins
_CHEAP = ("Using a cached neff", "Call compiler with", "Compilation Successfully", "Compilation failed for",
          "Failed compilation with", "Got a cached failed neff")


def entry_of_path(path: str) -> str | None:
    """The ``MODULE_<g>+<f>`` a printed path names (entry directory or work-directory file)."""
    found = _ENTRY_RE.findall(path)
    return found[-1] if found else None


def entry_named(path: str) -> str | None:
    """The entry a compile work-directory file names wherever it lies; a cache path
    (.../MODULE_<g>+<f>/model.neff) outside the root is another cache's entry."""
    match = _WORKFILE_RE.search(path)
    return match.group(1) if match else None


def parse_log_line(line: str) -> LogLine | None:
    """One libneuronxla line: ``hit``, ``compile`` (the compiler call: also a miss, which
    ``NeuronxccLayout.parse_log_lines`` spells out), ``success``, or ``failure``.

    A failed compile prints two failure lines (``Failed compilation with [...]`` per attempt,
    then ``Compilation failed for ... after N retries.``) and a cached one a third kind (``Got
    a cached failed neff``): count failures per entry, not per line.
    """
    if not any(cheap in line for cheap in _CHEAP):
        return None
    for kind, regex in _LOG_RES:
        match = regex.search(line)
        if match is not None:
            path = match.group("path")
            return LogLine(kind, entry=entry_of_path(path), path=path)
    return None


def read_failure_log(data: bytes) -> FailureLog:
    """libneuronxla writes ``Failed compilation with [<the command as a Python list>]:
    <stderr>`` into ``model.log`` (docs/runtimes.md, "neuronxcc"): the command (what the compiler
    got, flags and all) and the compiler's text. A log of another form is the text as it is."""
    text = data.decode(errors="replace")
    if not text.startswith(FAILED_WITH):
        return FailureLog(None, text)
    start = len(FAILED_WITH)
    # The list's end is the first "]" after which the prefix is a list of strings (a path may
    # hold "]"); bounded, so a crafted log costs little.
    for end in [m.start() for m in re.finditer(r"\]", text[start:start + 65536])][:200]:
        try:
            value = ast.literal_eval(text[start:start + end + 1])
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            rest = text[start + end + 1:]
            return FailureLog(tuple(value), rest[1:].lstrip(" ") if rest.startswith(":") else rest)
    return FailureLog(None, text)
