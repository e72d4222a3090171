"""Scanning hostile trees vs ``find``: many foreign files in one entry directory, a deep chain.

    .venv/bin/python -m bench.hostile_tree_bench --foreign 20000,40000,80000 --depth 20000

A co-tenant's files in one entry directory once made scan, verify, prune and push quadratic
(issue 41, N12: 40k files 37 s, 80k 117 s); a 20,000-deep chain of directories cost a scan
1.77 GB (N13). Each size prints the library's ``scan(store)`` against ``find -printf '%P %s %T@'``
(which stats every file, as a scan must) of the same tree, best of ``--rounds``: linear means
the ratio stays flat as the size doubles. The tests (tests/hostile/test_deep_and_wide.py) assert
the outcomes and bounds; the times are here, where a noisy machine cannot fail a build.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import best_of, load_average, print_ratio
from neffcache.scan.report import scan
from neffcache.stores.local import LocalStore
from neffcache.testing.store_contract import publish_a


def _find(root: Path) -> float:
    started = time.perf_counter()
    subprocess.run(["find", str(root), "-printf", "%P %s %T@\\n"], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def _scan(store: LocalStore) -> float:
    started = time.perf_counter()
    scan(store)
    return time.perf_counter() - started


def wide_entry(store: LocalStore, files: int) -> str:
    """Publish an entry whose directory also holds ``files`` foreign files; its path. (The
    hostile suite builds its 80k-file tree with this too.)"""
    path, _ = publish_a(store, key="MODULE_1+abb26765")
    fd = os.open(store.root / path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(files):
            os.close(os.open(f"notes_{i}.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    return path


def deep_chain(root: Path, depth: int) -> None:
    """A chain of ``depth`` directories ``d/d/...`` below ``root``, made relative to descriptors
    (a path that long could not be named whole)."""
    fd = os.open(root, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        nfd = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    os.close(fd)


def wide(base: Path, files: int, rounds: int) -> None:
    store = LocalStore(base / f"wide-{files}")
    wide_entry(store, files)
    baseline = best_of(rounds, lambda: _find(store.root))
    print_ratio(f"scan, {files} foreign files in one entry directory", best_of(rounds, lambda: _scan(store)),
                baseline, "find -printf")


def deep(base: Path, depth: int, rounds: int) -> None:
    store = LocalStore(base / f"deep-{depth}")
    publish_a(store, key="MODULE_1+abb26765")
    deep_chain(store.root, depth)
    baseline = best_of(rounds, lambda: _find(store.root))
    ours = best_of(rounds, lambda: _scan(store))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print_ratio(f"scan, a {depth}-deep chain of directories", ours, baseline, "find -printf",
                f"(peak RSS of this process {rss} MiB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--foreign", default="20000,40000,80000", help="Comma-separated foreign file counts.")
    parser.add_argument("--depth", type=int, default=20_000, help="Depth of the chain (0: skip it).")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"load average {load_average()}")
    tmp = tempfile.mkdtemp(prefix="neffcache-hostile-")
    try:
        for files in (int(n) for n in args.foreign.split(",") if n.strip()):
            wide(Path(tmp), files, args.rounds)
        if args.depth:
            deep(Path(tmp), args.depth, args.rounds)
    finally:  # rm -rf: shutil.rmtree recurses once per level and a 20k-deep chain overflows it
        subprocess.run(["rm", "-rf", tmp], check=True)


if __name__ == "__main__":
    main()
