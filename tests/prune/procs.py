"""Processes for the crash and concurrency tests: ``python -m tests.prune.procs prune|publish ...``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from neffcache.layouts import get_layout
from neffcache.operations.ingest import build_manifest
from neffcache.operations.publish import publish
from neffcache.outcomes import PublishStatus
from neffcache.prune import PrunePolicy, execute_plan, plan_prune
from neffcache.stores import open_store
from neffcache.stores.base import Store
from tests.prune.helpers import TC_NEW


def publish_key(store: Store, key: str) -> PublishStatus:
    layout = get_layout("neuronxcc")
    files: dict[str, bytes] = {"model.hlo_module.pb": b"HLO:" + key.encode(), "compile_flags.json": b"[]",
                               "model.neff": b"NEFF" + os.urandom(8192), "model.done": b""}
    manifest = build_manifest("neuronxcc", key, files, toolchain=TC_NEW, tags={"pid": str(os.getpid())})
    return publish(store, layout.namespace_for(TC_NEW), key, files, manifest).status


def run_prune(url: str, keep: str) -> None:
    store = open_store(url)
    plan = plan_prune([store], PrunePolicy(keep_compilers=(keep,), current=keep))
    print(f"planned {len(plan.items)}", flush=True)
    execute_plan(plan, [store], workers=1, force=True)
    print("done", flush=True)


def run_publish(url: str, keys: int, stop: Path, tag: str, rounds: Path | None = None) -> None:
    """Republish keys 0..keys-1 over and over (each is absent once prune took it) and one new key
    per round, until ``stop`` exists; print every key this process published. ``rounds``: a file
    that holds the number of finished rounds, so a test can wait for work instead of sleeping."""
    store = open_store(url)
    published: list[str] = []
    round_ = 0
    while not stop.exists():
        for i in range(keys):
            key = f"MODULE_{i}+abb26765"
            if publish_key(store, key) is PublishStatus.PUBLISHED:
                published.append(key)
        new = f"MODULE_{10_000_000 + round_}{tag}+abb26765"
        if publish_key(store, new) is PublishStatus.PUBLISHED:
            published.append(new)
        round_ += 1
        if rounds is not None:
            rounds.write_text(str(round_))
    print(json.dumps(published), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["prune", "publish"])
    parser.add_argument("store")
    parser.add_argument("--keep", default="")
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--stop", type=Path, default=Path("/nonexistent"))
    parser.add_argument("--rounds", type=Path, default=None)
    parser.add_argument("--tag", default="1")
    args = parser.parse_args()
    if args.mode == "prune":
        run_prune(args.store, args.keep)
    else:
        run_publish(args.store, args.keys, args.stop, args.tag, args.rounds)
    sys.exit(0)


if __name__ == "__main__":
    main()
