"""Scanning 100k entries vs a bare ``find`` of the same tree.

    .venv/bin/python -m bench.scan_bench --entries 100000

The tree is a layout-A cache (4 files per entry, as libneuronxla writes them). ``find -type f``
only lists names; ``find -printf '%s %T@'`` also stats every file, as a scan must (sizes for the
report, modification times for age). neffcache lists, stats and classifies every entry (state,
size, namespace). All run on a warm dentry cache.

A scan pauses the cyclic garbage collector while it builds its objects; the collection it
defers runs at the next allocation after it returns. The "with deferred GC" figure adds a full
``gc.collect()`` right after each scan, so the saving is not just moved out of the timing.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import VERSION, print_ratio
from neffcache.operations.scan import scan
from neffcache.stores.local import LocalStore


def build(root: Path, entries: int, manifests: bool = False) -> None:
    ns = root / "trn2-lnc2" / f"neuronxcc-{VERSION}"
    ns.mkdir(parents=True)
    files = {"model.hlo_module.pb": b"h", "compile_flags.json": b"[]", "model.neff": b"n", "model.done": b""}
    for i in range(entries):
        entry = ns / f"MODULE_{i}+d41d8cd9"
        entry.mkdir()
        extra = {}
        if manifests:  # as neffcache publishes them: one neffcache.json per entry
            from neffcache.operations.ingest import build_manifest
            from neffcache.toolchain import Toolchain

            extra = {"neffcache.json": build_manifest("neuronxcc", f"MODULE_{i}+d41d8cd9", files,
                                                      toolchain=Toolchain(VERSION, "trn2", 2), flags=[],
                                                      tags={"model": "bench"}).to_bytes()}
        for name, data in (*files.items(), *extra.items()):
            fd = os.open(entry / name, os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, data)
            os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--manifests", action="store_true",
                        help="Give every entry a manifest (as neffcache publishes them); the scan then reads "
                             "each one to compare its file sizes, as a plain `neffcache scan` does")
    parser.add_argument("--list-workers", type=int, default=None,
                        help="LocalStore listing threads (default: the store's own, 1 on a local disk)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="neffcache-scan-") as tmp:
        root = Path(tmp) / "cache"
        started = time.perf_counter()
        build(root, args.entries, args.manifests)
        print(f"built {args.entries} entries ({args.entries * 4} files) in {time.perf_counter() - started:.1f}s")
        store = LocalStore(root, read_only=True, list_workers=args.list_workers)
        best_find = best_stat = best_scan = best_gc = best_read = float("inf")
        for r in range(args.rounds):
            t = time.perf_counter()
            subprocess.run(f"find {root} -type f | wc -l > /dev/null", shell=True, check=True)
            best_find = min(best_find, time.perf_counter() - t)
            t = time.perf_counter()
            subprocess.run(f"find {root} -type f -printf '%P %s %T@\\n' | wc -l > /dev/null", shell=True, check=True)
            best_stat = min(best_stat, time.perf_counter() - t)
            t = time.perf_counter()
            report = scan(store)
            scanned = time.perf_counter()
            gc.collect()
            best_scan = min(best_scan, scanned - t)
            best_gc = min(best_gc, time.perf_counter() - t)
            assert len(report.entries) == args.entries
            print(f"round {r + 1}: find {best_find:.2f}s, find -printf {best_stat:.2f}s, "
                  f"scan {best_scan:.2f}s, with deferred GC {best_gc:.2f}s (best so far)")
            del report  # freed here, not inside the next round's timing
            if args.manifests:
                t = time.perf_counter()
                report = scan(store, read_manifests=True)
                best_read = min(best_read, time.perf_counter() - t)
                assert len(report.entries) == args.entries and not report.warnings, report.warnings[:3]
                print(f"round {r + 1}: scan reading every manifest {best_read:.2f}s (best so far)")
                del report
        print(f"list_workers={store.list_workers}")
        print_ratio(f"scan of {args.entries} entries", best_scan, best_find, "find -type f")
        print_ratio(f"scan of {args.entries} entries", best_scan, best_stat,
                    "find -printf size+mtime (the same information)")
        print_ratio(f"scan of {args.entries} entries with deferred GC", best_gc, best_stat,
                    "find -printf size+mtime")
        if args.manifests:
            print_ratio(f"scan of {args.entries} entries reading every manifest", best_read, best_stat,
                        "find -printf size+mtime")
            print_ratio(f"scan of {args.entries} entries reading every manifest", best_read, best_scan,
                        "the listing-only scan")


if __name__ == "__main__":
    main()
