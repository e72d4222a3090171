"""SIMULATED TorchNeuron native NEFF cache (the ``torchneuron`` layout, the ``native`` backend).

Per docs/runtimes.md, "torchneuron" (from a public source copy of the native backend; partly
unverified), two writers share one NEFF directory::

    $TORCH_NEURONX_NEFF_CACHE_DIR/<k[0:2]>/<k[2:4]>/<k>.neff   C++ writer: mkstemp <shard>/.tmp.XXXXXX + rename
    $TORCH_NEURONX_NEFF_CACHE_DIR/<K>/<K>.neff                  kernel path: NamedTemporaryFile
                                                                <K>/tmpXXXXXXXX.tmp + rename
    $TORCH_NEURONX_HLO_CACHE_DIR/<k[0:2]>/<k[2:4]>/<k>.hlo  and  <k>.flags.json   (simulation's choice:
                                                           the opt level, then NEURON_CC_FLAGS)
    $TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR/locks/<k>.lock          C++ locks, local disk
    $TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR/<K>/locks/compile.lock  kernel locks, local disk

``k`` is 32 hex: the real runtime takes a 128-bit XXH3 of the op's base key,
``_<target>_<lnc>_<opt>_<args>`` and the IR bytes. xxhash is not a dependency here, so the
simulation uses BLAKE2b with a 16-byte digest over the same inputs as a 128-bit stand-in
(:func:`native_key`). ``K`` is 64 hex: a sha256 of the HLO's digest and a config that includes
the compiler version (:func:`kernel_key`). Both are computed here, independently of neffcache's
own code: neffcache must read these keys, never compute them.

Log lines carry the op's readable key, not the file name, and come from an **in-process
dictionary** consulted before the disk cache: the first lookup of an op in a process prints
``[NEFF_CACHE] Cache MISS for key: aten::mm_t0_(128, 64)_llama-tiny_g0`` whether or not the disk
holds its NEFF (a disk hit prints nothing more); a compile ends with ``[NEFF_CACHE] Storing NEFF
for key: ...``; every later lookup in the same process prints ``Cache HIT``. The kernel path
prints none of these. A failed compile has no line of that form: the runtime raises, which the
simulation prints as a ``RuntimeError`` line before exiting 1. Failures are not cached: the
next run compiles the graph again. A waiter on a lock gives up after
``TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT`` seconds (default 1200), deletes the lock and retries.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import string
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from neffcache.testing._files import atomic_write, create_exclusive
from neffcache.testing._runtime import CompilerRunner, GraphOutcome, WorkloadLog, wait_for_unlock
from neffcache.testing.hlo import read_hlo_header
from neffcache.toolchain import Toolchain

LOCK_BREAK_SECONDS = 1200.0  # TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT's default: a waiter's, not an age
DEFAULT_OPT = "-O1"  # NEURON_COMPILER_OPT_LEVEL's default
FIXED_ARGS = ("--model-type", "transformer", "--auto-cast=none")
_OPS = ("mm", "add", "gelu", "softmax", "layer_norm", "bmm")
_TEMP_CHARS = string.ascii_letters + string.digits
_KERNEL_TEMP_CHARS = string.ascii_lowercase + string.digits + "_"  # tempfile's own alphabet


def shard(root: Path, key: str, suffix: str) -> Path:
    return root / key[0:2] / key[2:4] / f"{key}{suffix}"


def op_key(hlo: bytes) -> str:
    """The readable base key the runtime logs for a graph, e.g. ``aten::mm_t0_(128, 64)_llama-tiny_g0``."""
    header = read_hlo_header(hlo) or {}
    index = header.get("index")
    i = index if isinstance(index, int) else 0
    name = f"{header.get('model')}_g{i}" if header else hashlib.sha256(hlo).hexdigest()[:8]
    return f"aten::{_OPS[i % len(_OPS)]}_t0_({header.get('bucket', 1)}, 64)_{name}"


def native_key(base: str, toolchain: Toolchain, flags: Sequence[str], hlo: bytes, opt: str = DEFAULT_OPT) -> str:
    """32 hex: a BLAKE2b-128 stand-in for the runtime's XXH3-128 of base key, config and IR.
    The config is ``_<target>_<lnc>_<opt>_<args>``: ``opt`` from ``NEURON_COMPILER_OPT_LEVEL``,
    ``args`` the fixed arguments and ``$NEURON_CC_FLAGS`` (``flags``), so both change every key."""
    args = " ".join([*FIXED_ARGS, *flags])
    config = f"{base}_{toolchain.target}_{toolchain.lnc}_{opt}_{args}"
    h = hashlib.blake2b(config.encode(), digest_size=16)
    h.update(hlo)
    return h.hexdigest()


def kernel_key(hlo: bytes, toolchain: Toolchain, flags: Sequence[str]) -> str:
    """64 hex: the kernel path's sha256 over the HLO's digest and its config (compiler version
    included)."""
    config = json.dumps({"compiler": toolchain.compiler_version, "target": toolchain.target,
                         "lnc": toolchain.lnc, "flags": list(flags)}, sort_keys=True)
    digest = hashlib.sha256(hlo).hexdigest() + hashlib.sha256(config.encode()).hexdigest()
    return hashlib.sha256(digest.encode()).hexdigest()


def _owner_is_dead(lock: Path) -> bool:
    # The real cache uses flock on local disk, which the kernel drops when its owner dies. Our
    # O_EXCL lock files hold the owner's pid instead, so a dead owner's lock is broken the same
    # way. (Two waiters may both break it and both compile: harmless, rename wins.)
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


class NativeCache:
    """One workload's view of a TorchNeuron NEFF directory (plus optional HLO directory): both
    writers, and the process's in-memory dictionary in front of them."""

    def __init__(
        self,
        neff_dir: Path,
        *,
        hlo_dir: Path | None,
        local_dir: Path,
        toolchain: Toolchain,
        flags: Sequence[str],
        log: WorkloadLog,
        runner: CompilerRunner,
        lock_timeout: float | None,
        lock_report_every: float,
        lock_break_after: float = LOCK_BREAK_SECONDS,
        opt: str = DEFAULT_OPT,
        disk: bool = True,
    ) -> None:
        self.neff_dir = neff_dir
        self.hlo_dir = hlo_dir
        self.local_dir = local_dir
        self.lock_dir = local_dir / "locks"
        self.work_dir = local_dir / "work"
        self.toolchain = toolchain
        self.flags = list(flags)
        self.log = log
        self.runner = runner
        self.lock_timeout = lock_timeout
        self.lock_report_every = lock_report_every
        self.lock_break_after = lock_break_after  # TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT
        self.opt = opt  # NEURON_COMPILER_OPT_LEVEL
        self.disk = disk  # False: TORCH_NEURONX_NEFF_DISABLE_CACHE, every graph compiles, none is kept
        self._memory: set[str] = set()  # the in-process dictionary (ops already loaded)
        self._memory_lock = threading.Lock()

    def open(self) -> None:
        for path in (self.neff_dir, self.lock_dir, self.work_dir):
            path.mkdir(parents=True, exist_ok=True)
        if self.hlo_dir is not None:
            self.hlo_dir.mkdir(parents=True, exist_ok=True)

    def key(self, hlo: bytes) -> str:
        return native_key(op_key(hlo), self.toolchain, self.flags, hlo, self.opt)

    def lookup_or_compile(self, hlo: bytes) -> GraphOutcome:
        """The C++ writer: the in-process dictionary, then the disk, then a compile."""
        key, base = self.key(hlo), op_key(hlo)
        with self._memory_lock:
            known = key in self._memory
        if known:
            self.log.line(f"[NEFF_CACHE] Cache HIT for key: {base}")  # the process had it already
            return GraphOutcome.HIT
        self.log.line(f"[NEFF_CACHE] Cache MISS for key: {base}")  # not in memory: the disk decides
        if not self.disk:
            outcome = self._compile(key, base, hlo, None, kernel=False)
            if outcome is not GraphOutcome.FAILED:
                with self._memory_lock:
                    self._memory.add(key)
            return outcome
        self._store_hlo(key, hlo)
        outcome = self._from_disk_or_compile(shard(self.neff_dir, key, ".neff"), self.lock_dir / f"{key}.lock",
                                             base, lambda neff: self._compile(key, base, hlo, neff, kernel=False))
        if outcome is not GraphOutcome.FAILED:
            with self._memory_lock:
                self._memory.add(key)
        return outcome

    def lookup_or_compile_kernel(self, hlo: bytes) -> GraphOutcome:
        """The Python kernel path: ``<K>/<K>.neff``, its lock under ``<local>/<K>/locks``, no log lines."""
        key = kernel_key(hlo, self.toolchain, self.flags)
        if not self.disk:
            return self._compile(key, f"kernel {key[:12]}", hlo, None, kernel=True)
        lock = self.local_dir / key / "locks" / "compile.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        return self._from_disk_or_compile(self.neff_dir / key / f"{key}.neff", lock, f"kernel {key[:12]}",
                                          lambda neff: self._compile(key, f"kernel {key[:12]}", hlo, neff, kernel=True))

    def _from_disk_or_compile(self, neff: Path, lock: Path, what: str,
                              compile_into: Callable[[Path], GraphOutcome]) -> GraphOutcome:
        if neff.exists():
            return GraphOutcome.HIT
        waiting_since = time.monotonic()
        while not create_exclusive(lock, f"{os.getpid()}\n".encode()):
            if not wait_for_unlock(
                lock,
                timeout=self.lock_timeout,
                report_every=self.lock_report_every,
                report=lambda waited: self.log.line(
                    f"neffcache.testing.workload: (simulated) waiting for lock {lock} ({waited} seconds)"
                ),
                stopping=self.runner.stopping,
                # A waiter breaks the lock after its timeout (the real one deletes it and retries),
                # or when the owner is gone (flock dies with its process).
                is_stale=lambda: _owner_is_dead(lock) or time.monotonic() - waiting_since >= self.lock_break_after,
            ):
                self.log.line(f"RuntimeError: {what}: timed out waiting for lock {lock} (simulated)")
                return GraphOutcome.FAILED
        try:
            if neff.exists():  # another process stored it while we waited
                return GraphOutcome.HIT
            return compile_into(neff)
        finally:
            lock.unlink(missing_ok=True)

    def _store_hlo(self, key: str, hlo: bytes) -> None:
        # Kept beside the NEFFs so a compiler bump can recompile every graph (neffcache rewarm).
        if self.hlo_dir is None:
            return
        hlo_path = shard(self.hlo_dir, key, ".hlo")
        if hlo_path.exists():
            return
        hlo_path.parent.mkdir(parents=True, exist_ok=True)
        # The flags the graph is compiled with: the opt level first, then NEURON_CC_FLAGS.
        atomic_write(hlo_path.with_name(f"{key}.flags.json"), json.dumps([self.opt, *self.flags]).encode())
        atomic_write(hlo_path, hlo)

    def _compile(self, key: str, base: str, hlo: bytes, neff: Path | None, *, kernel: bool) -> GraphOutcome:
        # Compile on local disk, then copy into the shared directory under the writer's temp name
        # (``neff`` None: the disk cache is off, the NEFF is used and dropped).
        stem = f"{key}.{os.getpid()}.{os.urandom(4).hex()}"
        work_hlo, work_neff = self.work_dir / f"{stem}.hlo_module.pb", self.work_dir / f"{stem}.neff"
        try:
            work_hlo.write_bytes(hlo)
            tc = self.toolchain
            cmd = ["neuronx-cc", "compile", str(work_hlo), "--framework", "XLA", "--target", tc.target,
                   "--lnc", str(tc.lnc), "--output", str(work_neff), self.opt, *self.flags]
            status, output = self.runner.run(cmd)
            if status != 0 or not work_neff.exists():
                lines = [ln for ln in output.strip().splitlines() if ln.strip()]
                reason = lines[0] if lines else f"exit status {status}"
                # No [NEFF_CACHE] line: the real backend raises.
                self.log.line(f"RuntimeError: neuronx-cc failed to compile {base}: {reason}")
                return GraphOutcome.FAILED
            if neff is None:
                return GraphOutcome.COMPILED
            if not kernel:
                self.log.line(f"[NEFF_CACHE] Storing NEFF for key: {base}")
            neff.parent.mkdir(parents=True, exist_ok=True)
            tmp = _kernel_temp(neff.parent) if kernel else _mkstemp(neff.parent)
            try:
                shutil.copyfile(work_neff, tmp)
                os.replace(tmp, neff)
            finally:
                tmp.unlink(missing_ok=True)
            return GraphOutcome.COMPILED
        finally:
            work_hlo.unlink(missing_ok=True)
            work_neff.unlink(missing_ok=True)


def _mkstemp(directory: Path) -> Path:
    """The C++ writer's ``<shard>/.tmp.XXXXXX``, created exclusively (mkstemp's six characters)."""
    while True:
        tmp = directory / f".tmp.{''.join(secrets.choice(_TEMP_CHARS) for _ in range(6))}"
        if create_exclusive(tmp):
            return tmp


def _kernel_temp(directory: Path) -> Path:
    """The kernel path's ``NamedTemporaryFile(dir=<K>, suffix=".tmp")``: ``tmpXXXXXXXX.tmp``."""
    while True:
        tmp = directory / f"tmp{''.join(secrets.choice(_KERNEL_TEMP_CHARS) for _ in range(8))}.tmp"
        if create_exclusive(tmp):
            return tmp
