"""Deterministic stand-in HLO modules (SIMULATION: not real HloModuleProto bytes).

A real ``model.hlo_module.pb`` is a serialized HloModuleProto of 14 kB to 8.7 MB. The
simulated one is a recognizable header line plus pseudo-random filler::

    b"HLOSIM1\\n" + JSON {"model", "bucket", "index", "graph", ...} + b"\\n" + filler

The same (model, bucket, index, size) always gives the same bytes, so two workload runs lower
the same graphs (and hit the cache), and different graphs never collide. The simulated compiler
reads the graph name back from the header to decide which graphs fail or hang.

Kept import-light: the compiler stand-in imports this module on every invocation.
"""

from __future__ import annotations

import hashlib
import json

HLO_MAGIC = b"HLOSIM1\n"
DEFAULT_HLO_BYTES = 20_000
# Filler is one seeded block repeated: generating 8.7 MB must cost milliseconds, not seconds.
_BLOCK_BYTES = 64 * 1024


def graph_name(model: str, bucket: int, index: int) -> str:
    """The name a graph carries in its header, e.g. ``llama-tiny/b128/g0``."""
    return f"{model}/b{bucket}/g{index}"


def filler(seed: bytes, size: int) -> bytes:
    """``size`` deterministic pseudo-random bytes derived from ``seed``."""
    if size <= 0:
        return b""
    block = hashlib.shake_256(seed).digest(min(size, _BLOCK_BYTES))
    repeats = -(-size // len(block))
    return (block * repeats)[:size]


def make_hlo(
    model: str,
    bucket: int,
    index: int,
    size: int = DEFAULT_HLO_BYTES,
    *,
    compile_seconds: float | None = None,
) -> bytes:
    """The simulated HLO of graph ``index`` of ``model`` at shape ``bucket``, about ``size`` bytes.

    ``compile_seconds`` (optional) is recorded in the header; the simulated compiler then
    takes that long for this graph instead of ``NEFFSIM_COMPILE_SECONDS``.
    """
    header: dict[str, object] = {
        "format": "hlosim-1",
        "model": model,
        "bucket": bucket,
        "index": index,
        "graph": graph_name(model, bucket, index),
    }
    if compile_seconds is not None:
        header["compile_seconds"] = compile_seconds
    head = HLO_MAGIC + json.dumps(header, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    return head + filler(head, size - len(head))


def read_hlo_header(data: bytes) -> dict[str, object] | None:
    """The JSON header of simulated HLO bytes, or None if the bytes are not simulated HLO."""
    if not data.startswith(HLO_MAGIC):
        return None
    end = data.find(b"\n", len(HLO_MAGIC))
    if end < 0:
        return None
    try:
        header = json.loads(data[len(HLO_MAGIC) : end])
    except ValueError:
        return None
    return header if isinstance(header, dict) else None


def graph_name_of(data: bytes) -> str | None:
    """The graph name recorded in simulated HLO bytes (None for anything else)."""
    header = read_hlo_header(data)
    name = header.get("graph") if header else None
    return name if isinstance(name, str) else None
