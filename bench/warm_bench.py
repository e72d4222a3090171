"""Warm-up pipeline overhead vs ``xargs -P N`` running the same compiles directly.

    .venv/bin/python -m bench.warm_bench --buckets 4 --graphs 8 --compile-seconds 1.0 --parallel 4

The same graphs (``--buckets`` x ``--graphs`` simulated HLOs of one model), the same simulated
``neuronx-cc`` (``--compile-seconds`` per graph), the same parallelism ``N``:

- baseline: the HLO files already on disk, ``find | xargs -P N neuronx-cc compile ...``: the
  compiles and nothing else (no cache, no manifest, no publish);
- ``warm --two-phase --parallel N``: the workloads extract their graphs, neffcache's pool
  compiles them under leases and publishes every entry with its manifest;
- ``warm --parallel N`` (one-phase): N bucket workloads at once, the runtime in each compiles
  its graphs one after the other, neffcache manifests and publishes them afterwards.

Each warm-up starts from an empty store. The ratio is warm time / baseline time (best of
``--rounds``): 1.15 would mean the pipeline adds 15% to the bare compiles.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import Timing, load_average, neffcache_measured, print_ratio, timed
from neffcache.testing.hlo import make_hlo
from neffcache.testing.shim import install_compiler_shim, simulated_env

INSTANCE = "trn2.48xlarge"
MODEL = "bench-model"


def _buckets(n: int) -> list[int]:
    return [128 * 2**i for i in range(n)]


def _env(base: Path, compile_seconds: float) -> dict[str, str]:
    bin_dir = base / "bin"
    install_compiler_shim(bin_dir, compile_seconds=compile_seconds, invocation_log=base / "invocations.jsonl")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_", "TORCH_NEURONX_", "NEFFSIM_",
                                                                        "NEFFCACHE_"))}
    (base / "tmp").mkdir(exist_ok=True)
    return simulated_env(bin_dir, clean, TMPDIR=str(base / "tmp"), NEFFCACHE_SPOOL_DIR=str(base / "spool"),
                         XDG_CACHE_HOME=str(base / "xdg"))


def _compiles(base: Path) -> int:
    log = base / "invocations.jsonl"
    count = len(log.read_text().splitlines()) if log.exists() else 0
    log.unlink(missing_ok=True)
    return count


def baseline(base: Path, env: dict[str, str], buckets: list[int], graphs: int, parallel: int) -> None:
    hlo_dir = base / "hlo"
    shutil.rmtree(hlo_dir, ignore_errors=True)
    hlo_dir.mkdir()
    for bucket in buckets:
        for i in range(graphs):
            (hlo_dir / f"b{bucket}-g{i}.hlo_module.pb").write_bytes(make_hlo(MODEL, bucket, i))
    script = (f"find {hlo_dir} -name '*.hlo_module.pb' -print0 | xargs -0 -P {parallel} -I{{}} "
              "neuronx-cc compile --framework=XLA --target=trn2 --lnc=2 {} --output {}.neff > /dev/null")
    subprocess.run(["bash", "-c", script], env=env, check=True)


def warm(base: Path, env: dict[str, str], buckets: list[int], graphs: int, parallel: int, two_phase: bool) -> float:
    """Run one warm-up into an empty store; returns neffcache's own peak RSS in MB."""
    store = base / "store"
    shutil.rmtree(store, ignore_errors=True)
    hwm = base / "warm.hwm"
    argv = neffcache_measured(hwm, ["warm", "--instance", INSTANCE, "--store", str(store),
            "--bucket", "SEQ=" + ",".join(map(str, buckets)), "--parallel", str(parallel), "--quiet", "--json",
            *(["--two-phase"] if two_phase else []), "--log-dir", str(base / "logs"), "--",
            sys.executable, "-m", "neffcache.testing.workload", "--model", MODEL, "--bucket", "{SEQ}",
            "--graphs", str(graphs)])
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"warm failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    totals = json.loads(proc.stdout)["totals"]
    assert totals["compiled"] == len(buckets) * graphs, totals
    return int(hwm.read_text()) / 1024


def run(base: Path, buckets: int, graphs: int, parallel: int, compile_seconds: float, rounds: int
        ) -> dict[str, float]:
    env = _env(base, compile_seconds)
    sizes = _buckets(buckets)
    expected = buckets * graphs
    best: dict[str, float] = {}
    for r in range(rounds):
        times: list[Timing] = []
        with timed("xargs", times):
            baseline(base, env, sizes, graphs, parallel)
        assert _compiles(base) == expected
        with timed("two-phase", times):
            rss = warm(base, env, sizes, graphs, parallel, two_phase=True)
        best["rss two-phase"] = max(best.get("rss two-phase", 0.0), rss)
        assert _compiles(base) == expected
        with timed("one-phase", times):
            rss = warm(base, env, sizes, graphs, parallel, two_phase=False)
        best["rss one-phase"] = max(best.get("rss one-phase", 0.0), rss)
        assert _compiles(base) == expected
        for t in times:
            best[t.label] = min(best.get(t.label, t.seconds), t.seconds)
        print(f"round {r + 1}: " + ", ".join(f"{t.label} {t.seconds:.2f}s" for t in times))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--buckets", type=int, default=4)
    parser.add_argument("--graphs", type=int, default=8, help="graphs per bucket")
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--compile-seconds", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=None, help="Scratch directory (default: a temp dir).")
    args = parser.parse_args()
    print(f"{args.buckets} buckets x {args.graphs} graphs = {args.buckets * args.graphs} compiles of "
          f"{args.compile_seconds:g}s (simulated neuronx-cc), {args.parallel} at a time, cpus={os.cpu_count()}")
    print(f"load average at start: {load_average()}")
    with tempfile.TemporaryDirectory(prefix="neffcache-warm-bench-", dir=args.dir) as tmp:
        best = run(Path(tmp), args.buckets, args.graphs, args.parallel, args.compile_seconds, args.rounds)
    print("\nbest of rounds:")
    xargs = f"xargs -P{args.parallel} neuronx-cc"
    print_ratio("warm --two-phase", best["two-phase"], best["xargs"], xargs,
                f"(overhead {best['two-phase'] - best['xargs']:+.2f}s)")
    print_ratio("warm (one-phase)", best["one-phase"], best["xargs"], xargs,
                f"(overhead {best['one-phase'] - best['xargs']:+.2f}s)")
    print(f"peak RSS of neffcache warm (its own process, not the workloads'): two-phase "
          f"{best['rss two-phase']:.0f} MB, one-phase {best['rss one-phase']:.0f} MB")
    print(f"load average at end: {load_average()}")


if __name__ == "__main__":
    main()
