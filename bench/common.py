"""Helpers shared by the benchmarks: realistic fake caches, timing, printing ratios."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

VERSION = "2.27.5334.0+f702b353"


MAX_NEFF = 20_000_000  # the largest NEFF of a realistic cache (the log-uniform tail)


def neff_sizes(count: int, seed: int = 7, low: int = 100_000, high: int = MAX_NEFF) -> list[int]:
    """Log-uniform sizes between 100 kB and 20 MB: most NEFFs are small, a few are large."""
    rng = random.Random(seed)
    return [int(math.exp(rng.uniform(math.log(low), math.log(high)))) for _ in range(count)]


def make_runtime_cache(root: Path, count: int, *, seed: int = 7, prefix: str = "trn2-lnc2",
                       max_neff: int = MAX_NEFF) -> int:
    """A layout-A cache as libneuronxla writes it (no manifests); returns the bytes written."""
    total = 0
    block = os.urandom(1 << 20)
    for i, size in enumerate(neff_sizes(count, seed, high=max_neff)):
        graph = int(hashlib.sha256(f"{seed}-{i}".encode()).hexdigest()[:15], 16)
        entry = root / prefix / f"neuronxcc-{VERSION}" / f"MODULE_{graph}+d41d8cd9"
        entry.mkdir(parents=True, exist_ok=True)
        hlo = block[: 14_000 + (i * 977) % 200_000]
        neff = (block * (size // len(block) + 1))[:size]
        # Vary the first bytes so no two NEFFs are identical.
        neff = f"NEFF{i:08d}".encode() + neff[12:]
        (entry / "model.hlo_module.pb").write_bytes(hlo)
        (entry / "compile_flags.json").write_text(json.dumps([]))
        (entry / "model.neff").write_bytes(neff)
        (entry / "model.done").touch()
        total += len(hlo) + len(neff) + 2
    return total


# Runs ``neffcache`` and writes its own peak RSS (VmHWM, kB) to argv[1] as it exits. wait4's
# ru_maxrss would not do: a child spawned by a big process inherits that process's peak.
HWM_LAUNCHER = """
import atexit, re, runpy, sys
out = sys.argv.pop(1)
def record():
    status = open("/proc/self/status").read()
    open(out, "w").write(re.search(r"VmHWM:\\s+(\\d+) kB", status).group(1))
atexit.register(record)
sys.argv[0] = "neffcache"
runpy.run_module("neffcache.cli.main", run_name="__main__")
"""


def neffcache_measured(hwm: Path, args: list[str]) -> list[str]:
    """The command line running ``neffcache *args`` that leaves its peak RSS (kB) in ``hwm``."""
    compile_package()
    return [sys.executable, "-c", HWM_LAUNCHER, str(hwm), *args]


@functools.cache
def compile_package() -> None:
    """Write the bytecode of neffcache's modules once, as installing its wheel does. With
    ``PYTHONDONTWRITEBYTECODE=1`` in the environment (our machines set it) an editable install
    compiles every module it imports again in each process: 0.5 s of each command's start-up
    that an installed copy does not pay. ``py_compile`` writes regardless of that variable."""
    import compileall
    import importlib

    for package in ("neffcache", "neffcache.cli", "neffcache.server", "neffcache.warmers"):
        folder = Path(importlib.import_module(package).__file__ or ".").parent
        compileall.compile_dir(folder, quiet=1)


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} / {five:.1f} / {fifteen:.1f}"


@dataclass
class Timing:
    label: str
    seconds: float
    cpu: float = 0.0  # user+sys seconds of this process and of the children it waited for


def cpu_seconds() -> float:
    """User+sys seconds so far of this process and its waited-for children (``rm -rf``): on a
    shared machine the wall seconds measure the neighbours too, these do not."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@contextmanager
def timed(label: str, out: list[Timing]) -> Iterator[None]:
    start, cpu = time.perf_counter(), cpu_seconds()
    yield
    out.append(Timing(label, time.perf_counter() - start, cpu_seconds() - cpu))


def sh(cmd: str) -> None:
    subprocess.run(["bash", "-c", cmd], check=True)


def drop_caches_if_root() -> None:
    """Best effort: equal footing for baseline and neffcache (needs root; ignored otherwise)."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        pass


def best_of(n: int, fn: Callable[[], float]) -> float:
    return min(fn() for _ in range(n))


def print_ratio(title: str, ours: float, baseline: float, baseline_label: str, extra: str = "") -> None:
    print(f"{title}: neffcache {ours:.3f}s vs {baseline_label} {baseline:.3f}s "
          f"-> ratio {ours / baseline:.2f}x {extra}".rstrip())
