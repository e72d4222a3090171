"""SIMULATED TorchNeuron native NEFF cache (layout B, the ``native`` backend).

Per docs/runtimes.md, "Layout B" (from a public source copy of the native backend; partly unverified)::

    $TORCH_NEURONX_NEFF_CACHE_DIR/<k[0:2]>/<k[2:4]>/<k>.neff        written as <k>.neff.tmp.XXXXXX + rename
    $TORCH_NEURONX_HLO_CACHE_DIR/<k[0:2]>/<k[2:4]>/<k>.hlo  and  <k>.flags.json   (simulation's choice)
    $TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR/locks/<k>.lock     local disk, never the shared mount;
                                                           broken after 1200 s (or a dead owner)

``k`` is 32 hex: the real runtime takes a 128-bit XXH3 of the op's base key,
``_<target>_<lnc>_<opt>_<flags>`` and the IR bytes. xxhash is not a dependency here, so the
simulation uses BLAKE2b with a 16-byte digest over the same inputs as a 128-bit stand-in
(:func:`native_key`). It is computed here, independently of neffcache's own code: neffcache
must read these keys, never compute them.

Log lines carry the op's readable key, not the file name:
``[NEFF_CACHE] Cache HIT|MISS for key: aten::mm_t0_(128, 64)_llama-tiny_g0`` and
``[NEFF_CACHE] Storing NEFF for key: ...``. A failed compile has no line of that form: the
runtime raises, which the simulation prints as a ``RuntimeError`` line before exiting 1.
Failures are not cached: the next run compiles the graph again.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import string
import time
from collections.abc import Sequence
from pathlib import Path

from neffcache.testing._files import atomic_write, create_exclusive
from neffcache.testing._runtime import CompilerRunner, GraphOutcome, WorkloadLog, wait_for_unlock
from neffcache.testing.hlo import read_hlo_header
from neffcache.toolchain import Toolchain

LOCK_BREAK_SECONDS = 1200.0
_OPS = ("mm", "add", "gelu", "softmax", "layer_norm", "bmm")
_TEMP_CHARS = string.ascii_letters + string.digits


def shard(root: Path, key: str, suffix: str) -> Path:
    return root / key[0:2] / key[2:4] / f"{key}{suffix}"


def op_key(hlo: bytes) -> str:
    """The readable base key the runtime logs for a graph, e.g. ``aten::mm_t0_(128, 64)_llama-tiny_g0``."""
    header = read_hlo_header(hlo) or {}
    index = header.get("index")
    i = index if isinstance(index, int) else 0
    name = f"{header.get('model')}_g{i}" if header else hashlib.sha256(hlo).hexdigest()[:8]
    return f"aten::{_OPS[i % len(_OPS)]}_t0_({header.get('bucket', 1)}, 64)_{name}"


def native_key(base: str, toolchain: Toolchain, flags: Sequence[str], hlo: bytes) -> str:
    """32 hex: a BLAKE2b-128 stand-in for the runtime's XXH3-128 of base key, config and IR."""
    opt = next((f.split("=", 1)[1] for f in flags if f.startswith("-O") and "=" in f), "2")
    config = f"{base}_{toolchain.target}_{toolchain.lnc}_{opt}_{' '.join(flags)}"
    h = hashlib.blake2b(config.encode(), digest_size=16)
    h.update(hlo)
    return h.hexdigest()


def _owner_is_dead(lock: Path) -> bool:
    # The real cache uses flock on local disk, which the kernel drops when its owner dies, and
    # breaks a lock older than 1200 s. Our O_EXCL lock files hold the owner's pid instead, so a
    # dead owner's lock is broken the same way. (Two waiters may both break it and both
    # compile: harmless, rename wins.)
    try:
        if time.time() - lock.stat().st_mtime > LOCK_BREAK_SECONDS:
            return True
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
    """One workload's view of a layout-B NEFF directory (plus optional HLO directory)."""

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
    ) -> None:
        self.neff_dir = neff_dir
        self.hlo_dir = hlo_dir
        self.lock_dir = local_dir / "locks"
        self.work_dir = local_dir / "work"
        self.toolchain = toolchain
        self.flags = list(flags)
        self.log = log
        self.runner = runner
        self.lock_timeout = lock_timeout
        self.lock_report_every = lock_report_every

    def open(self) -> None:
        for path in (self.neff_dir, self.lock_dir, self.work_dir):
            path.mkdir(parents=True, exist_ok=True)
        if self.hlo_dir is not None:
            self.hlo_dir.mkdir(parents=True, exist_ok=True)

    def key(self, hlo: bytes) -> str:
        return native_key(op_key(hlo), self.toolchain, self.flags, hlo)

    def lookup_or_compile(self, hlo: bytes) -> GraphOutcome:
        key, base = self.key(hlo), op_key(hlo)
        self._store_hlo(key, hlo)
        neff = shard(self.neff_dir, key, ".neff")
        if neff.exists():
            self.log.line(f"[NEFF_CACHE] Cache HIT for key: {base}")
            return GraphOutcome.HIT
        self.log.line(f"[NEFF_CACHE] Cache MISS for key: {base}")
        lock = self.lock_dir / f"{key}.lock"
        while not create_exclusive(lock, f"{os.getpid()}\n".encode()):
            if not wait_for_unlock(
                lock,
                timeout=self.lock_timeout,
                report_every=self.lock_report_every,
                report=lambda waited: self.log.line(
                    f"neffcache.testing.workload: (simulated) waiting for lock {lock} ({waited} seconds)"
                ),
                stopping=self.runner.stopping,
                is_stale=lambda: _owner_is_dead(lock),
            ):
                self.log.line(f"RuntimeError: {base}: timed out waiting for lock {lock} (simulated)")
                return GraphOutcome.FAILED
        try:
            if neff.exists():  # another process stored it while we waited
                self.log.line(f"[NEFF_CACHE] Cache HIT for key: {base}")
                return GraphOutcome.HIT
            return self._compile(key, base, hlo, neff)
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
        atomic_write(hlo_path.with_name(f"{key}.flags.json"), json.dumps(self.flags).encode())
        atomic_write(hlo_path, hlo)

    def _compile(self, key: str, base: str, hlo: bytes, neff: Path) -> GraphOutcome:
        # Compile on local disk, then copy into the shared directory under the runtime's temp name.
        stem = f"{key}.{os.getpid()}.{os.urandom(4).hex()}"
        work_hlo, work_neff = self.work_dir / f"{stem}.hlo_module.pb", self.work_dir / f"{stem}.neff"
        try:
            work_hlo.write_bytes(hlo)
            tc = self.toolchain
            cmd = ["neuronx-cc", "compile", str(work_hlo), "--framework", "XLA", "--target", tc.target,
                   "--lnc", str(tc.lnc), "--output", str(work_neff), *self.flags]
            status, output = self.runner.run(cmd)
            if status != 0 or not work_neff.exists():
                lines = [ln for ln in output.strip().splitlines() if ln.strip()]
                reason = lines[0] if lines else f"exit status {status}"
                # No [NEFF_CACHE] line: the real backend raises.
                self.log.line(f"RuntimeError: neuronx-cc failed to compile {base}: {reason}")
                return GraphOutcome.FAILED
            self.log.line(f"[NEFF_CACHE] Storing NEFF for key: {base}")
            neff.parent.mkdir(parents=True, exist_ok=True)
            tmp = _temp_beside(neff)
            try:
                shutil.copyfile(work_neff, tmp)
                os.replace(tmp, neff)
            finally:
                tmp.unlink(missing_ok=True)
            return GraphOutcome.COMPILED
        finally:
            work_hlo.unlink(missing_ok=True)
            work_neff.unlink(missing_ok=True)


def _temp_beside(neff: Path) -> Path:
    """``<key>.neff.tmp.XXXXXX``, created exclusively (mkstemp's six characters)."""
    while True:
        tmp = neff.with_name(f"{neff.name}.tmp.{''.join(secrets.choice(_TEMP_CHARS) for _ in range(6))}")
        if create_exclusive(tmp):
            return tmp
