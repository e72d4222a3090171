"""Run the benchmarks, each against its baseline, at one size of the work or at 1x, 10x and 100x.

    .venv/bin/python -m bench                      # every benchmark once, at 1x (a few minutes)
    .venv/bin/python -m bench --scale 1,10,100     # the scaling table of docs/performance.md
    .venv/bin/python -m bench --only scan,prune --scale 10 --tmp /mnt/big   # trees on a roomy tmpfs

Each benchmark is its own module (``python -m bench.<name> --help``) and prints its ratios, its
peak RSS and the load average; this runner only picks the sizes, so the scaling table's rows
come from the same commands as the single figures. The 1x sizes are small enough for a laptop;
100x of scan and prune is a million entries (4M inodes: several GB of metadata and tens of
minutes to build), of s3 3,000 entries through moto.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable

from bench.common import load_average


def _count(base: int) -> Callable[[int], list[str]]:
    return lambda scale: [str(base * scale)]


# name -> (module, the argument lines at scale N). One home for "what 1x means" per benchmark.
SUITE: dict[str, tuple[str, Callable[[int], list[str]]]] = {
    "publish": ("bench.publish_bench", lambda n: ["--entries", *_count(30)(n), "--rounds", "2",
                                                  "--max-neff", "2000000"]),
    "warm": ("bench.warm_bench", lambda n: ["--buckets", "4", "--graphs", *_count(2)(n), "--compile-seconds", "0.2",
                                            "--parallel", "4", "--rounds", "2"]),
    "memory": ("bench.memory_bench", lambda n: ["--size-mib", *_count(20)(n)]),
    "s3": ("bench.s3_bench", lambda n: ["--entries", *_count(30)(n), "--rounds", "1", "--latency-ms", "20",
                                        "--max-neff", "2000000"]),
    "scan": ("bench.scan_bench", lambda n: ["--layout", "both", "--entries", *_count(10_000)(n), "--rounds", "2"]),
    "prune": ("bench.prune_bench", lambda n: ["--entries", *_count(10_000)(n), "--rounds", "1", "--index-rows", "0"]),
    "coldstart": ("bench.coldstart_bench", lambda n: ["--graphs", *_count(8)(n), "--compile-seconds", "0.5",
                                                      "--entries", *_count(30)(n), "--wb-entries", *_count(20)(n),
                                                      "--rounds", "1", "--max-neff", "2000000"]),
    "hostile": ("bench.hostile_tree_bench", lambda n: ["--foreign", ",".join(str(k * 20_000 * n) for k in (1, 2, 4)),
                                                       "--depth", str(20_000 * n)]),
    "retention": ("bench.retention_bench", lambda n: ["--requests", *_count(100_000)(n)]),
    "index": ("bench.index_bench", lambda n: ["--entries", *_count(1_000)(n), "--lookups", *_count(2_000)(n),
                                              "--events", *_count(5_000)(n), "--rounds", "1"]),
    # Lookups of the server as deploy/k8s runs it (read token, hits and misses): the figure of record.
    "index-shipped": ("bench.index_shipped", lambda n: ["--entries", *_count(1_000)(n),
                                                        "--lookups", *_count(2_000)(n), "--rounds", "1"]),
}


# Benchmarks that build big trees, and the flag that puts them under --tmp (a million layout-A
# entries is 5M inodes: more than a default /dev/shm holds, and slow to make on a disk).
TREE_FLAGS: dict[str, str] = {"scan": "--tree", "prune": "--dir"}


def parse_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", default="1", help="Comma-separated multiples of the 1x work (default: 1).")
    parser.add_argument("--only", default=",".join(SUITE), help=f"Comma-separated benchmarks ({', '.join(SUITE)}).")
    parser.add_argument("--tmp", default=None,
                        help="Directory for the trees of scan (kept, reused) and prune (built per round); "
                             "default: each benchmark's own temporary directory.")
    parser.add_argument("--dry-run", action="store_true", help="Print the commands without running them.")
    args = parser.parse_args()
    names = parse_list(args.only)
    unknown = [name for name in names if name not in SUITE]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}; choose from {', '.join(SUITE)}")
    try:
        scales = [int(part) for part in parse_list(args.scale)]
    except ValueError:
        parser.error(f"--scale takes whole numbers such as 1,10,100, not {args.scale!r}")
    if not scales or min(scales) < 1:
        parser.error("--scale takes whole numbers of at least 1")
    failed: list[str] = []
    for name in names:
        module, argv_at = SUITE[name]
        for scale in scales:
            command = [sys.executable, "-m", module, *argv_at(scale)]
            if args.tmp and name in TREE_FLAGS:
                command += [TREE_FLAGS[name], f"{args.tmp}/{name}"]
            print(f"\n=== {name} at {scale}x: {' '.join(command[1:])}  (load {load_average()})", flush=True)
            if args.dry_run:
                continue
            start = time.perf_counter()
            code = subprocess.run(command, check=False).returncode
            print(f"=== {name} at {scale}x: exit {code} after {time.perf_counter() - start:.1f}s", flush=True)
            if code != 0:
                failed.append(f"{name} {scale}x")
    if failed:
        sys.exit(f"benchmarks that failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
