"""A SIMULATED TorchNeuron / torch-xla run: lowers fake graphs, looks them up, compiles misses.

``python -m neffcache.testing.workload [--model NAME] [--bucket N[,N...]]... [--graphs N]
[--kernels N] [--hlo-bytes N] [--steps N] [--backend {xla,native}] [--crash-after N]
[--parallel N] [--flags=FLAGS]``

It reads exactly the environment a real run reads and leaves the files a real run leaves, so
neffcache's warm/run/prune/rewarm code paths can be rehearsed without the Neuron SDK. Nothing
here executes on a device. Graph ``i`` of ``--model`` at shape ``--bucket`` always lowers to
the same HLO bytes (:func:`neffcache.testing.hlo.make_hlo`); misses run the ``neuronx-cc``
found on PATH as a child process (install the simulated one with
:mod:`neffcache.testing.shim`).

Environment, as the real runtimes read it:

``NEURON_RT_FAKE_INSTANCE_TYPE``  required without /dev/neuron0; picks target and default LNC
``NEURON_LOGICAL_NC_CONFIG``      overrides the LNC (1 or 2)
``TORCH_NEURONX_COMPILE_ONLY=1``  compile (or hit) every graph, never execute
``NEURON_EXTRACT_GRAPHS_ONLY=1``  (xla) write each graph's HLO + flags only: EMPTY entries
``NEURON_CC_FLAGS``               compiler flags; ``--cache_dir=DIR`` and
                                  ``--retry_failed_compilation`` are for the cache, not hashed
``NEURON_COMPILE_CACHE_URL``      (xla) cache root, a path or file:// URL (default
                                  /var/tmp/neuron-compile-cache; ``--cache_dir`` wins)
``TORCH_NEURONX_NEFF_CACHE_DIR``  (native, required) NEFF directory, both writers: the C++
                                  one's ab/cd/<32 hex>.neff, the kernel path's <K>/<K>.neff
``TORCH_NEURONX_HLO_CACHE_DIR``   (native, optional) HLO directory
``TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR`` (native) local dir for lock files (default under TMPDIR)
``TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT`` (native) seconds a waiter waits on a lock before it
                                  breaks it (default 1200)
``TORCH_NEURONX_NEFF_DISABLE_CACHE=1`` (native) no disk cache: every graph compiles, none is kept
``NEURON_COMPILER_OPT_LEVEL``     (native) part of every C++ key (default -O1), as NEURON_CC_FLAGS

Simulation knobs: ``NEFFSIM_BACKEND`` (default backend), ``NEFFSIM_LOCK_TIMEOUT`` (seconds to
wait on another process's lock before failing the graph; default forever, like the real
runtime), ``NEFFSIM_LOCK_LOG_SECONDS`` (how often the wait is reported; default 60),
``NEFFSIM_FLAGS_FORM`` (xla: the simulated libneuronxla release's flags-file form, ``text``,
``list`` or ``target``; it names the entries, see :mod:`neffcache.testing.xla_cache`; default:
the form observed with the compiler, text <= 2.13, list 2.14 - 2.16.344, target from 2.16.345.0).

Exit status: 0 all graphs available, 1 some graph failed, 2 bad configuration,
3 ``--crash-after``, 130/143 interrupted. A summary line ends stderr, e.g.
``neffcache.testing.workload: graphs=8 hits=8 compiled=0 failed=0 extracted=0``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import FrameType

from neffcache.errors import NeffcacheError
from neffcache.testing._runtime import CompilerRunner, GraphOutcome, WorkloadLog, env_seconds
from neffcache.testing.env import (
    WorkloadError,
    is_true,
    native_dirs,
    resolve_instance,
    split_cc_flags,
    xla_cache_root,
)
from neffcache.testing.hlo import DEFAULT_HLO_BYTES, make_hlo
from neffcache.testing.native_cache import DEFAULT_OPT, LOCK_BREAK_SECONDS, NativeCache
from neffcache.testing.xla_cache import XlaCache, flags_form_for
from neffcache.toolchain import Toolchain, compiler_version

PROG = "neffcache.testing.workload"
Lookup = Callable[[bytes], GraphOutcome]
# --help shows the environment the simulation reads: the module docstring's part on it.
_ENVIRONMENT = (__doc__ or "")[(__doc__ or "").find("Environment, as the real runtimes read it:"):].replace("``", "")


def _buckets(values: list[str] | None) -> list[int]:
    raw = [part for value in (values or ["128"]) for part in value.split(",") if part.strip()]
    try:
        buckets = [int(part) for part in raw]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--bucket takes integers, got {raw!r}") from None
    if any(b <= 0 for b in buckets):
        raise argparse.ArgumentTypeError("--bucket values must be positive")
    return list(dict.fromkeys(buckets))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=f"python -m {PROG}",
        description="SIMULATED torch-neuronx workload (neffcache.testing): fake graphs, real cache files.",
        epilog=_ENVIRONMENT, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default="llama-tiny")
    parser.add_argument("--bucket", action="append", help="shape bucket; repeat or comma-separate")
    parser.add_argument("--graphs", type=int, default=4, help="graphs per bucket")
    parser.add_argument("--kernels", type=int, default=0,
                        help="(native) kernels per bucket, stored by the Python kernel path as <K>/<K>.neff")
    parser.add_argument("--hlo-bytes", type=int, default=DEFAULT_HLO_BYTES, help="HLO size per graph")
    parser.add_argument("--steps", type=int, default=2, help="steps to 'run' when not compile-only")
    parser.add_argument("--backend", choices=("xla", "native"),
                        default=os.environ.get("NEFFSIM_BACKEND") or "xla")
    parser.add_argument("--crash-after", type=int, help="exit 3 after looking up this many graphs")
    parser.add_argument("--parallel", type=int, default=1, help="graphs compiled at once")
    parser.add_argument("--flags", help="compiler flags (default: $NEURON_CC_FLAGS); use --flags=...")
    ns = parser.parse_args(argv)
    try:
        ns.buckets = _buckets(ns.bucket)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    if ns.graphs < 0 or ns.kernels < 0 or ns.steps < 0 or ns.parallel < 1 or (ns.crash_after or 0) < 0:
        parser.error("--graphs, --kernels, --steps and --crash-after must be >= 0, --parallel >= 1")
    if ns.kernels and ns.backend != "native":
        parser.error("--kernels is a native-backend option (TorchNeuron's kernel path)")
    return ns


def _run_all(process: Callable[[bytes], GraphOutcome], hlos: list[bytes], parallel: int,
             runner: CompilerRunner) -> Counter[GraphOutcome]:
    if parallel == 1:
        return Counter(process(hlo) for hlo in hlos)
    pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="neffsim-graph")
    try:
        return Counter(pool.map(process, hlos))
    except BaseException:
        # Interrupted: stop the compilers so no thread is left waiting on a hung child.
        runner.kill_all()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _on_sigterm(runner: CompilerRunner) -> Callable[[int, FrameType | None], None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        # Unwind (so lock files are removed) instead of dying with children still compiling.
        runner.kill_all()
        raise SystemExit(128 + signum)

    return handler


def _native_cache(env: Mapping[str, str], toolchain: Toolchain, flags: list[str], log: WorkloadLog,
                  runner: CompilerRunner, lock_timeout: float | None, lock_report_every: float) -> NativeCache:
    """TorchNeuron's cache, opened as the variables of the module docstring say."""
    neff_dir, hlo_dir, local_dir = native_dirs(env)
    native = NativeCache(neff_dir, hlo_dir=hlo_dir, local_dir=local_dir, toolchain=toolchain, flags=flags,
                         log=log, runner=runner, lock_timeout=lock_timeout, lock_report_every=lock_report_every,
                         lock_break_after=env_seconds("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT", None)
                         or LOCK_BREAK_SECONDS,
                         opt=env.get("NEURON_COMPILER_OPT_LEVEL", "").strip() or DEFAULT_OPT,
                         disk=not is_true(env.get("TORCH_NEURONX_NEFF_DISABLE_CACHE")))
    native.open()
    return native


def run(ns: argparse.Namespace, log: WorkloadLog, runner: CompilerRunner) -> int:
    env = os.environ
    instance, target, lnc = resolve_instance(env)
    flags, cache_dir, retry_failed = split_cc_flags(ns.flags if ns.flags is not None
                                                    else env.get("NEURON_CC_FLAGS", ""))
    compile_only = is_true(env.get("TORCH_NEURONX_COMPILE_ONLY"))
    extract_only = is_true(env.get("NEURON_EXTRACT_GRAPHS_ONLY"))
    lock_timeout = env_seconds("NEFFSIM_LOCK_TIMEOUT", None)
    lock_report_every = env_seconds("NEFFSIM_LOCK_LOG_SECONDS", 60.0) or 60.0
    try:
        version = compiler_version()  # runs `neuronx-cc --version` from PATH, like the runtime
    except NeffcacheError as exc:
        raise WorkloadError(str(exc)) from None

    process: Lookup
    kernel: Lookup | None = None  # TorchNeuron's kernel path
    reuse: Lookup | None = None  # a later step's lookup of the same graph
    if ns.backend == "xla":
        root = xla_cache_root(cache_dir, env)
        xla = XlaCache(root, version=version, target=target, lnc=lnc, flags=flags,
                       retry_failed=retry_failed, log=log, runner=runner,
                       lock_timeout=lock_timeout, lock_report_every=lock_report_every,
                       flags_form=flags_form_for(version, env))
        xla.open()
        process = xla.extract if extract_only else xla.lookup_or_compile
        where = f"cache={xla.version_dir} flags_form={xla.flags_form}"
    else:
        if extract_only:
            log.line(f"{PROG}: NEURON_EXTRACT_GRAPHS_ONLY is a torch-xla setting; native ignores it")
            extract_only = False
        native = _native_cache(env, Toolchain(version, target, lnc), flags, log, runner, lock_timeout,
                               lock_report_every)
        process = reuse = native.lookup_or_compile
        kernel = native.lookup_or_compile_kernel
        where = f"neff_cache={native.neff_dir}"
    log.line(f"{PROG}: model={ns.model} buckets={ns.buckets} instance={instance} target={target} "
             f"lnc={lnc} compiler={version} backend={ns.backend} {where}")

    hlos = [make_hlo(ns.model, bucket, i, ns.hlo_bytes) for bucket in ns.buckets for i in range(ns.graphs)]
    kernels = [make_hlo(f"{ns.model}-kernel", bucket, i, ns.hlo_bytes // 4 or 1)
               for bucket in ns.buckets for i in range(ns.kernels)]
    if ns.crash_after is not None:
        hlos = hlos[: ns.crash_after]
        kernels = kernels[: max(0, ns.crash_after - len(hlos))]
    counts = _run_all(process, hlos, ns.parallel, runner)
    if kernel is not None and kernels:
        counts += _run_all(kernel, kernels, ns.parallel, runner)
    log.line(f"{PROG}: graphs={len(hlos) + len(kernels)} hits={counts[GraphOutcome.HIT]} "
             f"compiled={counts[GraphOutcome.COMPILED]} failed={counts[GraphOutcome.FAILED]} "
             f"extracted={counts[GraphOutcome.EXTRACTED]}")
    if ns.crash_after is not None:
        log.line(f"{PROG}: simulated crash after {len(hlos)} graphs (--crash-after)")
        return 3
    if counts[GraphOutcome.FAILED]:
        log.line(f"{PROG}: RuntimeError: {counts[GraphOutcome.FAILED]} graph(s) failed to compile")
        return 1
    if not (compile_only or extract_only):
        _steps(ns.steps, hlos, reuse)
    return 0


def _steps(steps: int, hlos: list[bytes], reuse: Lookup | None) -> None:
    """'Train': each step runs the graphs again (a runtime with an in-process cache looks them
    up there: TorchNeuron prints a HIT line for each)."""
    for step in range(1, steps + 1):
        time.sleep(0.01)
        for hlo in hlos:
            if reuse is not None:
                reuse(hlo)
        print(f"step {step}/{steps}: loss={4.0 / (step + 1):.4f} (simulated)", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse_args(argv)
    log = WorkloadLog()
    log.line(f"neffcache.testing: SIMULATED torch-neuronx workload (no Neuron runtime; fake graphs "
             f"and NEFFs) pid={os.getpid()}")
    runner = CompilerRunner()
    signal.signal(signal.SIGTERM, _on_sigterm(runner))
    try:
        return run(ns, log, runner)
    except (WorkloadError, NeffcacheError, ValueError, OSError) as exc:
        log.line(f"{PROG}: error: {exc}")
        return 2
    except KeyboardInterrupt:
        runner.kill_all()
        log.line(f"{PROG}: interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
