"""Cache trees of up to millions of entries for the scan benchmark and the scan test, made fast.

A scan costs per directory entry and per ``stat``, not per byte, so these trees spend nothing
on bytes: every sized file is *sparse* (``ftruncate`` to its size, so the listing reports the
size a real NEFF has while no data block is written, flushed or stored), every empty file is one
``mknod``, and each directory is opened once and filled through ``dir_fd`` (no path is resolved
twice). A plain scan never opens these files; their contents (zeros) are valid for nothing that
reads them (``verify``, ``scan --manifests``).

Layout A (libneuronxla, neffcache/layouts/neuronxcc.py): ``<target>-lnc2/neuronxcc-<ver>/
MODULE_<n>+<flags>/`` with the four files of a committed entry. Layout B (TorchNeuron's native
cache, neffcache/layouts/torchneuron.py): ``trn2-lnc2/torchneuron-<ver>/neff/<k0k1>/<k2k3>/
<key>.neff`` with 32-hex keys spread over the 65,536 shard directories as the runtime's XXH3
keys are (10k entries fill ~10k shards with one NEFF each, 1M fill all of them with ~15), and
for one entry in ``hlo_every`` its lowered HLO at ``hlo/<k0k1>/<k2k3>/<key>.hlo`` (the same key,
so the same entry).

:func:`add_debris` adds what a scan must tell apart from entries (docs/runtimes.md, "Files of
other tools"): neffcache's own temp files (garbage), a layout-B manifest without its NEFF (an
uncommitted write: garbage), the runtime's in-flight ``<key>.neff.tmp.XXXXXX`` (neither entry
nor garbage), and other tools' files (foreign). The scan test counts all of them with ``find``,
not with what this module says it made.
"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from bench.common import VERSION

TARGET_DIR = "trn2-lnc2"
LAYOUT_A_NS = f"{TARGET_DIR}/neuronxcc-{VERSION}"
LAYOUT_B_NS = f"{TARGET_DIR}/torchneuron-{VERSION}"
SHARDS = 1 << 16
_SPREAD = 40503  # odd: i -> i * _SPREAD mod 2**16 is a bijection, so shards fill evenly
_KEY_MIX = 0x9E3779B97F4A7C15F39CC0605CEDC835  # odd: a bijection on the key's low 112 bits
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


@dataclass(frozen=True)
class Built:
    entries: int
    files: int
    dirs: int


def neff_size(i: int, low: int = 100_000, high: int = 20_000_000) -> int:
    """Log-uniform between 100 kB and 20 MB (bench/common.py's neff_sizes), without an RNG."""
    frac = ((i * 2654435761) & 0xFFFFFFFF) / 2**32
    return int(low * math.exp(frac * math.log(high / low)))


def layout_b_key(i: int) -> str:
    """Entry ``i``'s 32-hex key: unique per ``i``, its first four digits its shard."""
    return f"{(i * _SPREAD) & 0xFFFF:04x}{(i * _KEY_MIX) & ((1 << 112) - 1):028x}"


def has_hlo(i: int, every: int) -> bool:
    """Whether entry ``i`` has an HLO: one in ``every``, hashed from all of ``i``'s bits (a rule on
    ``i`` mod 2**16 would put every HLO in the same quarter of the shard directories)."""
    return ((i * 0x9E3779B97F4A7C15) >> 61) % every == 0


def _sized(name: str, size: int, dir_fd: int) -> None:
    fd = os.open(name, _CREATE, 0o644, dir_fd=dir_fd)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def _empty(name: str, dir_fd: int) -> None:
    os.mknod(name, stat.S_IFREG | 0o644, dir_fd=dir_fd)


def _open_dir(path: Path) -> int:
    path.mkdir(parents=True, exist_ok=True)
    return os.open(path, _DIR)


def build_layout_a(root: Path, entries: int, *, start: int = 0, namespace: str = LAYOUT_A_NS) -> Built:
    """``entries`` committed layout-A entries ``MODULE_<start..>+d41d8cd9`` under ``namespace``."""
    ns = _open_dir(root / namespace)
    try:
        for i in range(start, start + entries):
            name = f"MODULE_{i}+d41d8cd9"
            os.mkdir(name, 0o755, dir_fd=ns)
            fd = os.open(name, _DIR, dir_fd=ns)
            try:
                _sized("model.hlo_module.pb", 14_000 + (i * 977) % 200_000, fd)
                _sized("compile_flags.json", 2, fd)  # "[]"'s size; a plain scan never reads it
                _sized("model.neff", neff_size(i), fd)
                _empty("model.done", fd)  # the commit marker, last, as the runtime writes it
            finally:
                os.close(fd)
    finally:
        os.close(ns)
    return Built(entries, 4 * entries, entries)


def build_layout_b(root: Path, entries: int, *, hlo_every: int = 4, namespace: str = LAYOUT_B_NS) -> Built:
    """``entries`` layout-B entries (a NEFF each; an HLO for one in ``hlo_every``), filled one
    shard directory at a time: entry ``i`` lies in shard ``i * _SPREAD mod 2**16``."""
    ns = _open_dir(root / namespace)
    files = dirs = 0
    try:
        for kind in ("neff", "hlo"):
            os.mkdir(kind, 0o755, dir_fd=ns)
            for a in range(256):
                os.mkdir(f"{kind}/{a:02x}", 0o755, dir_fd=ns)
        dirs += 512
        for rank in range(min(entries, SHARDS)):
            shard = (rank * _SPREAD) & 0xFFFF
            members = range(rank, entries, SHARDS)
            made = _fill_shard(ns, "neff", shard, [(f"{layout_b_key(i)}.neff", neff_size(i)) for i in members])
            made += _fill_shard(ns, "hlo", shard, [(f"{layout_b_key(i)}.hlo", 14_000 + (i * 977) % 200_000)
                                                   for i in members if has_hlo(i, hlo_every)])
            files += made
            dirs += 1 + any(has_hlo(i, hlo_every) for i in members)
    finally:
        os.close(ns)
    return Built(entries, files, dirs)


def _fill_shard(ns: int, kind: str, shard: int, files: list[tuple[str, int]]) -> int:
    if not files:
        return 0
    path = f"{kind}/{shard >> 8:02x}/{shard & 0xFF:02x}"
    os.mkdir(path, 0o755, dir_fd=ns)
    fd = os.open(path, _DIR, dir_fd=ns)
    try:
        for name, size in files:
            _sized(name, size, fd)
    finally:
        os.close(fd)
    return len(files)


def add_debris(root: Path, count: int, *, a_entries: int, b_entries: int) -> int:
    """``count`` of each kind of non-entry file a real cache holds, placed beside entries that
    :func:`build_layout_a` (``MODULE_0..``) and :func:`build_layout_b` made; returns the files made.

    Kinds: neffcache's temp files in layout-B shards and layout-A entries (garbage); a layout-B
    manifest whose NEFF was never written (uncommitted: garbage); the runtime's in-flight NEFF
    (ignored); another tool's file in a shard, inside an entry (NxD's ``wrapped_neff.hlo``),
    nested in an entry (optimum-neuron's traced model) and optimum's registry (foreign)."""
    made = 0
    b_ns = root / LAYOUT_B_NS
    registry = root / LAYOUT_A_NS / "0_REGISTRY" / "0.0.28" / "inf2" / "org"
    registry.mkdir(parents=True, exist_ok=True)
    for n in range(count):
        i = (n * 7919) % b_entries
        key = layout_b_key(i)
        shard = b_ns / "neff" / key[0:2] / key[2:4]
        orphan = layout_b_key(b_entries + n)  # a key no entry has
        orphan_dir = b_ns / "neff" / orphan[0:2] / orphan[2:4]
        orphan_dir.mkdir(exist_ok=True)
        module = root / LAYOUT_A_NS / f"MODULE_{(n * 7919) % a_entries}+d41d8cd9"
        (module / "traced").mkdir(exist_ok=True)
        for path, size in (
            (shard / f".{key}.neff.neffcache-tmp-{n:012x}", 4096 + n),  # garbage
            (module / f".model.neff.neffcache-tmp-{n:012x}", 100 + n),  # garbage
            (orphan_dir / f"{orphan}.neffcache.json", 300 + n),  # uncommitted
            (shard / f".tmp.a{n:05d}", 5000 + n),  # the runtime's (its mkstemp in the shard), in flight
            (shard / f"notes-{n}.txt", 10 + n),  # foreign
            (module / f"wrapped_neff-{n}.hlo", 20 + n),  # foreign (NxD)
            (module / "traced" / f"model-{n}.neuron", 30 + n),  # foreign (optimum's traced model)
            (registry / f"model-{n}.json", 40 + n),  # foreign (optimum's registry)
        ):
            fd = os.open(path, _CREATE, 0o644)
            os.ftruncate(fd, size)
            os.close(fd)
            made += 1
    return made
