"""Layout B and C caches laid out as TorchNeuron's native backend and vLLM-Neuron write them,
byte for byte, without neffcache (docs/runtimes.md, "Layout B"). Independent of neffcache.layouts on
purpose: the layouts are checked against these, not against themselves."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

VERSION = "2.21.33363.0+82129205"


def native_key(op_key: str) -> str:
    """A 32-hex (128-bit) key standing in for the runtime's XXH3 of op key + config + IR."""
    return hashlib.md5(op_key.encode(), usedforsecurity=False).hexdigest()


def write_native_neff(neff_dir: Path, op_key: str, data: bytes | None = None) -> Path:
    """``<dir>/ab/cd/<32 hex>.neff``, as TorchNeuron stores it (temp name + rename)."""
    key = native_key(op_key)
    path = neff_dir / key[:2] / key[2:4] / f"{key}.neff"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{key}.neff.tmp.{os.urandom(3).hex()}")
    tmp.write_bytes(data if data is not None else b"NEFF" + os.urandom(512))
    os.replace(tmp, path)
    return path


def write_native_temp(neff_dir: Path, op_key: str) -> Path:
    """A write in flight (or a dead writer's leftover): ``<key>.neff.tmp.XXXXXX``."""
    key = native_key(op_key)
    path = neff_dir / key[:2] / key[2:4] / f"{key}.neff.tmp.a1B2c3"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"NEFF-partial")
    return path


def write_vllm_entry(cache_root: Path, name: str, *, complete: bool = True) -> Path:
    """``$VLLM_CACHE_ROOT/neuron/compile_cache/<hash>/`` with artifacts (nested too) and the
    ``.compilation_complete`` marker, written last."""
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    entry = cache_root / "neuron" / "compile_cache" / digest
    (entry / "context_encoding_model" / "_tp0_bk0").mkdir(parents=True, exist_ok=True)
    (entry / "token_generation_model" / "_tp0_bk0").mkdir(parents=True, exist_ok=True)
    (entry / "model.pt").write_bytes(b"TORCHSCRIPT" + os.urandom(256))
    (entry / "neuron_config.json").write_text(json.dumps({"tp_degree": 1, "batch_size": 1, "name": name}))
    (entry / "context_encoding_model" / "_tp0_bk0" / "model.neff").write_bytes(b"NEFF" + os.urandom(300))
    (entry / "context_encoding_model" / "_tp0_bk0" / "model.hlo_module.pb").write_bytes(os.urandom(200))
    (entry / "token_generation_model" / "_tp0_bk0" / "model.neff").write_bytes(b"NEFF" + os.urandom(300))
    if complete:
        (entry / ".compilation_complete").touch()
    return entry


def all_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
