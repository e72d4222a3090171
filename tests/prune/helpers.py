"""Caches for the prune tests, written through the store API so every backend gets the same ones."""

from __future__ import annotations

import hashlib
import json
import os
import time

from neffcache.layouts import get_layout
from neffcache.layouts.torchneuron import shard
from neffcache.manifest import Manifest
from neffcache.operations.cache import NeffCache
from neffcache.operations.ingest import build_manifest
from neffcache.operations.publish import publish
from neffcache.outcomes import PublishStatus
from neffcache.stores.base import Store
from neffcache.stores.local import LocalStore
from neffcache.toolchain import Toolchain
from tests.runtime_caches import module_name, write_neuronxcc_entry

OLD = "2.21.33363.0+82129205"
NEW = "2.27.5334.0+f702b353"
LEGACY = "2.12.1.0+0a1b2c3d"
TC_NEW = Toolchain(NEW, "trn2", 2)
TC_OLD = Toolchain(OLD, "trn2", 2)
TC_OLD_TRN1 = Toolchain(OLD, "trn1", 1)


def runtime_a(store: Store, hlo: bytes, *, version: str = OLD, state: str = "SUCCESS", prefix: str = "",
              legacy: bool = False) -> str:
    """A layout-A entry exactly as libneuronxla writes it (no manifest); returns its entry path.

    On a local store the bytes come from tests.runtime_caches (the reference); elsewhere the same
    files go through the store API in the runtime's order (libneuronxla's S3 backend uploads the
    same relative files)."""
    if isinstance(store, LocalStore):
        entry = write_neuronxcc_entry(store.root / prefix if prefix else store.root, hlo, version=version,
                                      state=state, legacy=legacy)
        return str(entry.relative_to(store.root))
    flags = "--model-type=transformer"
    base = f"{prefix + '/' if prefix else ''}neuronxcc-{version}/{module_name(hlo, flags)}"
    store.put_file(f"{base}/model.hlo_module.pb", hlo)
    if legacy:
        store.put_file(f"{base}/compile_flags.txt", flags.encode())
    else:
        store.put_file(f"{base}/compile_flags.json", json.dumps(flags.split()).encode())
    if state == "SUCCESS":
        store.put_file(f"{base}/model.neff", b"NEFF" + os.urandom(2048))
        if not legacy:
            store.put_file(f"{base}/model.done", b"")
    elif state == "FAILED":
        store.put_file(f"{base}/model.log", b"ERROR: compilation failed: internal error\n")
    elif state == "LOCKED":
        store.put_file(f"{base}/model.hlo_module.pb.lock", b"")
    return base


def published_a(store: Store, key: str, toolchain: Toolchain = TC_NEW, size: int = 4096) -> str:
    """A layout-A entry published by neffcache (manifest, target directory)."""
    layout = get_layout("neuronxcc")
    ns = layout.namespace_for(toolchain)
    files: dict[str, bytes] = {"model.hlo_module.pb": b"HLO:" + key.encode(), "compile_flags.json": b"[]",
                               "model.neff": b"NEFF" + os.urandom(size), "model.done": b""}
    manifest = build_manifest("neuronxcc", key, files, toolchain=toolchain)
    assert publish(store, ns, key, files, manifest).status is PublishStatus.PUBLISHED
    return f"{ns.path}/{key}"


def published_b(store: Store, hlo: bytes, toolchain: Toolchain = TC_NEW) -> str:
    """A layout-B entry published through NeffCache (versioned namespace)."""
    cache = NeffCache(store)
    assert cache.put(hlo, ["-O2"], toolchain, b"NEFF-B" + os.urandom(1024)).ok
    entry = cache.entry(cache.key(hlo, ["-O2"], toolchain), toolchain)
    assert entry is not None
    return entry.path


def bare_b(store: Store, seed: str, toolchain: Toolchain | None = None) -> str:
    """A NEFF a job wrote straight into a bare TORCH_NEURONX_NEFF_CACHE_DIR (``ab/cd/<key>.neff``),
    with a neffcache manifest beside it when ``toolchain`` is given."""
    key = hashlib.sha256(seed.encode()).hexdigest()
    neff = b"NEFF-bare" + os.urandom(512)
    if toolchain is not None:
        manifest = build_manifest("torchneuron", key, {f"{shard(key)}.neff": neff}, toolchain=toolchain)
        store.put_file(f"{shard(key)}.neffcache.json", manifest.to_bytes())
    store.put_file(f"{shard(key)}.neff", neff)
    return shard(key)


def uncommitted_a(store: Store, key: str = "MODULE_5+abb26765", toolchain: Toolchain = TC_NEW) -> str:
    """The leftovers of a publish killed before its commit marker."""
    base = f"{get_layout('neuronxcc').namespace_for(toolchain).path}/{key}"
    manifest = Manifest("neuronxcc", key, {}, toolchain)
    store.put_file(f"{base}/neffcache.json", manifest.to_bytes())
    store.put_file(f"{base}/model.hlo_module.pb", b"HLO")
    store.put_file(f"{base}/model.neff", b"NEFF-partial")
    return base


def listing(store: Store) -> dict[str, tuple[int, str]]:
    """Every file with its size and sha256: the full state of a store."""
    return {f.path: (f.size, hashlib.sha256(store.read_bytes(f.path)).hexdigest()) for f in store.iter_files()}


def future(days: float) -> float:
    return time.time() + days * 86400
