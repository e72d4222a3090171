"""Why a compile failed: the graph (a compiler error) or the host (the environment).

A failed compile that the runtime caches (layout A's failure log) is skipped by every later
run until someone retries it (docs/runtimes.md, "Layout A"). That is right when the compiler
rejected the graph: it would reject it again. It is wrong when the host failed the compile
(Ctrl-C, an OOM kill, a timeout, a compiler that is not installed or cannot load a shared
library, a full disk): the graph is fine and the next run should compile it. So every failed
compile gets a :class:`Verdict`:

- from what neffcache's own compile pool saw (:func:`classify_exit`: the exit status, whether
  it timed out, whether the compiler could be started at all, and its output), or
- from text alone (:func:`classify_text`: a failure log or an error event, where the exit
  status is known only if the text says it).

The argument, rule by rule (the first that applies decides):

1. the compiler could not be started (``ENOENT``: not installed; anything else: it cannot
   run here) — environment, nothing about the graph was learned;
2. neffcache stopped it past ``--compile-timeout`` — environment: a loaded host or a low limit,
   and the next run may have more time (a graph that always times out costs a timeout per run,
   never a poisoned cache);
3. its output names a host resource — a shared library the loader cannot find, no space on
   the device or quota, memory (``MemoryError``, ``std::bad_alloc``, ``Cannot allocate memory``)
   — environment, whatever the exit status (an uncaught ``bad_alloc`` ends in SIGABRT);
4. it died by a signal. A signal the process raises on its own fault (SIGSEGV, SIGABRT,
   SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS) is the compiler crashing on this graph: a compiler
   error, and its signature names the signal. Any other signal was sent from outside (SIGKILL
   from the OOM killer or an operator, SIGTERM/SIGINT from a shutdown or Ctrl-C, SIGXCPU and
   SIGXFSZ from resource limits): environment. Exit statuses ``128+N`` (a shell between us and
   the compiler) read as signal N;
5. exit 127 is the loader or the shell not finding the program, 126 a program that cannot be
   executed; a Python compiler that dies importing its own modules (``ModuleNotFoundError``,
   ``ImportError``) is a broken install: all environment;
6. anything else that failed is the compiler's own error: cached, with its signature.

An entry whose stored bytes no longer match its manifest (``neffcache verify``'s error event) is
no compile failure at all: class **storage** (a disk, a copy, a tier went bad), never the
compiler team's. Verify's note says so; its older events are known by their own words.

Only rule 6 (and the crashes of rule 4) may leave a cached failure. :func:`signature` names
a compiler error across hosts and paths: the same error text with other paths, numbers,
hashes and temp names gets the same signature.

A value module: pure functions of their arguments, no I/O, so the index server (which may
import only values) classifies and groups error events with the same rules.
"""

from __future__ import annotations

import enum
import hashlib
import re
import signal
from dataclasses import dataclass


class FailureClass(enum.StrEnum):
    """Who failed a compile."""

    COMPILER = "compiler"  # the compiler rejected (or crashed on) the graph: cached, like the runtime does
    ENVIRONMENT = "environment"  # the host failed it: retried, never cached
    STORAGE = "storage"  # a stored entry's bytes went bad (verify): no compile failed


class FailureCause(enum.StrEnum):
    """What exactly failed; each cause belongs to one :class:`FailureClass`."""

    COMPILER_ERROR = "compiler-error"
    COMPILER_CRASH = "compiler-crash"  # a fault signal (SIGSEGV, SIGABRT...) on this graph
    KILLED = "killed"  # SIGKILL (the OOM killer's signal), a resource-limit signal
    INTERRUPTED = "interrupted"  # SIGTERM, SIGINT (Ctrl-C), SIGHUP
    OUT_OF_MEMORY = "out-of-memory"
    TIMEOUT = "timeout"
    COMPILER_MISSING = "compiler-missing"
    START_FAILURE = "start-failure"  # the compiler cannot run here (permissions, broken install)
    MISSING_LIBRARY = "missing-library"
    DISK_FULL = "disk-full"
    CORRUPT_ENTRY = "corrupt-entry"  # a stored entry's files do not match its manifest (verify)

    @property
    def failure_class(self) -> FailureClass:
        if self is FailureCause.CORRUPT_ENTRY:
            return FailureClass.STORAGE
        return FailureClass.COMPILER if self in _COMPILER_CAUSES else FailureClass.ENVIRONMENT


_COMPILER_CAUSES = frozenset({FailureCause.COMPILER_ERROR, FailureCause.COMPILER_CRASH})
# The words of verify's error events from before its note: "corrupt: <file> does not match its
# manifest sha256 (...)" or "corrupt: <file> is missing" (neffcache/operations/verify.py).
_VERIFY_PREFIX = "corrupt: "
_VERIFY_WORDS = ("does not match its manifest", " is missing")


@dataclass(frozen=True)
class Verdict:
    """A failed compile's cause and one line saying why (``detail``, for people)."""

    cause: FailureCause
    detail: str = ""

    @property
    def is_environment(self) -> bool:
        """The host failed the compile, not the graph: retried, never cached."""
        return self.cause.failure_class is FailureClass.ENVIRONMENT

    @property
    def failure_class(self) -> FailureClass:
        return self.cause.failure_class


# Signals a process raises on its own fault: the compiler crashed on the graph.
_FAULT_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL,
                            signal.SIGTRAP, signal.SIGSYS})
_STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})
# The rules on text are literal phrases (found by ``str.find``: a scan of an 8 KiB log costs
# microseconds, where regex alternations cost milliseconds), some with a check of their line.
# Host resources named in the output, whatever the exit status (rule 3); strerror(3) texts, case
# and all: a compiler's own words about device memory are not these.
_Rule = tuple[FailureCause, tuple[str, ...], "re.Pattern[str] | None"]
_RESOURCE_RULES: tuple[_Rule, ...] = (
    (FailureCause.MISSING_LIBRARY, ("error while loading shared libraries", "cannot open shared object file"), None),
    (FailureCause.DISK_FULL, ("No space left on device", "ENOSPC", "[Errno 28]", "Disk quota exceeded", "EDQUOT",
                              "[Errno 122]"), None),
    (FailureCause.OUT_OF_MEMORY, ("MemoryError", "std::bad_alloc", "Cannot allocate memory", "[Errno 12]",
                                  "Out of memory: Kill", "oom-kill"), None),
)
# A compiler that cannot start (rule 5).
_START_RULES: tuple[_Rule, ...] = (
    (FailureCause.COMPILER_MISSING, ("neuronx-cc: not found", "neuronx-cc: command not found", "command not found",
                                     "could not run neuronx-cc"), None),
    (FailureCause.COMPILER_MISSING, ("not found",), re.compile(r"\bexec: \S+: not found")),
    (FailureCause.COMPILER_MISSING, ("No such file or directory: '",), re.compile(r"neuronx-cc'")),
    (FailureCause.START_FAILURE, ("ModuleNotFoundError", "Exec format error", "cannot execute"), None),
    (FailureCause.START_FAILURE, ("ImportError",), re.compile(r"^ImportError\b")),
    (FailureCause.START_FAILURE, ("Permission denied: '",), re.compile(r"neuronx-cc'")),
)
_TEXT_STATUS = (
    re.compile(r"(?:exit status|exited|returned non-zero exit status)\s+(?P<n>-?\d+)"),
    re.compile(r"died with <Signals\.(?P<sig>SIG[A-Z0-9]+): \d+>"),
    re.compile(r"killed by (?P<sig>SIG[A-Z0-9]+)"),
)
_TEXT_SIGNALS = (  # (phrase, its line as a shell or Python prints it, the signal)
    ("Killed", re.compile(r"^\s*Killed\s*$", re.M), signal.SIGKILL),
    ("Terminated", re.compile(r"^\s*Terminated\s*$", re.M), signal.SIGTERM),
    ("KeyboardInterrupt", re.compile(r"\bKeyboardInterrupt\b"), signal.SIGINT),
)
_TIMED_OUT = re.compile(r"\btimed out\b", re.I)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _from_signal(number: int) -> Verdict:
    name = _signal_name(number)
    if number in _FAULT_SIGNALS:
        return Verdict(FailureCause.COMPILER_CRASH, f"neuronx-cc crashed ({name})")
    if number in _STOP_SIGNALS:
        return Verdict(FailureCause.INTERRUPTED, f"neuronx-cc was stopped by {name}")
    why = " (the kernel's OOM killer sends it)" if number == signal.SIGKILL else ""
    return Verdict(FailureCause.KILLED, f"neuronx-cc was killed by {name}{why}")


def _from_status(status: int) -> Verdict | None:
    """What an exit status alone says (rules 4 and 5), or None: a plain non-zero exit."""
    if status < 0:
        return _from_signal(-status)
    if 128 < status < 160:  # a shell reports a signalled child as 128+N
        number = status - 128
        if number in _FAULT_SIGNALS or number in _STOP_SIGNALS or number in (signal.SIGKILL, signal.SIGPIPE,
                                                                            signal.SIGXCPU, signal.SIGXFSZ):
            return _from_signal(number)
    if status == 127:
        return Verdict(FailureCause.COMPILER_MISSING, "exit 127: the compiler (or a program it runs) was not found")
    if status == 126:
        return Verdict(FailureCause.START_FAILURE, "exit 126: the compiler cannot be executed")
    return None


def _line_at(text: str, index: int) -> str:
    end = text.find("\n", index)
    return text[text.rfind("\n", 0, index) + 1:end if end >= 0 else len(text)].strip()


def _first_match(rules: tuple[_Rule, ...], text: str) -> Verdict | None:
    for cause, phrases, check in rules:
        for phrase in phrases:
            index = text.find(phrase)
            for _ in range(8):  # a few occurrences, when the line must pass a check
                if index < 0:
                    break
                line = _line_at(text, index)
                if check is None or check.search(line):
                    return Verdict(cause, line[:300])
                index = text.find(phrase, index + len(phrase))
    return None


def classify_exit(status: int | None, output: str, *, timed_out: bool = False, start_errno: int | None = None,
                  start_error: str = "") -> Verdict:
    """The verdict on one compile neffcache ran: ``status`` is the exit status (negative: the
    signal that killed it; None when it never ended), ``output`` what it printed, ``timed_out``
    whether neffcache stopped it past its timeout, ``start_errno`` the errno when it could not be
    started at all (``start_error`` the message). Rules 1-6 of the module docstring, in order."""
    if start_errno is not None:
        cause = FailureCause.COMPILER_MISSING if start_errno == 2 else FailureCause.START_FAILURE
        return Verdict(cause, f"cannot start neuronx-cc: {start_error or f'errno {start_errno}'}")
    if timed_out or status is None:
        return Verdict(FailureCause.TIMEOUT, "neuronx-cc ran past the compile timeout and was stopped")
    found = _first_match(_RESOURCE_RULES, output)
    if found is not None:
        return found
    by_status = _from_status(status)
    if by_status is not None:
        return by_status
    return _first_match(_START_RULES, output) or Verdict(FailureCause.COMPILER_ERROR,
                                                        f"neuronx-cc exited {status}")


def classify_text(text: str) -> Verdict:
    """The verdict a failure's text supports when the exit status is not known for sure (a
    runtime's failure log, an error event): neffcache's own note if the text carries one
    (:func:`note`), else the rules of :func:`classify_exit` applied to what the text says
    (an exit status or signal it mentions, the resource and start-up messages)."""
    noted = read_note(text)
    if noted is not None:
        return noted
    if text.startswith(_VERIFY_PREFIX) and any(words in text for words in _VERIFY_WORDS):
        return Verdict(FailureCause.CORRUPT_ENTRY, _line_at(text, 0)[:300])
    found = _first_match(_RESOURCE_RULES, text)
    if found is not None:
        return found
    for regex in _TEXT_STATUS if ("exit" in text or "died with" in text or "killed by" in text) else ():
        match = regex.search(text)
        if match is None:
            continue
        if match.groupdict().get("n") is not None:
            verdict = _from_status(int(match.group("n")))
        else:
            number = getattr(signal.Signals, match.group("sig"), None)
            verdict = _from_signal(int(number)) if number is not None else None
        if verdict is not None:
            return verdict
    for phrase, regex, sig in _TEXT_SIGNALS:
        if phrase in text and regex.search(text):
            return _from_signal(int(sig))
    started = _first_match(_START_RULES, text)
    if started is not None:
        return started
    if "timed out" in text.lower() and _TIMED_OUT.search(text):
        return Verdict(FailureCause.TIMEOUT, "the compile timed out")
    return Verdict(FailureCause.COMPILER_ERROR, "the compiler reported an error")


# -- neffcache's note in a failure's text ------------------------------------------------------
NOTE_PREFIX = "neffcache-failure:"
_NOTE_RE = re.compile(r"^neffcache-failure: (?P<cause>[a-z-]+) \((?:compiler|environment|storage)\)"
                      r"(?: signature [0-9a-f]+)?: (?P<detail>.*)$", re.M)


def note(verdict: Verdict, sig: str | None = None) -> str:
    """The line neffcache adds to a failure's text (failure log, error event), so whoever reads
    the text later, a scan or the index server, reads the verdict neffcache had the facts for."""
    signed = f" signature {sig}" if sig else ""
    detail = " ".join(verdict.detail.split())  # one line, whatever the compiler printed
    return f"{NOTE_PREFIX} {verdict.cause} ({verdict.failure_class}){signed}: {detail}"


def read_note(text: str) -> Verdict | None:
    """The verdict in neffcache's note (:func:`note`), or None when the text has none."""
    if NOTE_PREFIX not in text:
        return None
    for match in _NOTE_RE.finditer(text):
        try:
            return Verdict(FailureCause(match.group("cause")), match.group("detail").strip())
        except ValueError:
            continue  # a note from a newer neffcache, or forged: the rules decide instead
    return None


# -- signatures ---------------------------------------------------------------------------------
SIGNATURE_HEX = 16
_ERROR_WORDS = ("error", "fatal", "exception", "abort", "assert", "traceback", "segmentation", "killed",
                "not found", "cannot", "failed")
_MAX_LINES = 8
_NORMALISE: tuple[tuple[re.Pattern[str], str], ...] = (
    # A path: any token holding a slash (absolute, relative, a graph name like llama/b128/g0).
    (re.compile(r"[^\s'\"`=:,;()\[\]{}<>]*/[^\s'\"`=:,;()\[\]{}<>]*"), "<path>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I), "<uuid>"),
    (re.compile(r"\b(?:tmp|temp)[A-Za-z0-9_.-]{4,}", re.I), "<tmp>"),
    # Hex hashes and standalone numbers (sizes, line numbers, pids, timestamps) are one
    # placeholder: a hash that happens to be all digits, or a size that grows a digit, must not
    # change the signature. Error codes like NCC_E001 stay (their digits are part of a word).
    (re.compile(r"\b0x[0-9a-f]+\b", re.I), "<n>"),
    (re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,}\b", re.I), "<n>"),
    (re.compile(r"(?<![A-Za-z0-9_.])[-+]?\d+(?:\.\d+)*(?![A-Za-z0-9_])"), "<n>"),
    (re.compile(r"\s+"), " "),
)


def _lines_with_words(text: str) -> list[int]:
    """Where the lines holding an error word start, in order (``str.find`` over the lower-cased
    text: this runs for every event a window groups, and a loop over lines and words costs 50x)."""
    low = text.lower()
    if len(low) != len(text):  # a character whose lower case is longer: positions would not match
        offsets, at = [], 0
        for line in text.splitlines(keepends=True):
            if any(word in line.lower() for word in _ERROR_WORDS):
                offsets.append(at)
            at += len(line)
        return offsets
    starts: set[int] = set()
    for word in _ERROR_WORDS:
        index = low.find(word)
        while index >= 0:
            starts.add(low.rfind("\n", 0, index) + 1)
            end = low.find("\n", index)
            index = low.find(word, end) if end >= 0 else -1
    return sorted(starts)


def error_lines(text: str) -> list[str]:
    """The lines of a failure's text that say what went wrong: the error lines (at most eight,
    each once), else the last non-empty line. neffcache's own notes are not the compiler's
    words and are left out."""
    chosen: dict[str, None] = {}
    for start in _lines_with_words(text):
        end = text.find("\n", start)
        line = text[start:end if end >= 0 else len(text)].strip()
        if line and not line.startswith(NOTE_PREFIX):
            chosen.setdefault(line)
            if len(chosen) == _MAX_LINES:
                break
    if chosen:
        return list(chosen)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(NOTE_PREFIX)]
    return lines[-1:]


def normalise(line: str) -> str:
    """``line`` with what differs between two hosts hitting the same error replaced by a
    placeholder: paths, UUIDs, temp names, hex hashes and numbers.
    ``normalise("ERROR at /tmp/x/y.pb:12 (sha 9f86d081884c7d65)") == "ERROR at <path>:<n> (sha <n>)"``."""
    for regex, placeholder in _NORMALISE:
        line = regex.sub(placeholder, line)
    return line.strip()[:500]


def pattern(text: str, verdict: Verdict | None = None) -> str:
    """What a signature is computed from: for a compiler error, its normalised error lines
    (:func:`error_lines`, :func:`normalise`); for any other cause (a crash, every environment
    failure) the cause and its normalised detail, so a kill, a missing library or a timeout
    groups by what happened to the compile, whatever partial output it left and whoever wrote
    the record (a runtime's ``exit status -9`` and neffcache's note on a SIGKILL alike).
    ``verdict``: :func:`classify_text` of ``text``, when the caller has it already."""
    verdict = verdict or classify_text(text)
    if verdict.cause is not FailureCause.COMPILER_ERROR:
        return f"{verdict.cause}: {normalise(verdict.detail)}"
    lines = error_lines(text) or ["(no output)"]
    return "\n".join(dict.fromkeys(normalise(ln) for ln in lines))


def signature(text: str) -> str:
    """The signature of a failure's ``text`` (the compiler's output, a failure log, an error
    event's message): 16 hex digits of sha256 over :func:`pattern`. Two copies of the same
    error that differ only in paths, numbers, hashes and temp names get the same signature;
    neffcache's notes in the text do not change a compiler error's signature."""
    return digest(pattern(text))


def digest(normalised: str) -> str:
    """The signature of a :func:`pattern` (16 hex digits of its sha256)."""
    return hashlib.sha256(normalised.encode()).hexdigest()[:SIGNATURE_HEX]


def first_error(text: str) -> str:
    """The first line that says what went wrong, as written (for people), at most 300 characters."""
    lines = error_lines(text)
    return lines[0][:300] if lines else "(no output)"


def signed_text(verdict: Verdict, output: str) -> tuple[str, str]:
    """(signature, text) of a failure neffcache saw happen: the compiler's ``output`` followed
    by neffcache's note (:func:`note`) carrying the verdict and the signature. The signature is
    the one :func:`signature` gives the text later, whoever reads it back."""
    sig = signature(f"{output}\n{note(verdict)}")
    body = output.rstrip("\n")
    return sig, f"{body}\n{note(verdict, sig)}\n" if body else f"{note(verdict, sig)}\n"
