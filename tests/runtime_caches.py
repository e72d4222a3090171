"""Caches laid out the way the runtimes write them, byte for byte, without neffcache."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

VERSION = "2.21.33363.0+82129205"


def module_name(hlo: bytes, flags: str = "") -> str:
    graph = int.from_bytes(hashlib.sha256(hlo).digest()[:8], "big")
    return f"MODULE_{graph}+{hashlib.md5(flags.encode()).hexdigest()[:8]}"


def write_neuronxcc_entry(
    root: Path,
    hlo: bytes,
    *,
    version: str = VERSION,
    state: str = "SUCCESS",
    flags: str = "--model-type=transformer",
    legacy: bool = False,
    neff: bytes | None = None,
) -> Path:
    """One layout-A entry as libneuronxla leaves it; ``legacy`` = 2.12/2.13 (flags.txt, no done)."""
    entry = root / f"neuronxcc-{version}" / module_name(hlo, flags)
    entry.mkdir(parents=True, exist_ok=True)
    (root / "lock").touch()
    (entry / "model.hlo_module.pb").write_bytes(hlo)
    if legacy:
        (entry / "compile_flags.txt").write_text(flags)
    else:
        (entry / "compile_flags.json").write_text(json.dumps(flags.split()))
    if state == "SUCCESS":
        (entry / "model.neff").write_bytes(neff if neff is not None else b"NEFF" + os.urandom(2048))
        if not legacy:
            (entry / "model.done").touch()
    elif state == "FAILED":
        (entry / "model.log").write_text("ERROR: compilation failed: internal error\n")
    elif state == "LOCKED":
        (entry / "model.hlo_module.pb.lock").touch()
    elif state != "EMPTY":
        raise ValueError(state)
    return entry
