"""SIMULATED libneuronxla compile cache (neuronxcc, the torch-xla ``xla`` backend).

What a torch-xla run does with each graph, per docs/runtimes.md, "neuronxcc"::

    <root>/lock
    <root>/neuronxcc-<version>/MODULE_<graph_hash>+<flags_hash>/
        model.hlo_module.pb  compile_flags.json | compile_flags.txt
        model.neff  model.done (not in the text form) | model.log
        model.hlo_module.pb.lock   (while a process compiles it)

``graph_hash`` is the decimal uint64 of the first 8 bytes of sha256(HLO) (big-endian; the real
formula is not public). ``flags_hash`` is md5 of the bytes of the flags file, first 8 hex. The
file's form follows the libneuronxla *release* (the real one: SDK 2.19.0 and 2.19.1 shipped the
same compiler 2.14.227.0 with two forms), which this simulation takes from
``NEFFSIM_FLAGS_FORM``: ``text`` (``compile_flags.txt`` holding the flag string, and no
``model.done``: the NEFF commits the entry), ``list`` (``compile_flags.json`` holding
``json.dumps(flags)``) or ``target`` (``json.dumps(["--target=<t>", *flags])``). Unset, it is
the form the observed releases shipped with the compiler: text up to 2.13, list from 2.14 up to
2.16.344, target from 2.16.345.0. With the target form the target is in the key; before, a
root shared by trn1 and trn2 hosts mixes their NEFFs, as with the real runtime.

A miss compiles in a work directory, ``$TMPDIR/<user>/neuroncc_compile_workdir/<uuid>/``
(``/tmp/<user>/...`` on a real host), on ``model.MODULE_<g>+<f>.hlo_module.pb``; the NEFF is
then copied into the entry and ``model.done`` written after it. The entry's
``model.hlo_module.pb.lock`` is held (created exclusively) for the whole compile; another
process that finds it waits ("Another process must be compiling ...").

Written independently of ``neffcache.layouts`` on purpose: a second implementation of the same
facts is what makes the tests that compare them honest.
"""

from __future__ import annotations

import errno
import getpass
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from neffcache.testing._files import atomic_write, create_exclusive
from neffcache.testing._runtime import CompilerRunner, GraphOutcome, WorkloadLog, wait_for_unlock

HLO_FILE = "model.hlo_module.pb"
LOCK_FILE = HLO_FILE + ".lock"
RETRY_FLAG = "--retry_failed_compilation"


def graph_hash(hlo: bytes) -> str:
    return str(int.from_bytes(hashlib.sha256(hlo).digest()[:8], "big"))


FORMS = ("text", "list", "target")
FORM_ENV = "NEFFSIM_FLAGS_FORM"


def _numbers(version: str) -> tuple[int, ...]:
    parts = version.split("+", 1)[0].split(".")
    if not all(p.isdigit() for p in parts):
        return (99,)
    return tuple(int(p) for p in parts)


def release_form(version: str) -> str:
    """The flags form the observed libneuronxla releases shipped beside compiler ``version``
    (2.14.227.0 was shipped with text and with list: list, the later release's)."""
    numbers = _numbers(version)
    if numbers < (2, 14):
        return "text"
    if numbers < (2, 16, 345):
        return "list"
    return "target"


def flags_form_for(version: str, environ: Mapping[str, str]) -> str:
    """The simulated release's form: ``NEFFSIM_FLAGS_FORM``, else :func:`release_form`."""
    chosen = environ.get(FORM_ENV, "").strip()
    if not chosen:
        return release_form(version)
    if chosen not in FORMS:
        raise ValueError(f"{FORM_ENV} must be one of {', '.join(FORMS)}, not {chosen!r}")
    return chosen


def flags_file_for(form: str, target: str, flags: Sequence[str]) -> tuple[str, bytes]:
    """(name, bytes) of the flags file a runtime of flags ``form`` writes."""
    if form == "text":
        return "compile_flags.txt", " ".join(flags).encode()
    if form == "list":
        return "compile_flags.json", json.dumps(list(flags)).encode()
    return "compile_flags.json", json.dumps([f"--target={target}", *flags]).encode()


def flags_hash(data: bytes) -> str:
    """The ``+<flags>`` suffix: md5 of the flags file's bytes."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()[:8]


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "user"


class XlaCache:
    """One workload's view of a neuronxcc root for one compiler version, target and LNC."""

    def __init__(
        self,
        root: Path,
        *,
        version: str,
        target: str,
        lnc: int,
        flags: Sequence[str],
        retry_failed: bool,
        log: WorkloadLog,
        runner: CompilerRunner,
        lock_timeout: float | None,
        lock_report_every: float,
        flags_form: str | None = None,
    ) -> None:
        self.root = root
        self.version_dir = root / f"neuronxcc-{version}"
        self.target = target
        self.lnc = lnc
        self.flags = list(flags)
        self.retry_failed = retry_failed
        self.log = log
        self.runner = runner
        self.lock_timeout = lock_timeout
        self.lock_report_every = lock_report_every
        self.version = version
        self.flags_form = flags_form or release_form(version)
        self.flags_name, self.flags_bytes = flags_file_for(self.flags_form, target, self.flags)
        # The text form's NEFF itself is the commit marker: no model.done.
        self.writes_done = self.flags_form != "text"
        self._flags_hash = flags_hash(self.flags_bytes)

    def open(self) -> None:
        """Create the root and touch ``<root>/lock`` as libneuronxla does on start-up."""
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            os.close(os.open(self.root / "lock", os.O_WRONLY | os.O_CREAT, 0o644))
        except OSError as exc:
            # The real runtime dies here on a read-only mount (errno 30); the simulation lets
            # such roots serve hits so that neffcache's read-only handling can be exercised.
            if exc.errno != errno.EROFS:
                raise

    def entry_dir(self, hlo: bytes) -> Path:
        return self.version_dir / f"MODULE_{graph_hash(hlo)}+{self._flags_hash}"

    def extract(self, hlo: bytes) -> GraphOutcome:
        """NEURON_EXTRACT_GRAPHS_ONLY: leave the HLO and flags (an EMPTY entry), compile nothing."""
        entry = self.entry_dir(hlo)
        entry.mkdir(parents=True, exist_ok=True)
        if self._is_done(entry):
            # Logged as in a normal run, so a warm-up can tell its extraction's hits.
            return self._cached_outcome(entry) or GraphOutcome.HIT
        self._write_inputs(entry, hlo)
        self.log.line(f"neffcache.testing.workload: extracted graph to {entry / HLO_FILE}")
        return GraphOutcome.EXTRACTED

    def lookup_or_compile(self, hlo: bytes) -> GraphOutcome:
        entry = self.entry_dir(hlo)
        entry.mkdir(parents=True, exist_ok=True)
        lock = entry / LOCK_FILE
        while True:
            outcome = self._cached_outcome(entry)
            if outcome is not None:
                return outcome
            if create_exclusive(lock):
                try:
                    # Someone may have finished between our look and our lock.
                    return self._cached_outcome(entry) or self._compile(entry, hlo)
                finally:
                    lock.unlink(missing_ok=True)
            if not wait_for_unlock(
                lock,
                timeout=self.lock_timeout,
                report_every=self.lock_report_every,
                report=lambda waited: self.log.wrapper(
                    "INFO",
                    f"Another process must be compiling {entry / HLO_FILE}, "
                    f"been waiting for {waited} seconds",
                ),
                stopping=self.runner.stopping,
            ):
                self.log.wrapper(
                    "ERROR", f"Gave up waiting for the lock {lock} after {self.lock_timeout} seconds"
                )
                return GraphOutcome.FAILED

    def _is_done(self, entry: Path) -> bool:
        # The text form writes compile_flags.txt and no model.done: its neff alone means success.
        neff = entry / "model.neff"
        return (entry / "model.done").exists() or (
            (entry / "compile_flags.txt").exists() and neff.exists()
        )

    def _cached_outcome(self, entry: Path) -> GraphOutcome | None:
        neff = entry / "model.neff"
        if self._is_done(entry):
            self.log.wrapper(
                "INFO",
                f"Using a cached neff at {neff.absolute()}. Exiting with a successfully compiled graph.",
            )
            return GraphOutcome.HIT
        if (entry / "model.log").exists() and not neff.exists() and not self.retry_failed:
            self.log.wrapper(
                "ERROR",
                f"Got a cached failed neff at {neff.absolute()}. Will skip compilation, "
                f"please set {RETRY_FLAG} for recompilation",
            )
            return GraphOutcome.FAILED
        return None

    def _write_inputs(self, entry: Path, hlo: bytes) -> None:
        if not (entry / HLO_FILE).exists():
            atomic_write(entry / HLO_FILE, hlo)
        if not (entry / self.flags_name).exists():
            atomic_write(entry / self.flags_name, self.flags_bytes)

    def _compile(self, entry: Path, hlo: bytes) -> GraphOutcome:
        self._write_inputs(entry, hlo)
        workdir = Path(tempfile.gettempdir()) / _user() / "neuroncc_compile_workdir" / str(uuid.uuid4())
        workdir.mkdir(parents=True)
        try:
            return self._compile_in(workdir, entry, hlo)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _compile_in(self, workdir: Path, entry: Path, hlo: bytes) -> GraphOutcome:
        module = entry.name
        hlo_path = workdir / f"model.{module}.hlo_module.pb"
        hlo_path.write_bytes(hlo)
        out = workdir / f"model.{module}.neff"
        # --lnc goes right after --target so a user's own --lnc in the flags wins.
        cmd = ["neuronx-cc", "compile", "--framework=XLA", str(hlo_path), "--output", str(out),
               f"--target={self.target}", f"--lnc={self.lnc}", *self.flags, "--verbose=35"]
        self.log.wrapper("INFO", f"Call compiler with cmd: {' '.join(cmd)}")
        status, output = self.runner.run(cmd)
        if status == 0 and out.exists():
            # The neff first, then the marker: a reader that sees model.done sees a whole neff.
            atomic_write(entry / "model.neff", out.read_bytes())
            if self.writes_done:
                atomic_write(entry / "model.done", b"")
            (entry / "model.log").unlink(missing_ok=True)
            self.log.wrapper("INFO", f"Compilation Successfully Completed for {hlo_path.name}")
            return GraphOutcome.COMPILED
        reason = output.strip() or f"exit status {status}"
        message = f"Failed compilation with {cmd!r}: {reason}"
        atomic_write(entry / "model.log", (message + "\n").encode())
        self.log.wrapper("ERROR", f"Failed compilation with {cmd!r}: exit status {status}: "
                                  f"{reason.splitlines()[0]}")
        self.log.wrapper("ERROR", f"Compilation failed for {hlo_path} after 0 retries.")
        return GraphOutcome.FAILED
