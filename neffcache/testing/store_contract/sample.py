"""A sample entry to publish: the one helper tests use to put a runtime entry in a store."""

from __future__ import annotations

import os

from neffcache.layouts import get_layout
from neffcache.operations.ingest import build_manifest
from neffcache.operations.publish import publish
from neffcache.stores.base import Store
from neffcache.toolchain import Toolchain

TC = Toolchain("2.27.5334.0+f702b353", "trn2", 2)
LAYOUT_A = get_layout("neuronxcc")


def publish_a(store: Store, key: str = "MODULE_123+abb26765", neff: bytes | None = None,
              producer: str = "test") -> tuple[str, bytes]:
    """Publish a complete neuronxcc entry for :data:`TC` under ``key``; its path and NEFF bytes."""
    ns = LAYOUT_A.namespace_for(TC)
    neff = neff if neff is not None else b"NEFF" + os.urandom(4096)
    files = {"model.hlo_module.pb": b"HLO:" + key.encode(), "compile_flags.json": b'["--model-type=transformer"]',
             "model.neff": neff, "model.done": b""}
    manifest = build_manifest("neuronxcc", key, files, toolchain=TC, flags=["--model-type=transformer"],
                              tags={"model": "llama"}, compile_seconds=12.5)
    manifest = type(manifest)(**{**manifest.__dict__, "producer": producer})
    result = publish(store, ns, key, files, manifest)
    assert result.ok
    return f"{ns.path}/{key}", neff
