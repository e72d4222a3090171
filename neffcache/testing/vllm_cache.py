"""SIMULATED vLLM-Neuron compile cache (libtorch_neuronx_lite's), both tiers.

Per docs/runtimes.md, "vLLM-Neuron" (SDK ``compilation_cache.md``; entry files from
aws-neuron-sdk#1368, unverified)::

    local   $VLLM_CACHE_ROOT/neuron/compile_cache/<hash>/          per-key lock <hash>.lock beside it
    remote  $NEURON_LIBTORCH_REMOTE_CACHE/<hash>/                  flat
    <hash>/ graph_<hash>.neff  graph.hlo  metadata.json  nki/<kernel>/kernel.json
            .compilation_complete                                 written last (sentinel)

Per graph: the 32-hex MD5 key over the graph bytes, the torch_neuronx, neuronxcc and NKI
versions, the canonical compiler arguments and the platform target; a fast local check
without the lock; then the key's lock (waiting at most ``NEURON_LIBTORCH_COMPILATION_TIMEOUT``
seconds on another process), a second local check, the remote tier (copied into the local one:
staging directory + rename), else a compile by the ``neuronx-cc`` on PATH, as a child process,
in a work directory, the entry built in a staging directory and renamed into place (marker
last). ``save_cache`` copies a local entry to the remote tier the same way; an entry already
there makes it a no-op. Whether a CPU-compile run saves to the remote tier by itself the docs
contradict: the simulation does it only with ``NEFFSIM_VLLM_SAVE_REMOTE=1``.

Computed here, independently of neffcache (which must never compute vLLM's keys).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from neffcache.testing._files import create_exclusive
from neffcache.testing._runtime import CompilerRunner, GraphOutcome, WorkloadLog, wait_for_unlock
from neffcache.testing.hlo import read_hlo_header

MARKER = ".compilation_complete"
CACHE_SUBDIR = Path("neuron") / "compile_cache"
# The simulation's own versions of the packages the key covers besides the compiler.
TORCH_NEURONX_VERSION = "2.9.0.2.12.sim"
NKI_VERSION = "0.3.0.sim"


def cache_key(graph: bytes, *, neuronxcc: str, target: str, args: Sequence[str]) -> str:
    """32 hex: MD5 over the graph, the three versions, the canonical args and the target."""
    h = hashlib.md5(usedforsecurity=False)
    for part in (graph, TORCH_NEURONX_VERSION.encode(), neuronxcc.encode(), NKI_VERSION.encode(),
                 " ".join(sorted(args)).encode(), target.encode()):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


def _graph_name(graph: bytes) -> str:
    header = read_hlo_header(graph) or {}
    return str(header.get("graph") or hashlib.sha256(graph).hexdigest()[:12])


def _owner_is_dead(lock: Path) -> bool:
    # A file lock dies with its owner; the simulation's O_EXCL lock file holds the owner's pid.
    try:
        pid = int(lock.read_text().strip() or "0")
    except (OSError, ValueError):
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _copy_in(src: Path, dest: Path) -> bool:
    """Copy the entry directory ``src`` to ``dest`` whole: staging directory beside ``dest``,
    then rename. False (and nothing left behind) when ``dest`` exists already."""
    staging = dest.with_name(f".{dest.name}.staging-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        shutil.copytree(src, staging, symlinks=True)
        os.rename(staging, dest)
        return True
    except OSError:
        if dest.exists():
            return False  # another writer got there first: EEXIST is a no-op
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


class VllmCache:
    """One server's view of the two tiers (``local`` None: the cache is off)."""

    def __init__(self, local: Path | None, remote: Path | None, *, neuronxcc: str, target: str, lnc: int,
                 args: Sequence[str], must_be_warm: bool, save_remote: bool, lock_timeout: float,
                 lock_report_every: float, log: WorkloadLog, runner: CompilerRunner) -> None:
        self.local = local
        self.remote = remote
        self.neuronxcc = neuronxcc
        self.target = target
        self.lnc = lnc
        self.args = list(args)
        self.must_be_warm = must_be_warm
        self.save_remote = save_remote
        self.lock_timeout = lock_timeout
        self.lock_report_every = lock_report_every
        self.log = log
        self.runner = runner

    def open(self) -> None:
        if self.local is not None:
            self.local.mkdir(parents=True, exist_ok=True)

    def key(self, graph: bytes) -> str:
        return cache_key(graph, neuronxcc=self.neuronxcc, target=self.target, args=self.args)

    def lookup_or_compile(self, graph: bytes) -> GraphOutcome:
        key, name = self.key(graph), _graph_name(graph)
        if self.local is None:  # NEURON_LIBTORCH_DISABLE_COMPILE_CACHE: each process compiles
            return self._compile_only(key, name, graph)
        entry = self.local / key
        if (entry / MARKER).exists():
            return GraphOutcome.HIT
        lock = self.local / f"{key}.lock"
        while not create_exclusive(lock, f"{os.getpid()}\n".encode()):
            if not wait_for_unlock(lock, timeout=self.lock_timeout, report_every=self.lock_report_every,
                                   report=lambda waited: self.log.line(
                                       f"(simulated) waiting for another process compiling {name} ({waited} s)"),
                                   stopping=self.runner.stopping, is_stale=lambda: _owner_is_dead(lock)):
                self.log.line(f"RuntimeError: timed out after {self.lock_timeout:g} s waiting for another process "
                              f"to compile {name} (NEURON_LIBTORCH_COMPILATION_TIMEOUT)")
                return GraphOutcome.FAILED
        try:
            if (entry / MARKER).exists():
                return GraphOutcome.HIT
            if self.remote is not None and (self.remote / key / MARKER).is_file():
                _copy_in(self.remote / key, entry)
                return GraphOutcome.FETCHED
            if self.must_be_warm:
                self.log.line(f"RuntimeError: compile cache miss for {name} (key {key}) with "
                              "VLLM_NEURON_DISABLE_WARMUP_COMPILE=1")
                return GraphOutcome.FAILED
            outcome = self._compile_into(key, name, graph, entry)
        finally:
            lock.unlink(missing_ok=True)
        if outcome is GraphOutcome.COMPILED and self.save_remote and self.remote is not None:
            self.save_cache(key)
        return outcome

    def save_cache(self, key: str) -> None:
        """``save_cache(local, remote, hash)``: the local entry to the remote tier, whole, once."""
        assert self.local is not None and self.remote is not None
        entry = self.local / key
        if not (entry / MARKER).is_file():
            raise RuntimeError(f"save_cache: the local entry {entry} is incomplete")
        self.remote.mkdir(parents=True, exist_ok=True)
        if not (self.remote / key).exists():
            _copy_in(entry, self.remote / key)

    # -- compiling ---------------------------------------------------------------------------------
    def _compile(self, key: str, name: str, graph: bytes, work: Path) -> Path | None:
        """Run ``neuronx-cc`` in ``work``; the NEFF it wrote, or None after a failure line."""
        (work / "graph.hlo").write_bytes(graph)
        neff = work / f"graph_{key}.neff"
        cmd = ["neuronx-cc", "compile", str(work / "graph.hlo"), "--framework", "XLA", "--target", self.target,
               "--lnc", str(self.lnc), "--output", str(neff), *self.args]
        status, output = self.runner.run(cmd)
        if status != 0 or not neff.is_file():
            lines = [ln for ln in output.strip().splitlines() if ln.strip()]
            self.log.line(f"RuntimeError: neuronx-cc failed to compile {name}: "
                          f"{lines[0] if lines else f'exit status {status}'}")
            return None
        return neff

    def _compile_only(self, key: str, name: str, graph: bytes) -> GraphOutcome:
        with tempfile.TemporaryDirectory(prefix="vllm-neuron-compile-") as tmp:
            return GraphOutcome.COMPILED if self._compile(key, name, graph, Path(tmp)) else GraphOutcome.FAILED

    def _compile_into(self, key: str, name: str, graph: bytes, entry: Path) -> GraphOutcome:
        assert self.local is not None
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="vllm-neuron-compile-") as tmp:
            neff = self._compile(key, name, graph, Path(tmp))
            if neff is None:
                return GraphOutcome.FAILED
            staging = self.local / f".{key}.staging-{os.getpid()}-{os.urandom(4).hex()}"
            try:
                kernel = staging / "nki" / f"kernel_{key[:8]}"
                kernel.mkdir(parents=True)
                shutil.copyfile(neff, staging / neff.name)
                (staging / "graph.hlo").write_bytes(graph)
                meta = {"key": key, "graph": name, "target": self.target, "lnc": self.lnc, "args": sorted(self.args),
                        "torch_neuronx": TORCH_NEURONX_VERSION, "neuronxcc": self.neuronxcc, "nki": NKI_VERSION,
                        "compile_seconds": round(time.monotonic() - started, 3), "simulated": True}
                (staging / "metadata.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
                (kernel / "kernel.json").write_text(json.dumps({"kernel": kernel.name, "nki": NKI_VERSION}))
                (staging / MARKER).touch()  # last: the sentinel
                os.rename(staging, entry)
            except OSError:
                if not (entry / MARKER).exists():
                    raise
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        return GraphOutcome.COMPILED
