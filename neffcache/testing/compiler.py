"""A SIMULATED ``neuronx-cc``: the Neuron compiler's CLI shape, producing fake NEFFs.

The real Neuron SDK cannot be installed here, yet neffcache always runs a real ``neuronx-cc``
executable from PATH. This module is that executable's stand-in (install it with
:func:`neffcache.testing.shim.install_compiler_shim`). It is not a compiler: the NEFF it
writes is a deterministic function of its inputs (see :mod:`neffcache.testing.neff`).

CLI (docs/runtimes.md, "The compiler")::

    neuronx-cc --version
    neuronx-cc compile <model.hlo_module.pb> --framework XLA --target {inf2,trn1,trn1n,trn2,trn3}
               --output <x.neff> [--lnc {1,2}] [--model-type transformer] [--auto-cast none]
               [-O {1,2,3}] [--verbose=35] [other --flags are tolerated]

Options take ``--opt value`` or ``--opt=value``. Usage errors exit 2, compile errors exit 1.
The NEFF depends on the HLO bytes, the codegen flags (sorted; everything except --output,
--verbose, --logfile, --workdir and the input path), the compiler version, target and LNC.

Environment (the shim bakes defaults for these; a value set by the caller wins):

``NEFFSIM_COMPILER_VERSION``  version to report and embed (default ``2.27.5334.0+f702b353``)
``NEFFSIM_COMPILE_SECONDS``   seconds each compile takes (default 0); a ``compile_seconds``
                              field in the HLO header (see ``make_hlo``) wins for that graph
``NEFFSIM_FAIL_MATCH``        regex; graphs whose name matches fail with a compiler error
                              (exit 1, no NEFF) whose message names the input path and a line
                              number, as real compiler errors do
``NEFFSIM_HANG_MATCH``        regex; graphs whose name matches never finish (until killed)
``NEFFSIM_KILL_MATCH``        regex; the compile of a matching graph SIGKILLs itself midway,
                              as the kernel's OOM killer would (no output, no NEFF)
``NEFFSIM_OOM_MATCH``         regex; a matching graph runs out of host memory: a Python
                              ``MemoryError`` traceback and exit 1 (no NEFF)
``NEFFSIM_ENV_FAIL_MATCH``    a library name (e.g. ``libfoo``); every ``compile`` fails as the
                              dynamic loader does when that shared library is missing: its
                              message and exit 127, before any input is read
``NEFFSIM_INVOCATION_LOG``    file; one JSON line per ``compile`` invocation (graph,
                              hlo_sha256, pid, version, target, lnc), single O_APPEND write,
                              before any simulated fault: tests count every attempt
``NEFFSIM_COMPILE_MEMORY_MB`` allocate and touch this much memory while compiling
``NEFFSIM_NEFF_BYTES``        NEFF size (default 10x the HLO, clamped to 144 kB..20 MB)

Kept import-light on purpose: benchmarks start it hundreds of times.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from neffcache.testing._files import append_line, atomic_write
from neffcache.testing._runtime import env_float
from neffcache.testing.hlo import read_hlo_header
from neffcache.testing.neff import build_neff

DEFAULT_VERSION = "2.27.5334.0+f702b353"
TARGETS = ("inf2", "trn1", "trn1n", "trn2", "trn3")
# Without --lnc the compiler builds for the target's default logical-core configuration.
_DEFAULT_LNC = {"inf2": 1, "trn1": 1, "trn1n": 1, "trn2": 2, "trn3": 2}
_VALUE_OPTIONS = frozenset(
    {"--framework", "--target", "--output", "--lnc", "--model-type", "--auto-cast",
     "--auto-cast-type", "--verbose", "--logfile", "--workdir", "--optlevel", "-O"}
)
# Options that say where files go or how chatty to be: they never change the generated code.
_NOT_CODEGEN = frozenset({"--target", "--lnc", "--output", "--verbose", "--logfile", "--workdir"})
_CHOICES = {
    "--target": TARGETS,
    "--framework": ("XLA",),
    "--lnc": ("1", "2"),
    "-O": ("1", "2", "3"),
}
_SLICE = 0.05  # sleep in slices so SIGTERM/SIGINT end a "long compile" at once
USAGE = (
    "usage: neuronx-cc compile <model.hlo_module.pb> --framework XLA "
    "--target {inf2,trn1,trn1n,trn2,trn3} --output <file.neff> [--lnc {1,2}] [options]\n"
    "       neuronx-cc --version\n"
    "(neffcache.testing: SIMULATED compiler)"
)


class UsageError(Exception):
    """Bad command line: the real compiler (argparse) exits 2 for these."""


class CompileRequest:
    """What one ``neuronx-cc compile`` command line asks for."""

    __slots__ = ("codegen_flags", "framework", "input", "lnc", "output", "target")

    def __init__(self, input: str, target: str, framework: str, output: str, lnc: int,
                 codegen_flags: list[str]) -> None:
        self.input = input
        self.target = target
        self.framework = framework
        self.output = output
        self.lnc = lnc
        self.codegen_flags = codegen_flags


def parse_compile_args(argv: Sequence[str]) -> CompileRequest:
    """Parse the arguments after ``compile``. Raises :class:`UsageError`."""
    positionals: list[str] = []
    options: dict[str, str] = {}
    unknown: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if tok == "--":
            positionals.extend(args[i:])
            break
        if tok.startswith("-O") and len(tok) > 2 and not tok.startswith("-O="):
            name, value = "-O", tok[2:]
        elif tok.startswith("-") and tok != "-":
            name, eq, value = tok.partition("=")
            if name == "--optlevel":
                name = "-O"
            if name not in _VALUE_OPTIONS:
                # Unknown flags are kept (they may change codegen); "--flag value" is taken as
                # one flag once the input path is known, else the value is the input path.
                if not eq and positionals and i < len(args) and not args[i].startswith("-"):
                    tok = f"{tok}={args[i]}"
                    i += 1
                unknown.append(tok)
                continue
            if not eq:
                if i >= len(args):
                    raise UsageError(f"argument {name}: expected one argument")
                value = args[i]
                i += 1
        else:
            positionals.append(tok)
            continue
        allowed = _CHOICES.get(name)
        if allowed is not None and value not in allowed:
            raise UsageError(
                f"argument {name}: invalid choice: {value!r} (choose from {', '.join(allowed)})"
            )
        options[name] = value  # a repeated option: the last one wins, as with argparse
    if not positionals:
        raise UsageError("the following arguments are required: <model.hlo_module.pb>")
    if len(positionals) > 1:
        raise UsageError(f"unrecognized arguments: {' '.join(positionals[1:])}")
    for required in ("--framework", "--target"):
        if required not in options:
            raise UsageError(f"the following arguments are required: {required}")
    target = options["--target"]
    lnc = int(options.get("--lnc", _DEFAULT_LNC[target]))
    codegen = [f"{k}={v}" if k != "-O" else f"-O{v}" for k, v in options.items() if k not in _NOT_CODEGEN]
    return CompileRequest(
        input=positionals[0],
        target=target,
        framework=options["--framework"],
        output=options.get("--output", "file.neff"),
        lnc=lnc,
        codegen_flags=sorted(codegen + unknown),
    )


def check_version(version: str) -> str:
    """``version`` if it is a plausible compiler version, else :class:`UsageError`."""
    # The version becomes a directory name (neuronxcc-<ver>): refuse separators outright.
    if not version[:1].isdigit() or not all(c.isalnum() or c in ".+_-" for c in version):
        raise UsageError(f"{version!r} is not a valid compiler version (e.g. {DEFAULT_VERSION})")
    return version


def compiler_version() -> str:
    return check_version(os.environ.get("NEFFSIM_COMPILER_VERSION") or DEFAULT_VERSION)


def version_text(version: str) -> str:
    py = ".".join(str(n) for n in sys.version_info[:3])
    major_minor = ".".join(version.split(".")[:2])
    return (
        f"NeuronX Compiler version {version}\n"
        "\n"
        f"Python version {py}\n"
        f"HWM version {major_minor}.0.0-simulated\n"
        "NumPy version 1.26.4\n"
        "(simulated by neffcache.testing)\n"
    )


def _sleep(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(_SLICE, left))


def _matches(env_name: str, graph: str) -> bool:
    pattern = os.environ.get(env_name)
    if not pattern:
        return False
    import re  # only paid when fault injection is configured

    try:
        return re.search(pattern, graph) is not None
    except re.error as exc:
        raise UsageError(f"{env_name}={pattern!r} is not a valid regex: {exc}") from None


def _touch_memory(megabytes: float) -> bytearray:
    size = int(megabytes * 1024 * 1024)
    buf = bytearray(size)
    # A zeroed allocation may stay virtual: write one byte per page so it counts as RSS.
    buf[::4096] = b"\x01" * len(range(0, size, 4096))
    return buf


def _log_invocation(req: CompileRequest, version: str, graph: str, sha: str) -> None:
    log = os.environ.get("NEFFSIM_INVOCATION_LOG")
    if log:
        record = {"graph": graph, "hlo_sha256": sha, "pid": os.getpid(), "version": version,
                  "target": req.target, "lnc": req.lnc, "time": time.time()}
        append_line(Path(log), json.dumps(record, sort_keys=True))


def _environment_fault(graph: str) -> int | None:
    """The simulated host failures of one compile (see the module docstring), or None."""
    if _matches("NEFFSIM_KILL_MATCH", graph):
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)  # like the OOM killer: no chance to say anything
    if _matches("NEFFSIM_OOM_MATCH", graph):
        print(
            "Traceback (most recent call last):\n"
            '  File "neuronxcc/driver/Job.py", line 344, in run\n'
            f"numpy.core._exceptions._ArrayMemoryError: MemoryError: Unable to allocate 3.20 GiB for graph {graph}",
            file=sys.stderr,
        )
        return 1
    return None


def _compiler_error(req: CompileRequest, graph: str, sha: str) -> int:
    # The line number depends on the graph, the path on where the input lies: two hosts hitting
    # the same error print different paths and numbers (neffcache.failures.signature).
    line = int(sha[:6], 16) % 5000
    print(
        f"ERROR:neuronxcc: [NCC_ESIM001] Simulated compiler error in graph {graph} "
        f"(hlo sha256 {sha[:16]}): matched NEFFSIM_FAIL_MATCH at {Path(req.input).absolute()}:{line}\n"
        "Compiler status ERROR",
        file=sys.stderr,
    )
    return 1


def compile_graph(req: CompileRequest, version: str) -> int:
    """Run one simulated compile. Returns the exit status."""
    try:
        hlo = Path(req.input).read_bytes()
    except OSError as exc:
        print(f"neuronx-cc: error: cannot read input {req.input}: {exc.strerror}", file=sys.stderr)
        return 2
    sha = hashlib.sha256(hlo).hexdigest()
    header = read_hlo_header(hlo) or {}
    graph = header.get("graph")
    if not isinstance(graph, str):
        graph = f"{Path(req.input).name}:{sha[:12]}"
    _log_invocation(req, version, graph, sha)

    per_graph = header.get("compile_seconds")
    seconds = (float(per_graph) if isinstance(per_graph, (int, float))
               else env_float("NEFFSIM_COMPILE_SECONDS", 0.0, error=UsageError))
    memory_mb = env_float("NEFFSIM_COMPILE_MEMORY_MB", 0.0, error=UsageError)
    held = _touch_memory(memory_mb) if memory_mb > 0 else None
    if _matches("NEFFSIM_HANG_MATCH", graph):
        while True:  # like a compiler stuck in a pass: only a signal ends it
            _sleep(3600)
    _sleep(seconds)
    del held
    fault = _environment_fault(graph)
    if fault is not None:
        return fault
    if _matches("NEFFSIM_FAIL_MATCH", graph):
        return _compiler_error(req, graph, sha)
    size = int(env_float("NEFFSIM_NEFF_BYTES", -1, error=UsageError))
    neff = build_neff(hlo, compiler_version=version, target=req.target, lnc=req.lnc,
                      flags=req.codegen_flags, graph=graph, size=size if size >= 0 else None)
    try:
        atomic_write(Path(req.output), neff)
    except OSError as exc:
        print(f"ERROR:neuronxcc: cannot write {req.output}: {exc}\nCompiler status ERROR",
              file=sys.stderr)
        return 1
    print("Compiler status PASS")
    return 0


def _missing_library() -> int | None:
    """``NEFFSIM_ENV_FAIL_MATCH``: the loader's message for a missing library, and its exit 127."""
    library = os.environ.get("NEFFSIM_ENV_FAIL_MATCH", "").strip()
    if not library:
        return None
    name = library if ".so" in library else f"{library}.so.1"
    print(f"neuronx-cc: error while loading shared libraries: {name}: cannot open shared object file: "
          "No such file or directory", file=sys.stderr)
    return 127


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args[:1] in (["--version"], ["-V"]):
            sys.stdout.write(version_text(compiler_version()))
            return 0
        if not args:
            print(USAGE, file=sys.stderr)
            return 2
        if args[0] in ("-h", "--help", "help"):
            print(USAGE)
            return 0
        if args[0] != "compile":
            raise UsageError(f"invalid command {args[0]!r} (this simulation knows: compile)")
        if "-h" in args[1:] or "--help" in args[1:]:
            print(USAGE)
            return 0
        request = parse_compile_args(args[1:])
        missing = _missing_library()
        if missing is not None:
            _log_invocation(request, compiler_version(), Path(request.input).name, "")
            return missing
        return compile_graph(request, compiler_version())
    except UsageError as exc:
        print(f"{USAGE}\nneuronx-cc: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
