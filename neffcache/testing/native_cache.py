"""SIMULATED TorchNeuron native NEFF cache (layout B, the ``native`` backend).

Per NEURON_FACTS.md §1 (details partly unverified upstream)::

    $TORCH_NEURONX_NEFF_CACHE_DIR/<k[0:2]>/<k[2:4]>/<k>.neff
    $TORCH_NEURONX_HLO_CACHE_DIR/<k[0:2]>/<k[2:4]>/<k>.hlo  and  <k>.flags.json
    $TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR/locks/<k>.lock     (local disk, never the shared mount)

``k`` is :func:`neffcache.keys.cache_key` (HLO bytes, sorted flags, compiler version, target,
LNC). Failures are not cached: the next run compiles the graph again.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from neffcache.keys import cache_key
from neffcache.testing._files import atomic_write, create_exclusive
from neffcache.testing._runtime import COMPILED, FAILED, HIT, CompilerRunner, WorkloadLog, wait_for_unlock
from neffcache.toolchain import Toolchain


def shard(root: Path, key: str, suffix: str) -> Path:
    return root / key[0:2] / key[2:4] / f"{key}{suffix}"


def _owner_is_dead(lock: Path) -> bool:
    # The real cache uses flock on local disk, which the kernel drops when its owner dies.
    # Our O_EXCL lock files hold the owner's pid instead, so a dead owner's lock is broken
    # the same way. (Two waiters may both break it and both compile: harmless, rename wins.)
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
        return cache_key(hlo, self.flags, self.toolchain)

    def lookup_or_compile(self, hlo: bytes) -> str:
        key = self.key(hlo)
        self._store_hlo(key, hlo)
        neff = shard(self.neff_dir, key, ".neff")
        if neff.exists():
            self.log.line(f"[NEFF_CACHE] Cache HIT for key: {key}")
            return HIT
        self.log.line(f"[NEFF_CACHE] Cache MISS for key: {key}")
        lock = self.lock_dir / f"{key}.lock"
        while not create_exclusive(lock, f"{os.getpid()}\n".encode()):
            if not wait_for_unlock(
                lock,
                timeout=self.lock_timeout,
                report_every=self.lock_report_every,
                report=lambda waited: self.log.line(
                    f"[NEFF_CACHE] Waiting for lock on key: {key} ({waited} seconds)"
                ),
                stopping=self.runner.stopping,
                is_stale=lambda: _owner_is_dead(lock),
            ):
                self.log.line(f"[NEFF_CACHE] Compilation FAILED for key: {key}: timed out waiting for {lock}")
                return FAILED
        try:
            if neff.exists():  # another process stored it while we waited
                self.log.line(f"[NEFF_CACHE] Cache HIT for key: {key}")
                return HIT
            return self._compile(key, hlo, neff)
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

    def _compile(self, key: str, hlo: bytes, neff: Path) -> str:
        # Compile on local disk, then copy into the shared directory under a temp name.
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
                self.log.line(f"[NEFF_CACHE] Compilation FAILED for key: {key}: {reason}")
                return FAILED
            self.log.line(f"[NEFF_CACHE] Storing NEFF for key: {key}")
            neff.parent.mkdir(parents=True, exist_ok=True)
            tmp = neff.with_name(f".{neff.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
            try:
                shutil.copyfile(work_neff, tmp)
                os.replace(tmp, neff)
            finally:
                tmp.unlink(missing_ok=True)
            return COMPILED
        finally:
            work_hlo.unlink(missing_ok=True)
            work_neff.unlink(missing_ok=True)
