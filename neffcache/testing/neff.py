"""Simulated NEFF bytes (SIMULATION: not a loadable Neuron Executable File Format).

Layout::

    b"NEFFSIM1\\n" + JSON header + b"\\n" + padding up to the requested size

The header names what built it (compiler version, target, LNC, codegen flags, the HLO's
sha256 and graph name), so tests can check that the right toolchain produced an entry. Every
byte is a function of those inputs only (no time, pid or path), like a reproducible compile:
two compiles of the same graph with the same toolchain give identical NEFFs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from neffcache.testing.hlo import filler

NEFF_MAGIC = b"NEFFSIM1\n"
# Real NEFFs range from 144 kB to 17.5 MB for the graphs we simulate (docs/runtimes.md, "Sizes").
MIN_NEFF_BYTES = 144 * 1024
MAX_NEFF_BYTES = 20 * 1024 * 1024


def default_neff_size(hlo_size: int) -> int:
    """About ten times the HLO, clamped to the range real NEFFs have."""
    return max(MIN_NEFF_BYTES, min(MAX_NEFF_BYTES, 10 * hlo_size))


def build_neff(
    hlo: bytes,
    *,
    compiler_version: str,
    target: str,
    lnc: int,
    flags: Sequence[str],
    graph: str | None = None,
    size: int | None = None,
) -> bytes:
    """The NEFF the simulated compiler produces for ``hlo`` with this toolchain and flags."""
    header = {
        "format": "neffsim-1",
        "compiler_version": compiler_version,
        "target": target,
        "lnc": lnc,
        "flags": sorted(flags),
        "hlo_sha256": hashlib.sha256(hlo).hexdigest(),
        "graph": graph,
        "simulated": True,
    }
    head = NEFF_MAGIC + json.dumps(header, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    total = default_neff_size(len(hlo)) if size is None else size
    return head + filler(hashlib.sha256(head).digest(), total - len(head))


def read_neff_header(data: bytes) -> dict[str, object] | None:
    """The header of simulated NEFF bytes, or None if they are not a simulated NEFF."""
    if not data.startswith(NEFF_MAGIC):
        return None
    end = data.find(b"\n", len(NEFF_MAGIC))
    if end < 0:
        return None
    try:
        header = json.loads(data[len(NEFF_MAGIC) : end])
    except ValueError:
        return None
    return header if isinstance(header, dict) else None
