"""Caches laid out the way the runtimes write them, byte for byte, without neffcache."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

VERSION = "2.21.33363.0+82129205"


def flags_file(flags: str, version: str = VERSION, target: str = "trn2") -> tuple[str, bytes]:
    """The flags file libneuronxla of ``version`` writes (NEURON_FACTS.md §1): <= 2.14 the flag
    string in compile_flags.txt; 2.15-2.20 a JSON list; from 2.21 the list led by --target."""
    era = tuple(int(part) for part in version.split("+", maxsplit=1)[0].split(".")[:2])
    if era <= (2, 14):
        return "compile_flags.txt", flags.encode()
    if era <= (2, 20):
        return "compile_flags.json", json.dumps(flags.split()).encode()
    return "compile_flags.json", json.dumps([f"--target={target}", *flags.split()]).encode()


def module_name(hlo: bytes, flags: str = "", version: str = VERSION, target: str = "trn2") -> str:
    """``MODULE_<graph>+<md5 of the flags file>[:8]`` as that runtime names the entry."""
    graph = int.from_bytes(hashlib.sha256(hlo).digest()[:8], "big")
    return f"MODULE_{graph}+{hashlib.md5(flags_file(flags, version, target)[1]).hexdigest()[:8]}"


def write_neuronxcc_entry(
    root: Path,
    hlo: bytes,
    *,
    version: str = VERSION,
    state: str = "SUCCESS",
    flags: str = "--model-type=transformer",
    legacy: bool = False,
    neff: bytes | None = None,
    target: str = "trn2",
) -> Path:
    """One layout-A entry as libneuronxla of ``version`` leaves it (its flags file's form and the
    name's suffix follow the version's era); ``legacy`` = 2.12/2.13 (flags.txt, no done)."""
    # legacy forces the 2.12-2.14 form whatever the version says (a few tests name no version).
    name, data = flags_file(flags, "2.12" if legacy else version, target)
    entry = root / f"neuronxcc-{version}" / module_name(hlo, flags, "2.12" if legacy else version, target)
    entry.mkdir(parents=True, exist_ok=True)
    (root / "lock").touch()
    (entry / "model.hlo_module.pb").write_bytes(hlo)
    (entry / name).write_bytes(data)
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
