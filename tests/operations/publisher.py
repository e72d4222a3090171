"""A publishing process for crash and concurrency tests: ``python -m tests.operations.publisher ...``."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

from neffcache.coordination.lease import acquire
from neffcache.layouts import get_layout
from neffcache.operations.cache import NeffCache
from neffcache.operations.ingest import build_manifest
from neffcache.operations.publish import publish
from neffcache.stores import open_store
from neffcache.toolchain import Toolchain

TC = Toolchain("2.27.5334.0+f702b353", "trn2", 2)


def neff_bytes(seed: str, size: int) -> bytes:
    block = hashlib.sha256(seed.encode()).digest() * 2048  # 64 KiB
    return (block * (size // len(block) + 1))[:size]


def publish_a(store_url: str, key: str, neff: bytes) -> str:
    store = open_store(store_url)
    layout = get_layout("neuronxcc")
    files = {"model.hlo_module.pb": b"HLO " + key.encode(), "compile_flags.json": b"[]",
             "model.neff": neff, "model.done": b""}
    manifest = build_manifest("neuronxcc", key, files, toolchain=TC, tags={"pid": str(os.getpid())})
    return publish(store, layout.namespace_for(TC), key, files, manifest).status.value


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["loop", "one", "hold-lease"])
    parser.add_argument("store")
    parser.add_argument("--prefix", default="k")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--size", type=int, default=4 << 20)
    parser.add_argument("--start-file", default="")
    parser.add_argument("--seed", default="")
    args = parser.parse_args()
    if args.mode == "hold-lease":
        lease = acquire(open_store(args.store), "compile:held", ttl=1.0)
        lease.keep_alive(0.1)
        print("held", flush=True)
        time.sleep(3600)
        return
    if args.mode == "one":
        while args.start_file and not Path(args.start_file).exists():
            time.sleep(0.001)
        print(publish_a(args.store, "MODULE_77+d41d8cd9", neff_bytes(args.seed, args.size)), flush=True)
        return
    print("ready", flush=True)
    cache = NeffCache(args.store)
    for i in range(args.count):
        key = f"{args.prefix}{i}"
        neff = neff_bytes(key, args.size)
        if i % 2:
            cache.put(key.encode(), ["-O2"], TC, neff)
        else:
            publish_a(args.store, f"MODULE_{int(hashlib.sha256(key.encode()).hexdigest()[:12], 16)}+d41d8cd9", neff)
    sys.exit(0)


if __name__ == "__main__":
    main()
