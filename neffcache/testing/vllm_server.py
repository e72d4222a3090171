"""A SIMULATED vLLM-Neuron OpenAI server: compiles (or finds) its graphs at start-up, then serves.

``python -m neffcache.testing.vllm_server --model NAME [--bucket N[,N...]]... [--graphs N]
[--hlo-bytes N] [--port N] [--exit-when-ready]`` (other vLLM arguments are accepted and ignored)

Like ``python3 -m vllm.entrypoints.openai.api_server`` on the Neuron plugin it warms up by
compiling one graph per bucket and shape (``--graphs`` per bucket here) through the two-tier
cache (:mod:`.vllm_cache`), then prints uvicorn's ready lines and serves until SIGINT or
SIGTERM (exit 0). It serves nothing: no model, no HTTP. ``--exit-when-ready`` exits at once.

Environment, as the docs give it (docs/runtimes.md, "vLLM-Neuron"):

``VLLM_CACHE_ROOT``                           local tier root (default ``~/.cache/vllm``)
``NEURON_LIBTORCH_REMOTE_CACHE``              shared tier, a directory (optional)
``VLLM_NEURON_CPU_COMPILE=1``                 compile without a device; needs
``NEURON_PLATFORM_TARGET_OVERRIDE``           the target (``trn2``...); refused with
``VLLM_NEURON_CPU_MODE``                      (CPU inference: compiles nothing)
``NEURON_LOGICAL_NC_CONFIG``                  LNC (default: the target's)
``NEURON_LIBTORCH_PARALLEL_COMPILE_WORKERS``  graphs compiled at once (default 8)
``NEURON_LIBTORCH_DISABLE_COMPILE_CACHE=1``   no cache: every graph compiled, nothing stored
``VLLM_NEURON_DISABLE_WARMUP_COMPILE=1``      a miss raises RuntimeError (exit 1)
``NEURON_LIBTORCH_COMPILATION_TIMEOUT``       seconds to wait on another process's lock (600)

Without CPU compile the server needs a Neuron device: on a host without ``/dev/neuron0`` it
fails as the real one does. Simulation knobs: ``NEFFSIM_VLLM_DEVICE=<instance type>`` pretends
the host has that instance's devices (a production start on this CPU host),
``NEFFSIM_VLLM_SAVE_REMOTE=1`` makes every compile ``save_cache`` into the remote tier (the
docs contradict each other on whether CPU compile does), ``NEFFSIM_LOCK_LOG_SECONDS``.

Exit status: 0 served and stopped (or ``--exit-when-ready``), 1 a graph failed or the server
refused to start, 2 bad arguments, 130/143 stopped during start-up. A SIMULATED summary line
before the ready lines counts the graphs: ``graphs=8 hits=0 fetched=0 compiled=8 failed=0``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType

from neffcache.errors import NeffcacheError
from neffcache.instances import lookup_instance
from neffcache.testing._runtime import CompilerRunner, GraphOutcome, WorkloadLog, env_float, env_seconds
from neffcache.testing.compiler import TARGETS
from neffcache.testing.env import NEURON_DEVICE, WorkloadError, is_true
from neffcache.testing.hlo import DEFAULT_HLO_BYTES, make_hlo
from neffcache.testing.vllm_cache import CACHE_SUBDIR, VllmCache
from neffcache.toolchain import compiler_version

PROG = "neffcache.testing.vllm_server"
_DEFAULT_LNC = {"inf2": 1, "trn1": 1, "trn1n": 1, "trn2": 2, "trn3": 2}
_ARGS = ("--model-type=transformer", "--auto-cast=none")  # the canonical compiler arguments


class ServerError(Exception):
    """The server refuses to start (exit 1), as vLLM raises during start-up."""


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog=f"python -m {PROG}",
                                     description="SIMULATED vLLM-Neuron server (neffcache.testing): fake graphs, "
                                                 "real cache files, no model and no HTTP.")
    parser.add_argument("--model", default="llama-tiny")
    parser.add_argument("--bucket", action="append", help="sequence bucket; repeat or comma-separate (default 128)")
    parser.add_argument("--graphs", type=int, default=4, help="graphs per bucket")
    parser.add_argument("--hlo-bytes", type=int, default=DEFAULT_HLO_BYTES)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--exit-when-ready", action="store_true", help="exit 0 after the ready lines")
    ns, rest = parser.parse_known_args(argv)
    try:
        raw = [p for v in (ns.bucket or ["128"]) for p in v.split(",") if p.strip()]
        ns.buckets = list(dict.fromkeys(int(p) for p in raw))
    except ValueError:
        parser.error(f"--bucket takes integers, got {ns.bucket!r}")
    if any(b <= 0 for b in ns.buckets) or ns.graphs < 0:
        parser.error("--bucket values must be positive and --graphs >= 0")
    return ns, rest


def _target(env: Mapping[str, str]) -> tuple[str | None, bool]:
    """(target, compile only): from NEURON_PLATFORM_TARGET_OVERRIDE under CPU compile, else from
    the device; None in CPU mode (nothing is compiled)."""
    cpu_compile, cpu_mode = is_true(env.get("VLLM_NEURON_CPU_COMPILE")), is_true(env.get("VLLM_NEURON_CPU_MODE"))
    if cpu_compile and cpu_mode:
        raise ServerError("ValueError: VLLM_NEURON_CPU_COMPILE and VLLM_NEURON_CPU_MODE cannot be enabled together")
    if cpu_mode:
        return None, False
    if cpu_compile:
        target = env.get("NEURON_PLATFORM_TARGET_OVERRIDE", "").strip()
        if not target:
            raise ServerError("ValueError: NEURON_PLATFORM_TARGET_OVERRIDE is required with VLLM_NEURON_CPU_COMPILE "
                              "(no Neuron device to take the platform from), e.g. trn2")
        if target not in TARGETS:
            raise ServerError(f"ValueError: NEURON_PLATFORM_TARGET_OVERRIDE={target!r}: "
                              f"not one of {', '.join(TARGETS)}")
        return target, True
    device = env.get("NEFFSIM_VLLM_DEVICE", "").strip()
    if device:
        try:
            return lookup_instance(device).target, False
        except NeffcacheError as exc:
            raise WorkloadError(f"NEFFSIM_VLLM_DEVICE: {exc}") from None
    if NEURON_DEVICE.exists():
        raise WorkloadError("the simulation cannot use the Neuron device here: set NEFFSIM_VLLM_DEVICE=<instance type>")
    raise ServerError(f"RuntimeError: no Neuron device found ({NEURON_DEVICE} is missing); to compile on a CPU host "
                      "set VLLM_NEURON_CPU_COMPILE=1 and NEURON_PLATFORM_TARGET_OVERRIDE")


def _cache(env: Mapping[str, str], target: str, log: WorkloadLog, runner: CompilerRunner) -> VllmCache:
    local_root = Path(env.get("VLLM_CACHE_ROOT", "").strip() or Path.home() / ".cache" / "vllm").absolute()
    remote_raw = env.get("NEURON_LIBTORCH_REMOTE_CACHE", "").strip()
    if "://" in remote_raw:
        raise WorkloadError(f"NEURON_LIBTORCH_REMOTE_CACHE={remote_raw}: a directory, not a URL "
                            "(S3 only through an FSx for Lustre mount)")
    lnc_raw = env.get("NEURON_LOGICAL_NC_CONFIG", "").strip()
    if lnc_raw not in ("", "1", "2"):
        raise WorkloadError(f"NEURON_LOGICAL_NC_CONFIG must be 1 or 2, not {lnc_raw!r}")
    try:
        version = compiler_version()  # `neuronx-cc --version` from PATH, like the runtime's key
    except NeffcacheError as exc:
        raise WorkloadError(str(exc)) from None
    disabled = is_true(env.get("NEURON_LIBTORCH_DISABLE_COMPILE_CACHE"))
    remote = Path(remote_raw).absolute() if remote_raw else None
    return VllmCache(None if disabled else local_root / CACHE_SUBDIR, remote,
                     neuronxcc=version, target=target, lnc=int(lnc_raw) if lnc_raw else _DEFAULT_LNC[target],
                     args=_ARGS, must_be_warm=is_true(env.get("VLLM_NEURON_DISABLE_WARMUP_COMPILE")),
                     save_remote=is_true(env.get("NEFFSIM_VLLM_SAVE_REMOTE")),
                     lock_timeout=env_seconds("NEURON_LIBTORCH_COMPILATION_TIMEOUT", 600.0) or 0.0,
                     lock_report_every=env_seconds("NEFFSIM_LOCK_LOG_SECONDS", 60.0) or 60.0, log=log, runner=runner)


def warm_up(ns: argparse.Namespace, log: WorkloadLog, runner: CompilerRunner) -> Counter[GraphOutcome]:
    """Compile (or find) every graph of every bucket; the outcomes."""
    env = os.environ
    target, cpu_compile = _target(env)
    if target is None:
        log.line(f"{PROG}: (simulated) VLLM_NEURON_CPU_MODE: CPU inference, no Neuron graph compiled")
        return Counter()
    cache = _cache(env, target, log, runner)
    workers = int(env_float("NEURON_LIBTORCH_PARALLEL_COMPILE_WORKERS", 8, what="a number of workers"))
    if workers < 1:
        raise WorkloadError("NEURON_LIBTORCH_PARALLEL_COMPILE_WORKERS must be >= 1")
    cache.open()
    log.line(f"{PROG}: (simulated) model={ns.model} buckets={ns.buckets} target={target} lnc={cache.lnc} "
             f"cpu_compile={int(cpu_compile)} neuronxcc={cache.neuronxcc} workers={workers} "
             f"local={cache.local or 'off'} remote={cache.remote or 'unset'}")
    graphs = [make_hlo(ns.model, bucket, i, ns.hlo_bytes) for bucket in ns.buckets for i in range(ns.graphs)]
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="neffsim-vllm")
    try:
        return Counter(pool.map(cache.lookup_or_compile, graphs))
    except BaseException:
        runner.kill_all()  # interrupted: no compile outlives the server
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def serve(ns: argparse.Namespace, log: WorkloadLog, stop: threading.Event) -> int:
    pid = os.getpid()
    log.line(f"INFO:     Started server process [{pid}]")
    log.line("INFO:     Waiting for application startup.")
    log.line("INFO:     Application startup complete.")
    log.line(f"INFO:     Uvicorn running on http://0.0.0.0:{ns.port} (Press CTRL+C to quit)")
    if ns.exit_when_ready:
        return 0
    while not stop.wait(0.2):  # short waits: the signal handler runs between them
        pass
    log.line("INFO:     Shutting down")
    log.line("INFO:     Waiting for application shutdown.")
    log.line("INFO:     Application shutdown complete.")
    log.line(f"INFO:     Finished server process [{pid}]")
    return 0


def _handlers(runner: CompilerRunner, stop: threading.Event, serving: threading.Event
              ) -> Callable[[int, FrameType | None], None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        if serving.is_set():
            stop.set()  # uvicorn's graceful shutdown: exit 0
            return
        runner.kill_all()  # still starting: unwind, locks removed, compilers killed
        raise SystemExit(128 + signum)

    return handler


def main(argv: Sequence[str] | None = None) -> int:
    ns, ignored = parse_args(argv)
    log = WorkloadLog()
    log.line(f"neffcache.testing: SIMULATED vLLM-Neuron server (no Neuron runtime, no model, no HTTP; fake graphs "
             f"and NEFFs) pid={os.getpid()}")
    if ignored:
        log.line(f"{PROG}: (simulated) ignoring vLLM arguments {' '.join(ignored)}")
    runner, stop, serving = CompilerRunner(), threading.Event(), threading.Event()
    handler = _handlers(runner, stop, serving)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    try:
        counts = warm_up(ns, log, runner)
    except ServerError as exc:
        log.line(f"{PROG}: {exc}")
        return 1
    except (WorkloadError, NeffcacheError, ValueError, OSError) as exc:
        log.line(f"{PROG}: error: {exc}")
        return 2
    total = sum(counts.values())
    log.line(f"{PROG}: (simulated) graphs={total} hits={counts[GraphOutcome.HIT]} "
             f"fetched={counts[GraphOutcome.FETCHED]} compiled={counts[GraphOutcome.COMPILED]} "
             f"failed={counts[GraphOutcome.FAILED]}")
    if counts[GraphOutcome.FAILED]:
        log.line(f"RuntimeError: {counts[GraphOutcome.FAILED]} graph(s) could not be compiled or loaded")
        return 1
    serving.set()
    return serve(ns, log, stop)


if __name__ == "__main__":
    sys.exit(main())
