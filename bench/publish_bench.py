"""Publish/ingest of a realistic cache vs ``cp -r`` + ``sha256sum`` of the same files.

    .venv/bin/python -m bench.publish_bench --entries 300

neffcache reads a runtime-written cache (no manifests), computes every file's sha256, writes
the manifest and publishes each entry atomically into a fresh store. The baseline copies the
same tree with ``cp -r`` and hashes every copied file with ``sha256sum``: the least work that
gives the same guarantee (bytes copied, digests known). Both run on a warm page cache. A third
neffcache round signs every manifest (Ed25519, as ``push`` with ``NEFFCACHE_SIGNING_KEY``) and
is compared with the unsigned one: the goal is within 5%.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import MAX_NEFF, Timing, load_average, make_runtime_cache, neffcache_measured, print_ratio, sh, timed
from neffcache.operations import publisher
from neffcache.operations.ingest import transfer
from neffcache.operations.publisher import Publisher
from neffcache.scan.report import scan
from neffcache.signing import SigningKey, generate
from neffcache.stores.local import LocalStore


def run(entries: int, workers: int, rounds: int, base: Path, max_neff: int = MAX_NEFF) -> dict[str, float]:
    src = base / "src"
    total = make_runtime_cache(src, entries, max_neff=max_neff)
    print(f"cache: {entries} entries, {total / 1e9:.2f} GB (NEFFs 100 kB-{max_neff / 1e6:g} MB, log-uniform)")
    sh(f"cat $(find {src} -type f) > /dev/null")  # warm the page cache for both sides
    generate(base / "bench-key")
    signing_key = SigningKey.load(base / "bench-key")
    best: dict[str, float] = {}
    for r in range(rounds):
        times: list[Timing] = []
        shutil.rmtree(base / "cp", ignore_errors=True)
        with timed("cp+sha256sum", times):
            sh(f"cp -r {src} {base / 'cp'} && find {base / 'cp'} -type f -print0 | xargs -0 sha256sum > /dev/null")
        shutil.rmtree(base / "cp-par", ignore_errors=True)
        with timed(f"cp+sha256sum -P{workers}", times):
            sh(f"cp -r {src} {base / 'cp-par'} && find {base / 'cp-par'} -type f -print0 "
               f"| xargs -0 -P{workers} -n 16 sha256sum > /dev/null")
        for label, n, key in (("neffcache", 1, None), (f"neffcache -P{workers}", workers, None),
                              (f"neffcache -P{workers} signed", workers, signing_key)):
            dst_dir = base / f"dst-{n}-{'signed' if key else 'plain'}"
            shutil.rmtree(dst_dir, ignore_errors=True)
            source, dest = LocalStore(src, read_only=True), LocalStore(dst_dir)
            publisher.use(Publisher(how="push", signing_key=key))  # as `push` with NEFFCACHE_SIGNING_KEY
            with timed(label, times):
                report = scan(source)
                with ThreadPoolExecutor(n) as pool:
                    results = list(pool.map(transfer, [source] * entries, report.entries, [dest] * entries))
            publisher.use(Publisher())
            assert sum(r.status.value == "published" for r in results) == entries
            assert all((r.manifest is not None and r.manifest.signature is not None) == (key is not None)
                       for r in results)
        for t in times:
            best[t.label] = min(best.get(t.label, t.seconds), t.seconds)
        print(f"round {r + 1}: " + ", ".join(f"{t.label} {t.seconds:.2f}s" for t in times))
    best["rss_mb"], best["cli_seconds"] = cli_peak_rss(src, base / "dst-cli", workers)
    return best


def cli_peak_rss(src: Path, dst: Path, workers: int) -> tuple[float, float]:
    """Peak RSS (MB) and time of the same publish as a user runs it: ``neffcache push SRC DST``.

    The timed rounds above run in this process, whose peak also holds the tree it built; the
    CLI in a process of its own says what a publish of this many entries costs in memory.
    """
    hwm = dst.parent / "push.hwm"
    start = time.perf_counter()
    proc = subprocess.run(neffcache_measured(hwm, ["push", str(src), str(dst), "--parallel", str(workers),
                                                   "--json"]), capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"neffcache push failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return int(hwm.read_text()) / 1024, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=300)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-neff", type=int, default=MAX_NEFF, help="Largest NEFF in bytes (log-uniform).")
    parser.add_argument("--dir", type=Path, default=None, help="Scratch directory (default: a temp dir).")
    args = parser.parse_args()
    print(f"load average at start: {load_average()}")
    with tempfile.TemporaryDirectory(prefix="neffcache-bench-", dir=args.dir) as tmp:
        best = run(args.entries, args.workers, args.rounds, Path(tmp), args.max_neff)
    print("\nbest of rounds:")
    print_ratio("publish, sequential", best["neffcache"], best["cp+sha256sum"], "cp -r + sha256sum")
    print_ratio(f"publish, {args.workers} workers", best[f"neffcache -P{args.workers}"],
                best[f"cp+sha256sum -P{args.workers}"], f"cp -r + xargs -P{args.workers} sha256sum")
    print_ratio(f"signed publish, {args.workers} workers", best[f"neffcache -P{args.workers} signed"],
                best[f"neffcache -P{args.workers}"], "the same publish unsigned")
    print(f"peak RSS of `neffcache push SRC DST --parallel {args.workers}` ({best['cli_seconds']:.2f}s, "
          f"process start included): {best['rss_mb']:.0f} MB")
    print(f"load average at end: {load_average()}")


if __name__ == "__main__":
    main()
